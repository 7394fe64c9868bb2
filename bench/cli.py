"""``python -m bench``: run the parts, write ``bench/results/<date>.md`` and ``.json``."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

from . import checkpoint as cp
from .common import (
    Config,
    Server,
    django_env,
    log,
    machine_info,
    pg_admin,
    pg_available,
    pg_redis_problem,
    proc_env,
    recreate_pg_db,
    redis_available,
    relation_bytes,  # noqa: F401 - re-exported for tools
    remove_sqlite,
    run_child,
    run_procs,
    settled_xact_commit,
    summary,
    versions,
    xact_commit,
)
from .growth import part_growth
from .numbers import MARGINAL_SCENARIOS
from .report import render
from .scenarios import scenarios as checkpoint_scenarios
from .startup import part_startup
from .stream import part_stream
from .throughput import part_throughput

PARTS = (
    "checkpoint",
    "shapes",
    "dispatch",
    "throughput",
    "recovery",
    "approval",
    "dashboard",
    "prune",
    "replay",
    "stream",
    "startup",
    "growth",
    "memory",
)
RESULTS = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------- checkpoint


def _sizes(cfg: Config, system: str) -> int:
    import psycopg

    with psycopg.connect(cfg.pg_db_url(f"cp_{system}"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND " + cp.tables_sql(system)
        ).fetchone()
    return int(row[0])


def _terminate(cfg: Config, name: str) -> None:
    with pg_admin(cfg) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
            "AND pid <> pg_backend_pid()",
            (cfg.pg_db_name(name),),
        )


def _counted(cfg: Config, server: Server, system: str, before: bool) -> dict[str, int]:
    """Quiesce the system and read its database's commit counter (and table sizes)."""
    name = f"cp_{system}"
    q = server.ask("quiesce")
    out: dict[str, int] = {}
    if before:
        out["bytes"] = _sizes(cfg, system)
    if q.get("terminate"):
        _terminate(cfg, name)
        time.sleep(0.3)
        out["commits"] = xact_commit(cfg, name)
    else:
        out["commits"] = settled_xact_commit(cfg, name, until_backends=q.get("keep", 0))
    if not before:
        out["bytes"] = _sizes(cfg, system)
    return out


def part_checkpoint(cfg: Config, log_dir: Path) -> dict[str, Any]:
    scenarios = checkpoint_scenarios(cfg)
    skipped: dict[str, str] = {}
    servers: dict[tuple[str, str], Server] = {}
    pg_problem = pg_available(cfg) if "postgresql" in cfg.dbs else None
    try:
        for db in cfg.dbs:
            for system in cfg.systems:
                key = f"{system}/{db}"
                missing = cp.missing_packages(system, db)
                if missing:
                    skipped[key] = missing
                    continue
                if db == "postgresql" and pg_problem:
                    skipped[key] = f"PostgreSQL not available: {pg_problem}"
                    continue
                if db == "postgresql":
                    url = recreate_pg_db(cfg, f"cp_{system}")
                    dj_url = url.replace("postgresql://", "postgres://", 1)
                else:
                    path = cfg.sqlite_path(f"cp_{system}")
                    remove_sqlite(path)
                    url = str(path)
                    dj_url = f"sqlite:///{path}"
                env = django_env(cfg, database_url=dj_url)
                log(f"checkpoint: starting {key}")
                servers[(system, db)] = Server(
                    "bench.checkpoint",
                    ["--system", system, "--db", db, "--url", url],
                    env,
                    log_path=log_dir / f"checkpoint-{system}-{db}.log",
                )
        for srv in servers.values():
            srv.wait_ready()
        no_batched = {
            key: srv.hello.get("batched_reason")
            for key, srv in servers.items()
            if srv.hello.get("batched_reason")
        }
        timings: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        counts: dict[tuple[str, str, str], dict[str, Any]] = {}
        keys = list(servers)
        for rep in range(cfg.reps):
            for scen in scenarios:
                reps = scen.get("reps", cfg.reps)
                if rep >= reps:
                    continue
                measure = rep == reps - 1  # the last repetition also counts commits/bytes
                shift = rep % len(keys) if keys else 0
                for system, db in keys[shift:] + keys[:shift]:
                    if scen.get("only") and system not in scen["only"]:
                        continue
                    if scen.get("needs_batched") and (system, db) in no_batched:
                        continue
                    srv = servers[(system, db)]
                    count = measure and db == "postgresql"
                    pre = _counted(cfg, srv, system, True) if count else None
                    tx_pre = srv.ask("tx_counts") if count else {}
                    result = srv.ask(
                        "rep",
                        runs=scen["runs"],
                        steps=scen["steps"],
                        workflow=scen["workflow"],
                        sleep=scen.get("sleep", 0),
                        durability=scen.get("durability", ""),
                    )
                    tx_post = srv.ask("tx_counts") if count else {}
                    timings.setdefault((system, db, scen["key"]), []).append(result)
                    if pre is not None:
                        post = _counted(cfg, srv, system, False)
                        counts[(system, db, scen["key"])] = {
                            "commits": post["commits"] - pre["commits"],
                            "bytes": post["bytes"] - pre["bytes"],
                            "steps": result["steps"],
                            "runs": result["runs"],
                        }
                        if tx_post:
                            counts[(system, db, scen["key"])]["client_tx"] = {
                                k: tx_post.get(k, 0) - tx_pre.get(k, 0) for k in tx_post
                            }
            log(f"checkpoint: repetition {rep + 1}/{cfg.reps} done")
        profile = None
        # pyinstrument is in the bench extra; `make test` (the smoke test) runs without it
        can_profile = importlib.util.find_spec("pyinstrument") is not None
        for db in ("postgresql", "sqlite"):
            if can_profile and ("durable", db) in servers:
                runs, steps = (1, 50) if cfg.quick else (5, 200)
                log(f"checkpoint: profiling durable/{db}")
                profile = servers[("durable", db)].ask("profile", runs=runs, steps=steps)
                profile["db"] = db
                break
    finally:
        for srv in servers.values():
            srv.close()

    rows = []
    for (system, db, skey), results in timings.items():
        scen = next(s for s in scenarios if s["key"] == skey)
        per_step = [r["seconds"] / r["steps"] * 1000 for r in results]
        per_run = [r["seconds"] / r["runs"] * 1000 for r in results]
        row: dict[str, Any] = {
            "system": system,
            "db": db,
            "scenario": skey,
            "label": scen["label"],
            "per_step_ms": summary(per_step),
            "per_run_ms": summary(per_run),
        }
        c = counts.get((system, db, skey))
        if c:
            row["commits_per_step"] = c["commits"] / c["steps"]
            row["commits_per_run"] = c["commits"] / c["runs"]
            row["bytes_per_step"] = c["bytes"] / c["steps"]
            if c.get("client_tx"):
                row["client_tx_per_step"] = {k: v / c["steps"] for k, v in c["client_tx"].items()}
                row["client_tx_per_run"] = {k: v / c["runs"] for k, v in c["client_tx"].items()}
        rows.append(row)
    # marginal commits of one more step: difference of the long and the one-step runs
    for db in cfg.dbs:
        for system in cfg.systems:
            long_ = next(
                (
                    r
                    for r in rows
                    if (r["system"], r["db"], r["scenario"]) == (system, db, "seq")
                    and "commits_per_run" in r
                ),
                None,
            )
            one = next(
                (
                    r
                    for r in rows
                    if (r["system"], r["db"], r["scenario"]) == (system, db, "single")
                    and "commits_per_run" in r
                ),
                None,
            )
            if long_ and one:
                steps = next(s["steps"] for s in scenarios if s["key"] == "seq")
                marginal = (long_["commits_per_run"] - one["commits_per_run"]) / (steps - 1)
                long_["commits_marginal"] = marginal
                overhead = one["commits_per_run"] - marginal  # start, claim, complete, ...
                for r in rows:
                    if (
                        (r["system"], r["db"]) == (system, db)
                        and r["scenario"] in MARGINAL_SCENARIOS
                        and ("commits_per_run" in r)
                    ):
                        sc = next(s for s in scenarios if s["key"] == r["scenario"])
                        r["commits_marginal"] = (r["commits_per_run"] - overhead) / sc["steps"]
    batched: dict[str, Any] = {}
    if any(system == "durable" for system, _ in servers):
        reasons = [no_batched[k] for k in servers if k[0] == "durable" and k in no_batched]
        batched = {"available": not reasons}
        if reasons:
            batched["reason"] = reasons[0]
    return {
        "scenarios": scenarios,
        "batched": batched,
        "rows": rows,
        "skipped": skipped,
        "profile": profile,
        "reps": cfg.reps,
    }


# ------------------------------------------------------------------------ worker parts


def part_dispatch(cfg: Config, log_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    configs = [("redis", "postgresql"), ("filesystem", "sqlite")]
    for broker, db in configs:
        key = f"{broker}/{db}"
        problem = None
        if db == "postgresql":
            problem = pg_available(cfg)
        if broker == "redis" and not problem:
            problem = redis_available(cfg)
        if problem:
            out[key] = {"skipped": problem}
            continue
        log(f"dispatch: {key}")
        out[key] = run_procs(cfg, "dispatch", proc_env(cfg, db=db, broker=broker), log_dir)
    return out


def part_recovery(cfg: Config, log_dir: Path) -> dict[str, Any]:
    if problem := pg_redis_problem(cfg):
        return {"skipped": problem}
    env = proc_env(
        cfg,
        db="postgresql",
        broker="redis",
        DURABLE_LEASE_SECONDS="2",
        DURABLE_SWEEP_INTERVAL_SECONDS="0.5",
    )
    out = run_procs(cfg, "recovery", env, log_dir)
    # the same with no setting changed: 30 s lease, sweeps every 5 s, liveness beats
    # every 2 s and a process presumed dead after 6 s of silence
    log("recovery: default settings")
    clean = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("DURABLE_") and k not in ("DURABLE_VAR_DIR",)
    }
    env = proc_env(cfg, db="postgresql", broker="redis")
    for name in clean:
        env.pop(name, None)
    env.update(
        {
            "DURABLE_VAR_DIR": str(cfg.var_dir),
            "DURABLE_DISPATCH": "celery",
            "DURABLE_WORKFLOW_MODULES": "bench.workflows",
            "BENCH_RECOVERY_KILLS": "3" if cfg.quick else "10",
        }
    )
    out["default_settings"] = run_procs(cfg, "recovery", env, log_dir)
    return out


def part_approval(cfg: Config, log_dir: Path) -> dict[str, Any]:
    if problem := pg_redis_problem(cfg):
        return {"skipped": problem}
    return run_procs(cfg, "approval", proc_env(cfg, db="postgresql", broker="redis"), log_dir)


def part_dashboard(cfg: Config, log_dir: Path) -> dict[str, Any]:
    if problem := pg_available(cfg):
        return {"skipped": problem}
    name = "dashboard_quick" if cfg.quick else "dashboard"
    from .common import pg_db_exists

    if not pg_db_exists(cfg, name):
        recreate_pg_db(cfg, name)
    url = cfg.pg_db_url(name).replace("postgresql://", "postgres://", 1)
    args = [
        "--runs",
        str(cfg.seed_runs),
        "--steps",
        str(cfg.seed_steps),
        "--repeats",
        "5" if cfg.quick else "15",
    ]
    if cfg.reseed:
        args.append("--reseed")
    log(f"dashboard: {cfg.seed_runs} runs, {cfg.seed_steps} steps (seeding if needed)")
    return run_child(
        "bench.dashboard",
        args,
        django_env(cfg, database_url=url),
        timeout=7200,
        verbose=cfg.verbose,
    )[-1]


def part_shapes(cfg: Config, log_dir: Path) -> dict[str, Any]:
    """Diagnosis of the checkpoint's SQL shapes on Durable's schema (bench/shapes.py)."""
    if problem := pg_available(cfg):
        return {"skipped": problem}
    url = recreate_pg_db(cfg, "shapes").replace("postgresql://", "postgres://", 1)
    args = ["--steps", "100" if cfg.quick else "1000", "--reps", "2" if cfg.quick else "3"]
    return run_child(
        "bench.shapes", args, django_env(cfg, database_url=url), timeout=3600, verbose=cfg.verbose
    )[-1]


def part_prune(cfg: Config, log_dir: Path) -> dict[str, Any]:
    """Retention's throughput and the checkpoint latency while it runs (bench/prune.py)."""
    if problem := pg_available(cfg):
        return {"skipped": problem}
    url = recreate_pg_db(cfg, "prune").replace("postgresql://", "postgres://", 1)
    args = ["--runs", "200" if cfg.quick else "20000", "--steps", "50"]
    args += ["--probe", "20" if cfg.quick else "50", "--baseline", "3" if cfg.quick else "10"]
    return run_child(
        "bench.prune", args, django_env(cfg, database_url=url), timeout=3600, verbose=cfg.verbose
    )[-1]


def part_replay(cfg: Config, log_dir: Path) -> dict[str, Any]:
    """Runs a minute the replay check reads and replays (bench/replay_check.py)."""
    if problem := pg_available(cfg):
        return {"skipped": problem}
    url = recreate_pg_db(cfg, "replay").replace("postgresql://", "postgres://", 1)
    args = ["--runs", "300" if cfg.quick else "5000", "--steps", "20"]
    args += ["--reps", "1" if cfg.quick else "3"]
    return run_child(
        "bench.replay_check",
        args,
        django_env(cfg, database_url=url),
        timeout=3600,
        verbose=cfg.verbose,
    )[-1]


# --------------------------------------------------------------------------------- main


def parse(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small smoke run: the checkpoint part only (unless --only names "
        "parts), few steps; the dashboard seeds 2k runs / 20k steps",
    )
    p.add_argument("--only", default="", help=f"comma-separated parts of {','.join(PARTS)}")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out")
    p.add_argument(
        "--systems",
        default=",".join(cp.SYSTEMS),
        help="checkpoint systems: floor,durable,dbos,langgraph",
    )
    p.add_argument("--dbs", default="sqlite,postgresql", help="checkpoint databases")
    p.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions per checkpoint figure (default 3; 2 with --quick)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=None,
        help="dashboard seed: runs (default 100000; 2000 with --quick)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="dashboard seed: steps (default 2000000; 20000 with --quick)",
    )
    p.add_argument("--reseed", action="store_true", help="seed the dashboard database again")
    p.add_argument(
        "--pg",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="PostgreSQL server (a URL to its maintenance database); $BENCH_PG_URL",
    )
    p.add_argument(
        "--redis",
        default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"),
        help="Redis database the bench may flush; $BENCH_REDIS_URL",
    )
    p.add_argument("--var-dir", default=os.environ.get("BENCH_VAR_DIR", "/tmp/bench_var"))
    p.add_argument(
        "--db-prefix",
        default=os.environ.get("BENCH_DB_PREFIX", "bench_"),
        help="prefix of the bench's PostgreSQL databases (several checkouts "
        "sharing a server need different ones)",
    )
    p.add_argument("--out", default=str(RESULTS), help="folder of the results files")
    p.add_argument(
        "--name",
        default="",
        help="results file name without extension (default: the date; <date>-quick with --quick)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="add the parts run now to the existing results file of that name "
        "(e.g. re-run one part of today's full run)",
    )
    p.add_argument(
        "--rerender",
        action="store_true",
        help="only write <name>.md again from <name>.json (no measurement)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    default = ("checkpoint",) if a.quick else PARTS  # --quick: the in-process part only
    parts = [x for x in (a.only.split(",") if a.only else default) if x]
    parts = [x for x in parts if x not in a.skip.split(",")]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        p.error(f"unknown parts: {bad}")
    systems = [s for s in a.systems.split(",") if s]
    if any(s not in cp.SYSTEMS for s in systems):
        p.error(f"systems are {cp.SYSTEMS}")
    dbs = [d for d in a.dbs.split(",") if d]
    if any(d not in ("sqlite", "postgresql") for d in dbs):
        p.error("dbs are sqlite, postgresql")
    cfg = Config(
        pg_url=a.pg,
        redis_url=a.redis,
        var_dir=Path(a.var_dir),
        quick=a.quick,
        reps=a.reps or (2 if a.quick else 3),
        parts=parts,
        systems=systems,
        dbs=dbs,
        seed_runs=a.runs or (2000 if a.quick else 100_000),
        seed_steps=a.steps or (20_000 if a.quick else 2_000_000),
        reseed=a.reseed,
        verbose=a.verbose,
        db_prefix=a.db_prefix,
    )
    cfg.out = Path(a.out)  # type: ignore[attr-defined]
    cfg.merge = a.merge  # type: ignore[attr-defined]
    cfg.rerender = a.rerender  # type: ignore[attr-defined]
    cfg.name = a.name or (dt.date.today().isoformat() + ("-quick" if a.quick else ""))  # type: ignore[attr-defined]
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    if cfg.rerender:  # type: ignore[attr-defined]
        path = cfg.out / f"{cfg.name}.json"  # type: ignore[attr-defined]
        text = _with_notes(render(json.loads(path.read_text())), path.with_suffix(""))
        path.with_suffix(".md").write_text(text)
        print(text)
        return 0
    cfg.var_dir.mkdir(parents=True, exist_ok=True)
    log_dir = cfg.var_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "quick": cfg.quick,
        "machine": machine_info(),
        "parts": {},
        "errors": {},
        "config": {
            "pg": cfg.pg_url,
            "redis": cfg.redis_url,
            "reps": cfg.reps,
            "systems": cfg.systems,
            "dbs": cfg.dbs,
            "seed_runs": cfg.seed_runs,
            "seed_steps": cfg.seed_steps,
        },
        "versions": versions(cfg),
    }
    funcs = {
        "checkpoint": part_checkpoint,
        "shapes": part_shapes,
        "dispatch": part_dispatch,
        "throughput": part_throughput,
        "recovery": part_recovery,
        "approval": part_approval,
        "dashboard": part_dashboard,
        "prune": part_prune,
        "replay": part_replay,
        "stream": part_stream,
        "startup": part_startup,
        "growth": part_growth,
    }
    todo = [p for p in cfg.parts if p != "memory"]
    if "memory" in cfg.parts and "throughput" not in todo:
        todo.append("throughput")  # the memory figure is the worker's RSS after that batch
    for part in todo:
        t = time.time()
        log(f"part {part}")
        try:
            results["parts"][part] = funcs[part](cfg, log_dir)
        except Exception as exc:  # noqa: BLE001 - the other parts still run
            traceback.print_exc()
            results["errors"][part] = f"{type(exc).__name__}: {exc}"[:4000]
        results.setdefault("part_seconds", {})[part] = round(time.time() - t, 1)
    results["machine"]["loadavg_end"] = list(os.getloadavg())
    results["total_seconds"] = round(time.time() - started, 1)
    results["requested_parts"] = cfg.parts
    out: Path = cfg.out  # type: ignore[attr-defined]
    previous = out / f"{cfg.name}.json"  # type: ignore[attr-defined]
    if cfg.merge and previous.exists():  # type: ignore[attr-defined]
        merged = json.loads(previous.read_text())
        merged["parts"].update(results["parts"])
        for part in results["parts"]:
            merged["errors"].pop(part, None)
        merged["errors"].update(results["errors"])
        merged.setdefault("part_seconds", {}).update(results.get("part_seconds", {}))
        merged["requested_parts"] = list(
            dict.fromkeys(merged.get("requested_parts", []) + cfg.parts)
        )
        merged.setdefault("merged", []).append(
            {"date": results["date"], "parts": cfg.parts, "machine": results["machine"]}
        )
        merged["total_seconds"] = round(sum(merged["part_seconds"].values()), 1)
        results = merged
    text = _with_notes(render(results), out / cfg.name)  # type: ignore[attr-defined]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{cfg.name}.json").write_text(json.dumps(results, indent=2, default=str))  # type: ignore[attr-defined]
    (out / f"{cfg.name}.md").write_text(text)  # type: ignore[attr-defined]
    print(text)
    log(f"wrote {out / cfg.name}.md and .json in {results['total_seconds']} s")  # type: ignore[attr-defined]
    return 1 if results["errors"] else 0


def _with_notes(text: str, stem: Path) -> str:
    """Append ``<name>.notes.md`` (a human analysis of that run), when there is one."""
    notes = stem.parent / f"{stem.name}.notes.md"
    if notes.exists():
        text = text.rstrip() + "\n\n" + notes.read_text().strip() + "\n"
    return text
