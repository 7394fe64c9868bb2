"""Fixture workflows and tools of the compensation, fork-ownership and token-budget tests
(S22, S23, S27). Importing this module registers them.

``PROVIDER`` is a fake payment provider keyed by idempotency key: ``refunds`` (what was
committed), ``voids`` (what was undone, once per key) and ``slow`` (a refund that commits
after ``commit_after`` seconds and answers ``answer_after`` seconds after it started, or
raises ``ConnectionResetError`` after committing when ``reset`` is set). Tests steer it
through :data:`PROVIDER` and :func:`reset`.

``LLM`` is a fake OpenAI client: each request bills the next ``(total_tokens, content)``
of ``LLM["replies"]`` and is appended to ``LLM["billed"]``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import durable
from durable import RetryPolicy

ONCE = RetryPolicy(max_attempts=1)

PROVIDER: dict[str, Any] = {}
LLM: dict[str, Any] = {}


def reset() -> None:
    PROVIDER.clear()
    PROVIDER.update(
        refunds={},
        voids=[],
        slow={},
        started=threading.Event(),
        committed=threading.Event(),
        lock=threading.Lock(),
    )
    LLM.clear()
    LLM.update(replies=[], billed=[])


reset()


def void_refund(params: dict[str, Any], result: Any, *, idempotency_key: str) -> dict[str, Any]:
    """Compensation of a refund: void it (once per refund, whatever the retries)."""
    with PROVIDER["lock"]:
        refund_id = (result or {}).get("id")
        if refund_id not in [v["refund"] for v in PROVIDER["voids"]]:
            PROVIDER["voids"].append({"refund": refund_id, "key": idempotency_key})
    return {"voided": refund_id}


def _commit(params: dict[str, Any], key: str) -> dict[str, Any]:
    with PROVIDER["lock"]:
        refund = PROVIDER["refunds"].setdefault(
            key,
            {
                "id": f"re_{len(PROVIDER['refunds']) + 1}",
                "charge": params["charge"],
                "amount": params["amount"],
            },
        )
    return dict(refund)


@durable.tool(
    name="comp.refund",
    safety="unsafe_write",
    compensate=void_refund,
    retry=ONCE,
    requires_approval=False,
)
def refund(charge: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """A refund; the charge named in ``PROVIDER["slow"]`` is slow (see the module doc)."""
    slow = PROVIDER["slow"].get(charge)
    if slow is None:
        return _commit({"charge": charge, "amount": amount}, idempotency_key)
    PROVIDER["started"].set()
    time.sleep(slow["commit_after"])
    out = _commit({"charge": charge, "amount": amount}, idempotency_key)
    PROVIDER["committed"].set()
    time.sleep(max(0.0, slow["answer_after"] - slow["commit_after"]))
    if slow.get("reset"):
        raise ConnectionResetError("connection reset by peer after the request was sent")
    return out


@durable.tool(
    name="comp.email",
    safety="unsafe_write",
    retry=ONCE,
    requires_approval=False,
    reconcile=lambda params, *, idempotency_key: durable.NOT_FOUND,
)
def email(to: str, *, idempotency_key: str) -> dict[str, Any]:
    """An email; ``PROVIDER["smtp_550"]`` makes the server refuse it permanently."""
    if PROVIDER.get("smtp_550"):
        raise durable.PermanentError("SMTP 550 mailbox unavailable")
    return {"message_id": f"<{idempotency_key}@example>"}


@durable.workflow(name="comp.s22", version="1")
def s22(ctx, data):
    """S22: refund_a, then refund_b (slow at the provider)."""
    a = ctx.call_tool("comp.refund", {"charge": "ch_a", "amount": 10}, step_id="refund_a")
    b = ctx.call_tool("comp.refund", {"charge": "ch_b", "amount": 20}, step_id="refund_b")
    return {"a": a["id"], "b": b["id"]}


@durable.workflow(name="comp.s23", version="1")
def s23(ctx, data):
    """S23: refund, then email the customer."""
    r = ctx.call_tool("comp.refund", {"charge": data["charge"], "amount": 10}, step_id="refund")
    sent = ctx.call_tool("comp.email", {"to": "ann@example.com"}, step_id="email")
    return {"refund": r["id"], "email": sent["message_id"]}


# --------------------------------------------------------------------------- LLM


class _Completions:
    def create(self, **kwargs: Any) -> dict[str, Any]:
        tokens, content = LLM["replies"].pop(0)
        LLM["billed"].append(tokens)
        reply: dict[str, Any] = {
            "model": kwargs.get("model") or "fake",
            "usage": {
                "prompt_tokens": tokens // 2,
                "completion_tokens": tokens - tokens // 2,
                "total_tokens": tokens,
            },
        }
        if content is not None:
            reply["choices"] = [
                {"message": {"content": content, "tool_calls": None}, "finish_reason": "stop"}
            ]
        else:
            reply["choices"] = []  # billed, yet unusable
        return reply


class FakeClient:
    class chat:  # mirrors openai.OpenAI().chat.completions
        completions = _Completions()


@durable.workflow(name="comp.s27", version="1")
def s27(ctx, data):
    """S27: ask the model up to ``n`` times."""
    answers = []
    for _ in range(data.get("n", 5)):
        answers.append(ctx.llm([{"role": "user", "content": "hi"}], step_id="ask")["content"][:20])
    return answers


#: calls of the workflow function and of the compensation hook of comp.slow_void
SLOW_VOID: dict[str, int] = {"workflow": 0, "hook": 0}


def flaky_void(params: dict[str, Any], result: Any, *, idempotency_key: str) -> dict[str, Any]:
    """A compensation hook whose provider is down at the first try."""
    SLOW_VOID["hook"] += 1
    if SLOW_VOID["hook"] == 1:
        raise ConnectionResetError("void endpoint reset the connection")
    return {"voided": (result or {}).get("id")}


@durable.tool(
    name="comp.slow_void_refund",
    safety="unsafe_write",
    compensate=flaky_void,
    requires_approval=False,
    # the second try of the hook is due later than an in-process wait
    retry=RetryPolicy(max_attempts=3, initial_interval=60.0, jitter=False),
)
def slow_void_refund(charge: str, *, idempotency_key: str) -> dict[str, Any]:
    return {"id": f"re_{charge}"}


@durable.workflow(name="comp.slow_void", version="1")
def slow_void(ctx, data):
    SLOW_VOID["workflow"] += 1
    ctx.call_tool("comp.slow_void_refund", {"charge": "ch_1"}, step_id="refund")
    raise durable.PermanentError("the order was rejected after the refund")


def find_charge(params: dict[str, Any], *, idempotency_key: str) -> Any:
    """Reconcile of ``comp.charge``: the provider's object for the key, if committed."""
    found = PROVIDER["refunds"].get(idempotency_key)
    return dict(found) if found is not None else durable.NOT_FOUND


@durable.tool(
    name="comp.charge",
    safety="idempotent_write",
    compensate=void_refund,
    reconcile=find_charge,
    # no jitter: full jitter would draw a delay in [0, 60] s, and one under
    # INPROCESS_RETRY_MAX_SECONDS is retried in the worker, not stored (1 run in 12)
    retry=RetryPolicy(max_attempts=3, initial_interval=60, jitter=False),
)
def charge(charge: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """An idempotent write; ``PROVIDER["reset_after_commit"]`` commits it, then resets
    the connection (the client cannot know it happened); ``PROVIDER["refused"]`` fails
    it before it was sent (a connection refused)."""
    if PROVIDER.pop("refused", False):
        raise ConnectionRefusedError(111, "Connection refused")
    committed = _commit({"charge": charge, "amount": amount}, idempotency_key)
    if PROVIDER.pop("reset_after_commit", False):
        raise ConnectionResetError(104, "Connection reset by peer")
    return committed


@durable.workflow(name="comp.charge_once", version="1")
def charge_once(ctx, data):
    """One idempotent write (its retry is a minute away: stored, not in the worker)."""
    return ctx.call_tool("comp.charge", {"charge": "ch_c", "amount": 500})
