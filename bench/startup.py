"""Part "startup": how long a CLI command and a worker take to start on the demo's
configuration (every installed app's workflows, the example agents' frameworks with
them).

``python -m bench.startup --reps N`` (environment: ``DATABASE_URL`` and
``CELERY_BROKER_URL`` of scratch services) migrates, then times, each ``N`` times, in
processes of their own:

1. ``manage.py durable runs --limit 1``: a command that reads runs (the workflow modules
   are not imported: durable/registry.py imports them at the first lookup);
2. ``manage.py durable workflows``: a command that lists the registry, so imports every
   workflow module and the frameworks they use;
3. a Celery worker (prefork, 2 children, as the Procfile's) from its spawn to its
   ``ready`` line: on the demo's configuration (it imports the workflow modules in its
   main process before it forks, so its children share them) and as a worker that names
   its modules (``DURABLE_AUTODISCOVER=false``, ``DURABLE_WORKFLOW_MODULES=examples.workflows``:
   the reference agents without the framework ones).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import (
    CELERY,
    REPO,
    Config,
    django_env,
    emit,
    pg_available,
    recreate_pg_db,
    run_child,
    summary,
)


def _command(args: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def _worker_ready(env: dict[str, str], timeout: float = 120) -> float:
    with tempfile.NamedTemporaryFile("w+b", suffix=".log") as log:
        t = time.perf_counter()
        proc = subprocess.Popen(
            [CELERY, "-A", "config", "worker", "--concurrency=2", "--loglevel=INFO"]
            + ["--without-mingle", "--without-gossip", "-n", f"startup{os.getpid()}@%h"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while b" ready." not in Path(log.name).read_bytes():
                if proc.poll() is not None or time.perf_counter() - t > timeout:
                    tail = Path(log.name).read_bytes()[-3000:].decode(errors="replace")
                    raise RuntimeError(f"the worker did not become ready:\n{tail}")
                time.sleep(0.02)
            return time.perf_counter() - t
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_WORKFLOW")}
    env["DURABLE_AUTODISCOVER"] = "true"  # the demo's configuration, not the bench's
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True
    )
    lean = {
        **env,
        "DURABLE_AUTODISCOVER": "false",
        "DURABLE_WORKFLOW_MODULES": "examples.workflows",
    }
    rows = {
        "cli_runs_s": [_command(["durable", "runs", "--limit", "1"], env) for _ in range(a.reps)],
        "cli_workflows_s": [_command(["durable", "workflows"], env) for _ in range(a.reps)],
        "worker_ready_s": [_worker_ready(env) for _ in range(a.reps)],
        "worker_named_modules_ready_s": [_worker_ready(lean) for _ in range(a.reps)],
    }
    emit({"reps": a.reps, **{k: summary(v) for k, v in rows.items()}})


def part_startup(cfg: Config, log_dir: Any) -> dict[str, Any]:
    """The orchestrator's part (``python -m bench --only startup``): on PostgreSQL + Redis."""
    if problem := pg_available(cfg):
        return {"skipped": problem}
    url = recreate_pg_db(cfg, "startup").replace("postgresql://", "postgres://", 1)
    env = django_env(cfg, database_url=url, broker_url=cfg.redis_url)
    args = ["--reps", "2" if cfg.quick else "5"]
    return run_child("bench.startup", args, env, timeout=1800, verbose=cfg.verbose)[-1]


LABELS = {
    "cli_runs_s": "`manage.py durable runs --limit 1` (reads runs)",
    "cli_workflows_s": "`manage.py durable workflows` (imports every workflow module)",
    "worker_ready_s": "worker ready, the demo's configuration (prefork, 2 children)",
    "worker_named_modules_ready_s": (
        "worker ready, naming its modules (`DURABLE_AUTODISCOVER=false`)"
    ),
}


def section(s: dict[str, Any]) -> list[str]:
    """The part's section of the results file."""
    from .numbers import mmm

    title = "## Start-up: a CLI command and a worker"
    if "skipped" in s:
        return [title, "", f"Skipped: {s['skipped']}"]
    rows = [f"| {label} | {mmm(s[key])} |" for key, label in LABELS.items() if key in s]
    return [
        title,
        "",
        f"Wall seconds from the process's spawn, median (min–max) of {s['reps']} "
        "(bench/startup.py).",
        "",
        "| Process | Seconds |",
        "|---|---|",
        *rows,
    ]


if __name__ == "__main__":
    main()
