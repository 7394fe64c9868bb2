"""Part "replay": how many open runs a minute ``manage.py durable replay-check`` checks.

``python -m bench.replay_check --runs R --steps S`` (environment: ``DATABASE_URL`` of a
scratch database, or none for the embedded SQLite under ``DURABLE_VAR_DIR``) migrates,
seeds R runs of ``bench.replay`` parked on their approval with S recorded steps each (and
the approval's pending wait) by bulk insert, then:

1. times :func:`durable.worker.dry.check_runs` in this process (``--reps`` times; every
   run must come out compatible, "continues" at the approval, or the figure is refused);
2. times ``manage.py durable replay-check --json`` in a process of its own, end to end
   (Django's start and the discovery of the workflows included), once;
3. reports runs per minute for both (the target: at least 1,000 a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import emit, setup_django, summary


def _seed(runs: int, steps: int) -> None:
    from durable.models import Run, RunStatus, Step, StepStatus, Wait, WaitKind, WaitStatus

    chunk = max(1, 5000 // max(steps, 1))
    for start in range(0, runs, chunk):
        batch = [
            Run(
                id=f"replay-{i}",
                workflow_name="bench.replay",
                workflow_version="1",
                status=RunStatus.WAITING,
                input=json.dumps({"steps": steps}),
                input_hash="0" * 64,
                cursor_position=steps,
            )
            for i in range(start, min(start + chunk, runs))
        ]
        Run.objects.bulk_create(batch)
        Step.objects.bulk_create(
            Step(
                run=r,
                step_id="s" if p == 0 else f"s#{p + 1}",
                position=p,
                status=StepStatus.SUCCEEDED,
                output="null",
            )
            for r in batch
            for p in range(steps)
        )
        Wait.objects.bulk_create(
            Wait(
                run=r,
                wait_id="approval:ok",
                position=steps,
                kind=WaitKind.APPROVAL,
                key="ok",
                title="go on?",
                status=WaitStatus.PENDING,
            )
            for r in batch
        )


def _checked(report: dict[str, Any], runs: int) -> None:
    if report["checked"] != runs or report["diverged"]:
        raise RuntimeError(f"the seeded runs did not all replay: {json.dumps(report)[:2000]}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    import bench.workflows  # noqa: F401  (registers bench.replay)
    from durable.worker.dry import check_runs

    t = time.perf_counter()
    _seed(a.runs, a.steps)
    seed_seconds = time.perf_counter() - t
    check_runs(workflow="bench.replay", sample=min(50, a.runs))  # warm-up
    seconds = []
    for _ in range(a.reps):
        t = time.perf_counter()
        report = check_runs()
        seconds.append(time.perf_counter() - t)
        _checked(report, a.runs)
    connection.close()
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "manage.py", "durable", "replay-check", "--json"],
        cwd=str(Path(__file__).resolve().parent.parent),
        capture_output=True,
        text=True,
        check=False,
    )
    command_seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"replay-check exited {proc.returncode}: {proc.stderr[-2000:]}")
    _checked(json.loads(proc.stdout.strip().splitlines()[-1]), a.runs)
    emit(
        {
            "database": connection.vendor,
            "runs": a.runs,
            "steps_per_run": a.steps,
            "seed_seconds": round(seed_seconds, 1),
            "check_seconds": summary(seconds),
            "runs_per_minute": round(a.runs * 60 / summary(seconds)["median"]),
            "command_seconds": round(command_seconds, 2),
            "command_runs_per_minute": round(a.runs * 60 / command_seconds),
        }
    )


if __name__ == "__main__":
    main()
