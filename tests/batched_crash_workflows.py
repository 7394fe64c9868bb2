"""The batched chain of the batched-checkpoint crash tests (``tests/processes``).

Workers import it besides ``tests.crash_workflows`` (whose files, crash switch and
recording fake service it uses: ``CRASH_AT``, ``CRASH_TEST_DIR``, ``effects.jsonl``,
``invocations.jsonl``). ``crash.batched_chain`` (durability="batched") is four
read-only lookups, one unsafe write, two more lookups; the write's body records in its
effect line which of the run's steps were committed when it ran, so a test can check
that no write ran while an earlier checkpoint was only pending.
"""

from __future__ import annotations

from typing import Any

import durable
from durable import NOT_FOUND
from tests.crash_workflows import crash_point, enter, service_call, service_lookup, split_key


@durable.tool(name="crash.lookup", safety="read_only")
def lookup(n: int, *, idempotency_key: str) -> int:
    """A read that may run again: its checkpoint follows the workflow (batched)."""
    enter("step", idempotency_key)
    crash_point(f"{split_key(idempotency_key)[1]}:before")
    return n * 10


def committed_positions(run_id: str) -> list[int]:
    from durable.models import Step, StepStatus

    return sorted(
        Step.objects.filter(run_id=run_id, status=StepStatus.SUCCEEDED).values_list(
            "position", flat=True
        )
    )


def find_transfer(params: dict[str, Any], *, idempotency_key: str) -> Any:
    enter("reconcile", idempotency_key)
    return service_lookup("transfers", idempotency_key) or NOT_FOUND


@durable.tool(name="crash.transfer", safety="unsafe_write", reconcile=find_transfer)
def transfer(total: int, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent: every call is another transfer, recorded with what was durable."""
    enter("step", idempotency_key)
    run_id, _ = split_key(idempotency_key)
    durable_before = committed_positions(run_id)
    crash_point("w:before")
    result = service_call(
        "transfers",
        idempotency_key,
        {"total": total, "durable_before": durable_before},
        dedupe=False,
        make_result=lambda n: {"transfer_id": f"X-{n}", "total": total},
    )
    crash_point("w:after_effect")
    return result


#: the chain's durable calls in order (step ids); the write is at position 4
CHAIN = ("r0", "r1", "r2", "r3", "w", "r4", "r5")


@durable.workflow(name="crash.batched_chain", version="1", durability="batched")
def batched_chain(ctx, data):
    first = [ctx.call_tool("crash.lookup", {"n": data["n"] + i}, step_id=f"r{i}") for i in range(4)]
    moved = ctx.call_tool("crash.transfer", {"total": sum(first)}, step_id="w")
    after = [ctx.call_tool("crash.lookup", {"n": i}, step_id=f"r{i}") for i in (4, 5)]
    crash_point("chain:before_complete")  # r4 and r5 may still be pending
    return {"first": first, "transfer": moved, "after": after}
