"""Part "growth": what a step, a claim, the dashboard and the API cost as the runs grow.

``python -m bench.growth --runs N --steps M`` (environment: ``DATABASE_URL`` of a
PostgreSQL database) seeds it as the dashboard part does (``bench.dashboard.seed``: ``N``
runs, ``M`` steps, one run of 500 steps, ~2 % waiting on an approval; reused while its
size and the migrations match), then measures on that database, in this process:

- **step**: ``ms/step`` of ``--runs-timed`` runs of ``bench.noop`` × 200 steps, each
  started with ``durable.start`` and executed in process (``engine.execute``), as the
  checkpoint part measures it on an empty database;
- **claim**: ms of ``engine.claim`` of a pending run (one statement on PostgreSQL), over
  ``--claims`` fresh runs;
- **dashboard**: every page of ``bench.dashboard.pages`` (p95 of ``--repeats`` requests
  through Django's test client, as a superuser), reported with the worst p95;
- **API**: ``GET /api/v1/runs?limit=50`` and ``GET /api/v1/runs/{id}`` of the 500-step run
  with an operator's token, one client (p95 of ``--repeats``);
- **sizes**: each table's ``pg_total_relation_size`` with its indexes apart, and rows.

``python -m bench --only growth`` runs it at 10k, 100k and 1M runs (20 steps a run;
``--quick``: 1k and 10k), each size in a database of its own (``<prefix>growth_<runs>``,
kept and reused), and reports one row per size: the growth of each figure from the
smallest size is what the table is for.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from .common import (
    Config,
    django_env,
    emit,
    latency_summary,
    log,
    pg_available,
    pg_db_exists,
    recreate_pg_db,
    run_child,
    setup_django_on_postgresql,
)

#: runs per size (steps: 20 a run); ``--quick``: the small ones
SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000)

#: the tables whose size the capacity page works from
TABLES = (
    "durable_run",
    "durable_step",
    "durable_traceevent",
    "durable_wait",
    "durable_operation",
    "approvals_approvalrequest",
)


def time_steps(runs: int, steps: int = 200) -> dict[str, float]:
    """ms per step of ``runs`` runs of ``steps`` no-op steps (start and completion in)."""
    import durable
    from durable.worker.engine import execute

    execute(durable.start("bench.noop", {"steps": steps}).id, worker_id="bench")  # warm
    per_run = []
    for _ in range(runs):
        t = time.perf_counter()
        run = durable.start("bench.noop", {"steps": steps})
        status = execute(run.id, worker_id="bench")
        per_run.append((time.perf_counter() - t) * 1000 / steps)
        if status != "succeeded":
            raise RuntimeError(f"run {run.id} ended {status}")
    return latency_summary(per_run)


def time_claims(claims: int) -> dict[str, float]:
    """ms of a pending run's claim, over ``claims`` runs started for it."""
    import durable
    from durable.worker.engine import claim

    ids = [durable.start("bench.noop", {"steps": 1}).id for _ in range(claims + 2)]
    times = []
    for n, run_id in enumerate(ids):
        t = time.perf_counter()
        claimed = claim(run_id, token=f"growth-{n}", worker_id="bench")
        if n >= 2:  # the first two warm the statement
            times.append((time.perf_counter() - t) * 1000)
        if claimed is None:
            raise RuntimeError(f"run {run_id} could not be claimed")
    return latency_summary(times)


def time_api(big_run: str, repeats: int) -> list[dict[str, Any]]:
    """p50/p95 of the API's runs list and the 500-step run's detail, one client."""
    from django.test import Client

    from .web_load import operator_token

    token, _ = operator_token()
    client = Client(headers={"Authorization": f"Bearer {token}"})
    out = []
    for label, path in (
        ("API runs list (50)", "/api/v1/runs?limit=50"),
        ("API run detail (500 steps)", f"/api/v1/runs/{big_run}"),
    ):
        for _ in range(2):
            response = client.get(path)
        if response.status_code != 200:
            out.append({"endpoint": label, "path": path, "note": f"HTTP {response.status_code}"})
            continue
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            client.get(path)
            times.append((time.perf_counter() - t) * 1000)
        out.append({"endpoint": label, "path": path, "ms": latency_summary(times)})
    return out


def table_sizes() -> list[dict[str, Any]]:
    """Per table: rows (the planner's estimate after ANALYZE), heap+TOAST and index bytes."""
    from django.db import connection

    out = []
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(
                "SELECT c.reltuples::bigint, pg_table_size(c.oid), pg_indexes_size(c.oid) "
                "FROM pg_class c WHERE c.oid = to_regclass(%s)",
                [table],
            )
            row = cursor.fetchone()
            if row is not None:
                out.append(
                    {"table": table, "rows": max(int(row[0]), 0), "bytes": row[1], "index": row[2]}
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.growth")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--runs-timed", type=int, default=10)
    parser.add_argument("--claims", type=int, default=50)
    args = parser.parse_args()
    setup_django_on_postgresql("the growth benchmark")
    import bench.workflows  # noqa: F401 - registers bench.noop

    from .dashboard import seed_or_reuse, time_pages

    t = time.perf_counter()
    info, reused = seed_or_reuse(args.runs, args.steps)
    seed_s = time.perf_counter() - t
    pages = time_pages(info["big_run"], args.repeats)
    timed = [p for p in pages if p.get("available")]
    worst = max(timed, key=lambda p: p["ms"]["p95"], default=None)
    emit(
        {
            "runs": args.runs,
            "steps": args.steps,
            "seed_reused": reused,
            "seed_s": round(seed_s, 1),
            "step_ms": time_steps(args.runs_timed),
            "claim_ms": time_claims(args.claims),
            "pages": pages,
            "worst_page": worst and {"page": worst["page"], "ms": worst["ms"]},
            "api": time_api(info["big_run"], args.repeats),
            "tables": table_sizes(),
        }
    )


def part_growth(cfg: Config, log_dir: Any) -> dict[str, Any]:
    """The orchestrator's part (``python -m bench --only growth``): one child per size,
    each on its own database ``<prefix>growth_<runs>`` (kept: a seed is reused)."""
    if problem := pg_available(cfg):
        return {"skipped": problem}
    rows = []
    for runs in QUICK_SIZES if cfg.quick else SIZES:
        name = f"growth_{runs}"
        if not pg_db_exists(cfg, name):
            recreate_pg_db(cfg, name)
        url = cfg.pg_db_url(name).replace("postgresql://", "postgres://", 1)
        args = ["--runs", str(runs), "--steps", str(runs * 20)]
        if cfg.quick:
            args += ["--repeats", "5", "--runs-timed", "2", "--claims", "10"]
        log(f"growth: {runs} runs, {runs * 20} steps (seeding if needed)")
        env = django_env(cfg, database_url=url)
        rows.append(run_child("bench.growth", args, env, timeout=7200, verbose=cfg.verbose)[-1])
    return {"sizes": rows}


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f}" if n >= 1e6 else f"{n / 1e6:.1f}"


def section(g: dict[str, Any]) -> list[str]:
    """The part's section of the results file: one row per size, and the tables' sizes."""
    title = "## Growth: a step, a claim, the dashboard and the API as runs grow"
    if "skipped" in g:
        return [title, "", f"Skipped: {g['skipped']}"]
    sizes = g["sizes"]
    out = [
        title,
        "",
        "Each size its own seeded database (bench/growth.py); ms, p50 / p95; the worst "
        "dashboard page is the one with the highest p95 at that size.",
        "",
        "| Runs | Steps | Step ms | Claim ms | Worst page (p95 ms) | API list p95 | "
        "API detail p95 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sizes:
        api = {a["endpoint"]: a for a in r.get("api", [])}
        apis = [
            f"{a['ms']['p95']:.1f}" if "ms" in a else a.get("note", "–")
            for a in (
                api.get("API runs list (50)", {}),
                api.get("API run detail (500 steps)", {}),
            )
        ]
        worst = r.get("worst_page") or {}
        page = f"{worst['page']} ({worst['ms']['p95']:.1f})" if worst else "–"
        out.append(
            f"| {r['runs']:,} | {r['steps']:,} | {r['step_ms']['p50']:.3f} / "
            f"{r['step_ms']['p95']:.3f} | {r['claim_ms']['p50']:.3f} / "
            f"{r['claim_ms']['p95']:.3f} | {page} | {apis[0]} | {apis[1]} |"
        )
    out += [
        "",
        "Table sizes (MB: heap and TOAST / indexes; rows are the planner's estimate):",
        "",
        "| Runs | " + " | ".join(t["table"] for t in sizes[-1].get("tables", [])) + " |",
        "|---|" + "---|" * len(sizes[-1].get("tables", [])),
    ]
    for r in sizes:
        cells = [f"{_mb(t['bytes'])} / {_mb(t['index'])}" for t in r.get("tables", [])]
        out.append(f"| {r['runs']:,} | " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    main()
