"""Fixture workflows for the replay check (``manage.py durable replay-check``) and
``durable.testing.replay``. Importing this module registers them.

``EDIT`` switches a workflow's code between executions, as an in-place edit deployed
under the same version would: ``EDIT["support"]`` is ``None`` (the code the runs were
recorded with) or the name of an edit (see :func:`support`).
"""

from __future__ import annotations

from typing import Any

import durable

EDIT: dict[str, Any] = {}
CALLS: list[str] = []


def reset() -> None:
    EDIT.clear()
    CALLS.clear()


def plan(message: str) -> dict[str, Any]:
    CALLS.append("plan")
    return {"charge": "ch_1", "amount": 10, "why": message}


def check_fraud(charge: str) -> bool:
    CALLS.append("check_fraud")
    return False


def notify(text: str) -> str:
    CALLS.append("notify")
    return text


@durable.tool(safety="read_only", name="replay.lookup")
def lookup(charge_id: str) -> dict[str, Any]:
    CALLS.append("lookup")
    return {"charge_id": charge_id, "paid": 10}


@durable.tool(safety="read_only", name="replay.lookup_v2")
def lookup_v2(charge_id: str) -> dict[str, Any]:
    CALLS.append("lookup_v2")
    return {"charge_id": charge_id, "paid": 10}


@durable.workflow(name="replay.support", version="1")
def support(ctx, ticket):
    edit = EDIT.get("support")
    p = ctx.step("plan", plan, ticket["message"])
    if edit == "tool_renamed":
        ctx.call_tool("replay.lookup_v2", {"charge_id": p["charge"]}, step_id="replay.lookup")
    elif edit != "tool_removed":
        ctx.call_tool("replay.lookup", {"charge_id": p["charge"]})
    if edit == "call_before_wait":
        ctx.step("check_fraud", check_fraud, p["charge"])  # the in-place edit under test
    if edit == "raises":
        raise KeyError("total")  # code that no longer fits the recorded values
    if edit == "writes":  # a write outside any step: the replay check must not make it
        from durable.models import Run

        Run.objects.filter(pk=ctx.run_id).update(tags=["written by the replay check"])
    decision = ctx.wait_for_approval("refund", title="Refund?")
    if edit == "step_after_wait":
        ctx.step("notify_first", notify, "approved")
    ctx.step("notify", notify, "done" if decision.approved else "rejected")
    return {"refunded": decision.approved}


@durable.workflow(name="replay.support", version="2")
def support_v2(ctx, ticket):
    p = ctx.step("plan", plan, ticket["message"])
    ctx.step("check_fraud", check_fraud, p["charge"])
    return {"refunded": False}


@durable.workflow(name="replay.gone", version="1")
def gone(ctx, _input):
    ctx.step("plan", plan, "x")
    ctx.sleep(3600)
    return None


def square(n: int) -> int:
    return n * n


@durable.workflow(name="replay.leaf", version="1")
def leaf(ctx, data):
    return ctx.step("leaf", square, data["n"])


@durable.workflow(name="replay.mixed", version="1")
def mixed(ctx, data):
    """Every kind of durable call the replay check must answer from the history."""
    squares = ctx.parallel(
        [
            durable.call(square, 2, step_id="sq2"),
            durable.call(square, 3),
            durable.tool_call("replay.lookup", {"charge_id": "ch_p"}),
        ]
    )
    turn = ctx.run_tool_calls(
        [{"id": "t1", "name": "replay.lookup", "arguments": {"charge_id": "ch_t"}}]
    )
    ctx.sleep(0)
    child = ctx.start_child("replay.leaf", {"n": 4}, child_id="leaf")
    four = ctx.wait_child(child)
    go = ctx.wait_for_signal("go")
    if EDIT.get("mixed") == "after_signal":
        ctx.step("after", square, 5)
    return {"squares": squares, "turn": len(turn), "four": four, "go": go}
