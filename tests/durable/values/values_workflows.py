"""Fixture workflows and tools for the value-storage and duration tests.

Importing this module registers them. Tests steer them through module-level state that
:func:`reset` clears: ``RAISE[label]`` is a list of exceptions a body raises, one per
call; ``RETURN[label]`` is the value a body returns (any object, storable or not);
``CALLS`` counts body calls; ``SEEN`` records what the workflow saw.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import durable
from durable import RetryPolicy

CALLS: Counter[str] = Counter()
RAISE: dict[str, list[BaseException]] = {}
RETURN: dict[str, Any] = {}
SEEN: list[tuple[str, Any]] = []
EFFECTS: list[str] = []

FAST = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
ONCE = RetryPolicy(max_attempts=1, initial_interval=0.01, jitter=False)


def reset() -> None:
    CALLS.clear()
    RAISE.clear()
    RETURN.clear()
    SEEN.clear()
    EFFECTS.clear()


def body(label: str) -> Any:
    CALLS[label] += 1
    plan = RAISE.get(label)
    if plan:
        raise plan.pop(0)
    return RETURN.get(label)


@durable.tool(name="values_lookup", safety="read_only", retry=FAST)
def values_lookup(q: str = "") -> Any:
    """A read-only tool that raises what ``RAISE["lookup"]`` says."""
    return body("lookup")


@durable.tool(name="values_refund", safety="unsafe_write", retry=ONCE)
def values_refund(amount: int, *, idempotency_key: str) -> Any:
    """An unsafe write: the effect happens, then it returns ``RETURN["refund"]``."""
    EFFECTS.append(idempotency_key)
    return body("refund")


@durable.tool(name="values_upsert", safety="idempotent_write", retry=ONCE)
def values_upsert(name: str, *, idempotency_key: str) -> Any:
    """An idempotent write returning ``RETURN["upsert"]``."""
    EFFECTS.append(idempotency_key)
    return body("upsert")


@durable.workflow(name="values.lookup", version="1")
def lookup(ctx, data):
    value = ctx.call_tool("values_lookup", {"q": "x"})
    SEEN.append(("lookup", value))
    return value


@durable.workflow(name="values.refund", version="1")
def refund(ctx, data):
    value = ctx.call_tool("values_refund", {"amount": 5})
    SEEN.append(("refund", value))
    return {"refund": value}


@durable.workflow(name="values.upsert", version="1")
def upsert(ctx, data):
    value = ctx.call_tool("values_upsert", {"name": "n"})
    SEEN.append(("upsert", value))
    return {"upsert": value}


@durable.workflow(name="values.step", version="1")
def step(ctx, data):
    """One step ``data["label"]`` (policy ``data["policy"]``: "once" or "fast")."""
    policy = ONCE if (data or {}).get("policy", "once") == "once" else FAST
    value = ctx.step(data["label"], body, data["label"], retry=policy)
    SEEN.append(("step", value))
    if isinstance(value, durable.ModelRecoverable):
        return {"message": value.message, "details": value.details}
    return value


@durable.workflow(name="values.echo", version="1")
def echo(ctx, data):
    """Returns its input through a step (the step's output is the input)."""
    return ctx.step("echo", lambda v: v, data)


@durable.workflow(name="values.signal", version="1")
def signal(ctx, data):
    return ctx.wait_for_signal("go")


def _reconcile_refund(params: dict[str, Any], *, idempotency_key: str) -> Any:
    return RETURN.get("reconciled", durable.NOT_FOUND)


@durable.tool(
    name="values_refund_reconciled", safety="unsafe_write", retry=ONCE, reconcile=_reconcile_refund
)
def values_refund_reconciled(amount: int, *, idempotency_key: str) -> Any:
    """An unsafe write with a reconcile hook that returns ``RETURN["reconciled"]``."""
    EFFECTS.append(idempotency_key)
    return body("refund")


@durable.workflow(name="values.refund_reconciled", version="1")
def refund_reconciled(ctx, data):
    value = ctx.call_tool("values_refund_reconciled", {"amount": 5})
    SEEN.append(("refund", value))
    return {"refund": value}


# --- durations ---------------------------------------------------------------------------


class Response429:
    def __init__(self, retry_after: str) -> None:
        self.status_code = 429
        self.headers = {"Retry-After": retry_after}


class RateLimited(Exception):
    """Shaped like ``httpx.HTTPStatusError`` for a 429 with a ``Retry-After``."""

    def __init__(self, retry_after: str) -> None:
        super().__init__(f"429 Too Many Requests (Retry-After: {retry_after})")
        self.response = Response429(retry_after)


@durable.tool(name="values_provider", safety="read_only", retry=FAST)
def values_provider(q: str = "") -> Any:
    """A read-only provider call that raises what ``RAISE["provider"]`` says."""
    return body("provider")


@durable.workflow(name="values.provider", version="1")
def provider(ctx, data):
    return ctx.call_tool("values_provider", {"q": "x"})


@durable.workflow(name="values.sleep", version="1")
def sleep(ctx, data):
    ctx.sleep(data["seconds"])
    return "woke"


@durable.workflow(name="values.sleep_until", version="1")
def sleep_until(ctx, data):
    import datetime as dt

    ctx.sleep_until(dt.datetime.fromisoformat(data["when"]))
    return "woke"


@durable.workflow(name="values.approval", version="1")
def approval(ctx, data):
    return ctx.wait_for_approval("ok", title="ok?", timeout=data["timeout"]).approved


@durable.workflow(name="values.signal_timeout", version="1")
def signal_timeout(ctx, data):
    return ctx.wait_for_signal("go", timeout=data["timeout"], default="none")


@durable.workflow(name="values.step_timeout", version="1")
def step_timeout(ctx, data):
    return ctx.step("slow", body, "slow", timeout=data["timeout"])


@durable.workflow(name="values.approval_edit", version="1")
def approval_edit(ctx, data):
    decision = ctx.wait_for_approval("edit", title="edit?", payload=data, allow_edit=True)
    return {"approved": decision.approved, "comment": decision.comment, "edited": decision.edited}


@durable.workflow(name="values.raise", version="1")
def raise_(ctx, data):
    """Step ``boom`` raises ``RAISE["boom"]``'s next exception once (no retry)."""
    value = ctx.step("boom", body, "boom", retry=ONCE)
    if isinstance(value, durable.ModelRecoverable):
        return {"message": value.message, "type": value.error_type, "details": value.details}
    return value


@durable.workflow(name="values.named_steps", version="1")
def named_steps(ctx, data):
    """``data["times"]`` steps named ``data["sid"]`` (ids ``sid``, ``sid#2``, ...)."""
    return [ctx.step(data["sid"], body, "named") for _ in range(data.get("times", 1))]
