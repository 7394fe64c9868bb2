"""Workflows of the in-place database-fault trial
(``tests/durable/worker/test_trial_db_fault_inplace.py``).

Bodies log each entry to ``invocations.jsonl`` (``tests/crash_workflows.enter``, the
``CRASH_TEST_DIR`` the tests set), so "the body ran once" is counted as in
``tests/dbfault_workflows.py``, whose ``dbf.charge`` tool and ``note_call`` body these
workflows reuse.
"""

from __future__ import annotations

import durable
from durable import RetryPolicy
from tests.crash_workflows import enter
from tests.dbfault_workflows import note_call

#: failures left before a ``flaky`` body succeeds, by label (set by a test)
FLAKY: dict[str, int] = {}

QUICK = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)


def flaky(label: str, *, idempotency_key: str) -> str:
    """A body whose provider resets the connection ``FLAKY[label]`` times first."""
    enter("step", idempotency_key)
    if FLAKY.get(label, 0) > 0:
        FLAKY[label] -= 1
        raise ConnectionResetError("connection reset by peer (the provider, not the database)")
    return label


@durable.workflow(name="trial.llm_then_charge", version="1")
def llm_then_charge(ctx, data):
    """A model turn, the write it decides, then a second model turn (under a budget)."""
    answer = ctx.llm([{"role": "user", "content": "which ticket?"}], step_id="ask")
    charged = ctx.call_tool("dbf.charge", {"n": data["n"], "ticket": answer["content"]})
    again = ctx.llm([{"role": "user", "content": "summarise"}], step_id="summary")
    return {
        "ticket": answer["content"],
        "charge": charged["charge_id"],
        "summary": again["content"],
    }


@durable.workflow(name="trial.retried", version="1")
def retried(ctx, data):
    """A step that succeeds at its second try (an in-process retry), then another."""
    first = ctx.step("flaky", flaky, "flaky", retry=QUICK)
    return [first, ctx.step("next", note_call, "next")]


@durable.workflow(name="trial.parallel", version="1")
def parallel(ctx, data):
    """Three plain calls at once (one parallel group), then a sync step."""
    out = ctx.parallel([durable.call(note_call, f"p{i}", step_id=f"p{i}") for i in range(3)])
    return [*out, ctx.step("last", note_call, "last")]


@durable.workflow(name="trial.plain_steps_then_charge", version="1")
def plain_steps_then_charge(ctx, data):
    """Two plain steps (no ledger row between them), then an unsafe write."""
    first = ctx.step("first", note_call, "first")
    second = ctx.step("second", note_call, "second")
    charged = ctx.call_tool("dbf.charge", {"n": data["n"], "ticket": first})
    return [first, second, charged["charge_id"]]


def release_seat(params: dict, result: dict, *, idempotency_key: str) -> dict:
    """The compensation of a booking: logged each time it runs (``kind="compensate"``)."""
    enter("compensate", idempotency_key)
    return {"released": result["seat"]}


@durable.tool(
    name="trial.book_seat",
    safety="unsafe_write",
    compensate=release_seat,
    requires_approval=False,
)
def book_seat(seat: str, *, idempotency_key: str) -> dict:
    enter("step", idempotency_key)
    return {"seat": seat}


def refuse(*, idempotency_key: str) -> None:
    enter("step", idempotency_key)
    raise durable.PermanentError("the airline refused the booking (HTTP 403)")


@durable.workflow(name="trial.book_then_fail", version="1")
def book_then_fail(ctx, data):
    """A booking (an unsafe write with a compensation), then a step that fails for good."""
    booked = ctx.call_tool("trial.book_seat", {"seat": data["seat"]})
    ctx.step("confirm", refuse)
    return booked
