"""The parallel group of the parallel-group crash test (``tests/processes``).

Workers import it besides ``tests.crash_workflows`` (whose files, crash switch and
recording fake service it uses). ``crash.parallel`` is one ``ctx.parallel`` group of
five plain steps and one unsafe write (index 1, position 1). Step ``p3`` waits until the calls
before it are committed, then reaches its crash point: a worker killed there leaves
``p0``, the write, ``p1`` and ``p2`` recorded and ``p3``, ``p4`` not.
"""

from __future__ import annotations

import time

import durable
from tests.batched_crash_workflows import committed_positions
from tests.crash_workflows import crash_point, enter, split_key


def item(n: int, *, idempotency_key: str) -> int:
    """A plain step of the group; ``p3`` crashes once the calls before it are committed."""
    enter("step", idempotency_key)
    run_id, step_id = split_key(idempotency_key)
    if step_id == "p3":
        deadline = time.monotonic() + 20
        while committed_positions(run_id) != [0, 1, 2, 3] and time.monotonic() < deadline:
            time.sleep(0.05)
        crash_point("p3:before")
    return n * 10


@durable.workflow(name="crash.parallel", version="1")
def parallel_group(ctx, data):
    calls = [durable.call(item, n, step_id=f"p{n}") for n in range(5)]
    calls.insert(1, durable.tool_call("crash.transfer", {"total": 7}, step_id="w"))
    return ctx.parallel(calls)
