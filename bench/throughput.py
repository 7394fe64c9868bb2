"""Part 4, throughput and scaling: Durable's worker processes and DBOS's queue, side by side.

Both run batches of runs of 20 no-op steps, created in one transaction, with 1, 2 and 4
worker processes on the same PostgreSQL server in the same invocation, so that scaling is
measured, not assumed: Durable with Celery workers (``--pool=solo``, Redis, one run at a
time per process; ``bench.procs throughput``), DBOS Transact with executors that dequeue
one workflow at a time from one ``Queue`` (``bench.dbos_queue``). The sizes are chosen so
that the part takes about 5 minutes on a loaded 2-core machine (see ``PLANS``).
"""

from __future__ import annotations

import math
import os
import traceback
from pathlib import Path
from typing import Any

from . import checkpoint as cp
from .common import (
    REPO,
    Config,
    log,
    pg_redis_problem,
    proc_env,
    recreate_pg_db,
    run_child,
    run_procs,
)
from .numbers import fmt

#: (workers, runs) per system. Durable's 1-worker batch is 500 runs because the worker's
#: RSS after it (>= 10k steps) is the memory figure; 200 runs (4,000 steps) otherwise: at
#: 70-270 steps/s that is 15-60 s a batch, enough to average over the start and the tail
#: and to keep the whole bench near 25 minutes (the first full run, with 300, took 7.4 min
#: for this part at load 8)
PLANS = {
    "durable": [(1, 500), (2, 200), (4, 200)],
    "dbos": [(1, 200), (2, 200), (4, 200)],
}
QUICK_PLANS = {
    "durable": [(1, 16), (2, 16), (4, 16)],
    "dbos": [(1, 16), (2, 16), (4, 16)],
}
#: DBOS queue polling interval, seconds (its default, 1 s, would be what is measured)
DBOS_POLL_SECONDS = 0.01


def plan_text(plan: list[tuple[int, int]]) -> str:
    """``[(1, 500), (2, 300)]`` -> ``"1:500,2:300"``."""
    return ",".join(f"{w}:{r}" for w, r in plan)


def part_throughput(cfg: Config, log_dir: Path) -> dict[str, Any]:
    """``{"steps_per_run": 20, "workers_1": {...}, "workers_2": ..., "workers_4": ...,
    "dbos": {"workers_1": ...} | {"skipped": why} | {"error": why}}``; each batch:
    ``runs``, ``steps``, ``seconds`` (commit -> last completion), ``steps_per_second``."""
    if problem := pg_redis_problem(cfg):
        return {"skipped": problem}
    plans = QUICK_PLANS if cfg.quick else PLANS
    log(f"throughput: Durable, workers:runs {plan_text(plans['durable'])}")
    env = proc_env(
        cfg, db="postgresql", broker="redis", BENCH_THROUGHPUT_PLAN=plan_text(plans["durable"])
    )
    out = run_procs(cfg, "throughput", env, log_dir)
    out["dbos"] = _dbos(cfg, log_dir, plans["dbos"])
    return out


def _dbos(cfg: Config, log_dir: Path, plan: list[tuple[int, int]]) -> dict[str, Any]:
    missing = cp.missing_packages("dbos", "postgresql")
    if missing:
        return {"skipped": missing}
    log(f"throughput: DBOS queue, workers:runs {plan_text(plan)}")
    url = recreate_pg_db(cfg, "tp_dbos")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "DBOS")) and k not in ("DATABASE_URL",)
    }
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"
    args = ["harness", "--url", url, "--log-dir", str(log_dir / "workers-dbos")]
    args += ["--runs", plan_text(plan), "--poll", str(DBOS_POLL_SECONDS)]
    try:
        return run_child("bench.dbos_queue", args, env, timeout=3600, verbose=cfg.verbose)[-1]
    except Exception as exc:  # noqa: BLE001 - Durable's rows are kept; the error is reported
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def scaling(t: dict[str, Any]) -> dict[str, float]:
    """``{"2w/1w": x, "4w/1w": y}``: steps/s with n workers over steps/s with one."""
    one = (t.get("workers_1") or {}).get("steps_per_second")
    out: dict[str, float] = {}
    if not one:
        return out
    for n in (2, 4):
        r = t.get(f"workers_{n}")
        if r and r.get("steps_per_second"):
            out[f"{n}w/1w"] = r["steps_per_second"] / one
    return out


def throughput_section(t: dict[str, Any]) -> list[str]:
    """Section 3 of the report: steps/s per worker count, Durable and DBOS side by side."""
    if "skipped" in t:
        return ["## 3. Throughput", "", f"Skipped: {t['skipped']}"]
    dbos = t.get("dbos") or {}
    counts = sorted(
        {int(k.split("_")[1]) for k in list(t) + list(dbos) if k.startswith("workers_")}
    )
    out = [
        (
            "## 3. Throughput and scaling (runs of "
            f"{t.get('steps_per_run', 20)} no-op steps created in one transaction)"
        ),
        "",
        (
            "Durable: Celery workers `--pool=solo` (one run at a time each), PostgreSQL + "
            "Redis. DBOS Transact: executors in separate processes dequeuing from one "
            "`Queue` (`worker_concurrency=1`, polled every "
            f"{fmt((dbos.get('settings') or {}).get('polling_interval_sec', math.nan))} s), "
            "one system database on the same server. steps/s = steps / (last completion − "
            "commit of the batch); × 1 = steps/s over the same system's 1-process figure."
        ),
        "",
        (
            "| processes | Durable steps/s | × 1 | runs | seconds | DBOS steps/s | × 1 | runs "
            "| seconds | Durable ÷ DBOS |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    one = {"d": scaling(t), "b": scaling(dbos)}

    def cells(r: dict[str, Any] | None, factor: float | None) -> str:
        if not r:
            return "– | – | – | –"
        x = "1.00×" if factor is None else f"{factor:.2f}×"
        return f"{fmt(r['steps_per_second'])} | {x} | {r['runs']} | {fmt(r['seconds'])}"

    for n in counts:
        d, b = t.get(f"workers_{n}"), dbos.get(f"workers_{n}")
        ratio = fmt(d["steps_per_second"] / b["steps_per_second"], 2) + "×" if d and b else "–"
        fd = None if n == 1 else one["d"].get(f"{n}w/1w", math.nan)
        fb = None if n == 1 else one["b"].get(f"{n}w/1w", math.nan)
        out.append(f"| {n} | {cells(d, fd)} | {cells(b, fb)} | {ratio} |")
    if "workers_1" not in dbos:
        why = dbos.get("skipped") or dbos.get("error") or "not run"
        out += ["", f"DBOS not measured: {why.splitlines()[0] if why else ''}"]
    failed = sum(r.get("failed", 0) for r in [*_batches(t), *_batches(dbos)])
    if failed:
        out += ["", f"**{failed} runs did not succeed** (see the worker logs)."]
    return out


def _batches(t: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for k, v in t.items() if k.startswith("workers_") and isinstance(v, dict)]
