"""Fixture workflows for waits, approvals, signals, cancellation and compensation."""

from __future__ import annotations

import durable

EFFECTS: list[tuple[str, object]] = []


@durable.tool(
    name="waits.charge",
    safety="idempotent_write",
    compensate=lambda params, result, *, idempotency_key: EFFECTS.append(
        ("refund", params["amount"])
    ),
)
def charge(amount, *, idempotency_key):
    EFFECTS.append(("charge", amount))
    return {"id": f"ch_{idempotency_key}", "amount": amount}


@durable.tool(
    name="waits.send",
    safety="unsafe_write",
    requires_approval=True,
    allow_edit=True,
    reconcile=lambda params, *, idempotency_key: durable.NOT_FOUND,
)
def send(to, body, *, idempotency_key):
    EFFECTS.append(("send", to, body))
    return {"sent": to}


@durable.workflow(name="tests.approval", version="1")
def approval_flow(ctx, data):
    first = ctx.wait_for_approval("budget", title="Approve the budget", payload=data)
    if not first:
        return {"approved": False, "comment": first.comment}
    second = ctx.wait_for_approval("send", title="Approve sending")
    return {"approved": second.approved, "by": list(second.decided_by)}


@durable.workflow(name="tests.signal", version="1")
def signal_flow(ctx, data):
    got = ctx.wait_for_signal("go", timeout=data.get("timeout"), default="timed out")
    return {"got": got}


@durable.workflow(name="tests.sleep", version="1")
def sleep_flow(ctx, data):
    ctx.step("a", lambda: EFFECTS.append(("a",)) or 1)
    ctx.sleep(data["seconds"])
    ctx.step("b", lambda: EFFECTS.append(("b",)) or 2)
    return "done"


@durable.workflow(name="tests.tool_approval", version="1")
def tool_approval_flow(ctx, data):
    result = ctx.call_tool("waits.send", {"to": data["to"], "body": "hello"})
    return {
        "result": result if not isinstance(result, durable.ModelRecoverable) else result.message
    }


@durable.workflow(name="tests.charge_then_fail", version="1")
def charge_then_fail(ctx, data):
    ctx.call_tool("waits.charge", {"amount": 10})
    ctx.call_tool("waits.charge", {"amount": 20})
    ctx.step("boom", _boom, retry=durable.RetryPolicy(max_attempts=1))
    return "unreachable"


def _boom():
    if EFFECTS and EFFECTS[-1] == ("fixed",):
        return "ok"
    raise durable.PermanentError("card declined")


# --- the decision path: deadlines, edits, argument versions, secrets (S17, S18)

#: (tool, params) of every call of the tools below
CALLS: list[tuple[str, dict]] = []


@durable.tool(
    name="waits.refund", safety="idempotent_write", requires_approval=True, allow_edit=True
)
def refund(charge_id: str, amount: int, *, idempotency_key: str) -> dict:
    """A typed tool whose arguments an approver may edit, checked before they are
    recorded (S18)."""
    CALLS.append(("refund", {"charge_id": charge_id, "amount": amount}))
    return {"refunded": amount, "charge": charge_id}


@durable.tool(name="waits.pay", safety="idempotent_write", requires_approval=True, allow_edit=True)
def pay(amount: int, api_key: str, memo: str = "", *, idempotency_key: str) -> dict:
    """A tool with a secret parameter: an edit must not round-trip it through a form."""
    CALLS.append(("pay", {"amount": amount, "api_key": api_key, "memo": memo}))
    return {"paid": amount, "memo": memo}


@durable.workflow(name="tests.refund", version="1")
def refund_flow(ctx, data):
    result = ctx.call_tool("waits.refund", data.get("params", {"charge_id": "ch_1", "amount": 100}))
    if isinstance(result, durable.ModelRecoverable):
        return {"error": result.message, "type": result.error_type}
    return {"result": result}


@durable.workflow(name="tests.pay", version="1")
def pay_flow(ctx, data):
    result = ctx.call_tool(
        "waits.pay",
        {"amount": data["amount"], "api_key": data["api_key"], "memo": data.get("memo", "")},
    )
    if isinstance(result, durable.ModelRecoverable):
        return {"error": result.message, "type": result.error_type}
    return {"result": result}


@durable.workflow(name="tests.purchase", version="1")
def purchase_flow(ctx, data):
    """Exact approval deadlines (S17) and the N-of-M edit hole: one approval with
    options from the input."""
    options = {
        k: data[k]
        for k in ("approvers", "timeout", "on_timeout", "escalate_to", "required", "allow_edit")
        if k in data
    }
    decision = ctx.wait_for_approval(
        "purchase", title=data.get("title", "Buy it?"), payload=data.get("payload"), **options
    )
    return decision.to_dict()
