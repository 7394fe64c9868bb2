"""Workflows and tools of the testing kit's own tests (``tests/durable/testing``).

Bodies append to :data:`SEEN` the clock's time (``durable.clock.now()``) when they run,
so a test reads when, by the skipped clock, each one ran.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import durable
from durable import NOT_FOUND, RetryPolicy, clock

#: (what, the shared clock's now) each time a body ran
SEEN: list[tuple[str, Any]] = []
#: what the in-memory "service" of ``kit.pay`` did: payments by idempotency key
PAYMENTS: list[dict[str, Any]] = []
#: failures a body raises before it succeeds: name -> exceptions left
FAILS: dict[str, list[BaseException]] = {}


def reset() -> None:
    SEEN.clear()
    PAYMENTS.clear()
    FAILS.clear()


def seen(what: str) -> Any:
    SEEN.append((what, clock.now()))
    failures = FAILS.get(what)
    if failures:
        raise failures.pop(0)
    return what


def _find_payment(params: dict[str, Any], *, idempotency_key: str) -> Any:
    found = [p for p in PAYMENTS if p["key"] == idempotency_key]
    return found[0] if found else NOT_FOUND


@durable.tool(name="kit.pay", safety="unsafe_write", reconcile=_find_payment)
def pay(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Pays ``amount``: not deduplicated (a second call is a second payment)."""
    seen("pay")
    payment = {"id": f"pay_{len(PAYMENTS) + 1}", "amount": amount, "key": idempotency_key}
    PAYMENTS.append(payment)
    return payment


@durable.tool(name="kit.lookup", safety="read_only", rate_limit="1/h")
def lookup(n: int) -> int:
    """A read admitted once an hour across every run."""
    seen(f"lookup{n}")
    return n


@durable.tool(name="kit.blind_write", safety="unsafe_write", retry=RetryPolicy(max_attempts=1))
def blind_write(value: str, *, idempotency_key: str) -> str:
    """A write whose outcome cannot be looked up: a timeout leaves it unknown."""
    seen("blind_write")
    raise durable.AmbiguousOutcomeError("the connection dropped after the request was sent")


@durable.workflow(name="kit.pay_and_receipt", version="1")
def pay_and_receipt(ctx, data):
    payment = ctx.call_tool("kit.pay", {"amount": data["amount"]})
    receipt = ctx.step("receipt", seen, "receipt")
    return {"payment": payment["id"], "receipt": receipt}


@durable.workflow(name="kit.three_days", version="1")
def three_days(ctx, data):
    ctx.step("before", seen, "before")
    ctx.sleep(timedelta(days=3))
    return ctx.step("after", seen, "after")


#: a retry stored on the run (10 minutes later) and one slept in place (2 s)
STORED = RetryPolicy(
    max_attempts=3, initial_interval=600, max_interval=600, backoff_coefficient=1, jitter=False
)
IN_PLACE = RetryPolicy(max_attempts=3, initial_interval=2, backoff_coefficient=1, jitter=False)


@durable.workflow(name="kit.retries", version="1")
def retries(ctx, data):
    ctx.step("flaky_stored", seen, "flaky_stored", retry=STORED)
    return ctx.step("flaky_in_place", seen, "flaky_in_place", retry=IN_PLACE)


@durable.workflow(name="kit.lookups", version="1")
def lookups(ctx, data):
    return [ctx.call_tool("kit.lookup", {"n": n}) for n in range(3)]


@durable.workflow(name="kit.tick", version="1")
def tick(ctx, data):
    return ctx.step("tick", seen, "tick")


@durable.workflow(name="kit.signal", version="1")
def signalled(ctx, data):
    return ctx.wait_for_signal("go", timeout=timedelta(days=1), default="timed out")


@durable.workflow(name="kit.approval", version="1")
def approval(ctx, data):
    decision = ctx.wait_for_approval(
        "ship", title="Ship it?", payload={"qty": 1}, allow_edit=True, timeout=3600
    )
    return {"approved": decision.approved, "edited": decision.edited}


@durable.workflow(name="kit.two_approvers", version="1")
def two_approvers(ctx, data):
    decision = ctx.wait_for_approval("wire", title="Wire it?", required=2, four_eyes=True)
    return {"approved": decision.approved, "decided_by": list(decision.decided_by)}


@durable.workflow(name="kit.blind", version="1")
def blind(ctx, data):
    return ctx.call_tool("kit.blind_write", {"value": "x"})


@durable.workflow(name="kit.chat", version="1")
def chat(ctx, data):
    reply = ctx.llm([{"role": "user", "content": data["ask"]}], stream=data.get("stream", False))
    if isinstance(reply, durable.ModelRecoverable):
        return {"recoverable": reply.error_type}
    return {"content": reply["content"], "calls": [c["name"] for c in reply["tool_calls"]]}
