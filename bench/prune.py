"""Part "prune": retention's throughput, and what a prune costs the workers meanwhile.

``python -m bench.prune --runs R --steps S --probe N`` (environment: ``DATABASE_URL``
of a scratch database) migrates, seeds R finished runs of S steps each (with a trace
event per step, finished two days ago) by bulk insert, then:

1. measures the checkpoint latency of a live run alone: ``bench.noop`` with N steps,
   in-process (``durable.worker.engine.execute``), a few times;
2. starts ``manage.py durable prune --older-than 86400`` in a process of its own
   (default batch and pause, as the beat's task) and measures the same live runs while
   it deletes, until it is done;
3. reports runs and steps deleted per second and the live run's ms/step before and
   during the prune (median, p95 of the per-run figures).

The live runs write the tables the prune deletes from (run, step, trace event): the
figure says whether the prune's batches hold them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from .common import emit, percentile, setup_django, summary


def _seed(runs: int, steps: int) -> None:
    from django.utils import timezone

    from durable.models import Run, RunStatus, Step, StepStatus, TraceEvent

    done = timezone.now() - timedelta(days=2)
    chunk = max(1, 2000 // max(steps, 1))
    for start in range(0, runs, chunk):
        batch = [
            Run(
                id=f"prune-{i}",
                workflow_name="bench.noop",
                workflow_version="1",
                status=RunStatus.SUCCEEDED,
                input="{}",
                input_hash="0" * 64,
                output="1",
                finished_at=done,
                updated_at=done,
            )
            for i in range(start, min(start + chunk, runs))
        ]
        Run.objects.bulk_create(batch)
        Step.objects.bulk_create(
            Step(
                run=r,
                step_id=f"s#{p}" if p else "s",
                position=p,
                status=StepStatus.SUCCEEDED,
                output="null",
                finished_at=done,
            )
            for r in batch
            for p in range(steps)
        )
        TraceEvent.objects.bulk_create(
            TraceEvent(run=r, kind="step_executed", step_id="s", created_at=done)
            for r in batch
            for _ in range(steps)
        )


def _live_run(steps: int) -> float:
    """ms per step of one ``bench.noop`` run executed in-process."""
    import durable
    from durable.worker.engine import execute

    run = durable.start("bench.noop", {"steps": steps})
    t = time.perf_counter()
    execute(run.id)
    return (time.perf_counter() - t) * 1000.0 / steps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--probe", type=int, default=50, help="steps of each live run")
    p.add_argument("--baseline", type=int, default=10, help="live runs before the prune")
    a = p.parse_args(argv)
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    import bench.workflows  # noqa: F401  (registers bench.noop)

    t = time.perf_counter()
    _seed(a.runs, a.steps)
    seed_seconds = time.perf_counter() - t
    for _ in range(2):
        _live_run(a.probe)  # warm-up
    before = [_live_run(a.probe) for _ in range(a.baseline)]

    # the prune in a process of its own, as the beat's task runs in a worker
    connection.close()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "durable", "prune", "--older-than", "86400", "--json"],
        cwd=str(Path(__file__).resolve().parent.parent),
        stdout=subprocess.PIPE,
        text=True,
    )
    t = time.perf_counter()
    during: list[float] = []
    while proc.poll() is None or not during:
        during.append(_live_run(a.probe))
    out, _ = proc.communicate()
    elapsed = time.perf_counter() - t
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    steps = report.get("rows", {}).get("step", 0)
    emit(
        {
            "runs": a.runs,
            "steps_per_run": a.steps,
            "seed_seconds": round(seed_seconds, 1),
            "pruned_runs": report.get("runs", 0),
            "pruned_steps": steps,
            "batches": report.get("batches", 0),
            "prune_seconds": round(report.get("seconds", elapsed), 2),
            "runs_per_second": round(report.get("runs", 0) / max(report.get("seconds", 1), 1e-9)),
            "steps_per_second": round(steps / max(report.get("seconds", 1), 1e-9)),
            "checkpoint_ms_before": summary(before),
            "checkpoint_ms_during": summary(during),
            "checkpoint_p95_before": percentile(before, 95),
            "checkpoint_p95_during": percentile(during, 95),
            "live_runs_during": len(during),
        }
    )


if __name__ == "__main__":
    main()
