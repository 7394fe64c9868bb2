"""Bench row: a 10-way parallel group against 10 sequential steps, each sleeping 20 ms.

``python -m bench.parallel [--width 10] [--sleep-ms 20] [--reps 3]`` (environment:
``DATABASE_URL`` of a scratch database, or none for a fresh embedded SQLite under
``DURABLE_VAR_DIR``) migrates, then runs workflow ``bench.par_group`` (one
``ctx.parallel`` of ``width`` calls) and ``bench.par_seq`` (``width`` ``ctx.step``\\ s)
in-process with ``DURABLE_DISPATCH=manual``, interleaved, and prints the median wall
time of each run and their ratio (sequential / parallel) as a Markdown table. The
checkpoints are the same in both (one per call); only the bodies overlap.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from .common import summary


def _sleep(ms: float) -> None:
    time.sleep(ms / 1000.0)


def _register() -> None:
    import durable

    @durable.workflow(name="bench.par_group", version="1")
    def par_group(ctx: Any, inp: dict[str, Any]) -> int:
        calls = [durable.call(_sleep, inp["ms"]) for _ in range(inp["width"])]
        return len(ctx.parallel(calls))

    @durable.workflow(name="bench.par_seq", version="1")
    def par_seq(ctx: Any, inp: dict[str, Any]) -> int:
        for i in range(inp["width"]):
            ctx.step(f"s{i}", _sleep, inp["ms"])
        return inp["width"]


def measure(width: int, sleep_ms: float, reps: int) -> dict[str, Any]:
    """``{"parallel": summary, "sequential": summary, "ratio": float}`` (seconds)."""
    import durable
    from durable.worker.engine import execute

    times: dict[str, list[float]] = {"parallel": [], "sequential": []}
    for _ in range(reps):
        for label, name in (("parallel", "bench.par_group"), ("sequential", "bench.par_seq")):
            run = durable.start(name, {"width": width, "ms": sleep_ms})
            began = time.perf_counter()
            execute(run.id, worker_id="bench-parallel")
            times[label].append(time.perf_counter() - began)
    par, seq = summary(times["parallel"]), summary(times["sequential"])
    return {"parallel": par, "sequential": seq, "ratio": seq["median"] / par["median"]}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.parallel")
    p.add_argument("--width", type=int, default=10)
    p.add_argument("--sleep-ms", type=float, default=20.0)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["DURABLE_DISPATCH"] = "manual"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    _register()
    r = measure(a.width, a.sleep_ms, a.reps)
    print(f"| measurement ({a.width} calls x {a.sleep_ms:g} ms) | median s | min s | max s |")
    print("|---|---|---|---|")
    for label in ("parallel", "sequential"):
        s = r[label]
        print(f"| {label} | {s['median']:.3f} | {s['min']:.3f} | {s['max']:.3f} |")
    print(f"| ratio sequential / parallel | {r['ratio']:.1f}x | | |")


if __name__ == "__main__":
    main()
