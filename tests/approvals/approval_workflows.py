"""Fixture workflows of the waits / approvals / cancellation / compensation tests.

Everything a body or hook does is appended to :data:`CALLS` as ``(label, run_id, ...)``
so a test can count how often a body ran for one run (``calls("b", run_id)``). The
``apf.proc_*`` workflows run in real worker processes: they also write one JSON line per
body to ``$CRASH_TEST_DIR/waits_invocations.jsonl`` (see ``tests/crash_workflows.py``).

Switches (module-level sets/dicts) make a body or hook fail on purpose; tests reset them
through the ``reset`` fixture of ``tests/approvals/conftest.py``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import durable

#: (label, run_id, *extra) for every body / hook entered
CALLS: list[tuple[Any, ...]] = []
#: monotonic start times of the S04 loops' bodies: (run_id, index, t, "step" or "write")
STARTS: list[tuple[str, int, float, str]] = []
#: external effects of the compensation hooks, keyed by idempotency key (a deduping API)
REFUNDS: dict[str, str] = {}

#: labels of charges whose compensation fails permanently
FAIL_UNDO: set[str] = set()
#: labels of charges whose compensation "kills the worker" (a BaseException) once
CRASH_UNDO: set[str] = set()
#: how many more times the step "b" of apf.resume fails (transiently)
B_FAILURES = {"left": 0}

_lock = threading.Lock()


def reset() -> None:
    CALLS.clear()
    STARTS.clear()
    REFUNDS.clear()
    FAIL_UNDO.clear()
    CRASH_UNDO.clear()
    B_FAILURES["left"] = 0


def record(label: str, run_id: str, *extra: Any) -> None:
    with _lock:
        CALLS.append((label, run_id, *extra))
    folder = os.environ.get("CRASH_TEST_DIR")
    if folder and os.environ.get("APF_RECORD_FILE"):
        from tests.crash_workflows import append_jsonl

        append_jsonl(
            Path(folder) / "waits_invocations.jsonl",
            {"label": label, "run": run_id, "pid": os.getpid(), "t": time.time()},
        )


def calls(label: str, run_id: str | None = None) -> int:
    return sum(1 for c in CALLS if c[0] == label and (run_id is None or c[1] == run_id))


def body(label: str):
    """A step body that records ``label`` for the run and returns it."""

    def fn(run_id: str) -> str:
        record(label, run_id)
        return label

    fn.__name__ = fn.__qualname__ = f"body_{label}"
    return fn


class WorkerDied(BaseException):
    """Stands in for a worker dying inside a hook (not an ``Exception``: the engine lets
    it propagate and the lease expires into recovery)."""


# -------------------------------------------------------------------------- tools


@durable.tool(name="apf.send", safety="unsafe_write", requires_approval=True)
def apf_send(to: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    """An unsafe write that needs an approval (four-eyes applies)."""
    record("apf.send", idempotency_key.split(":")[0], to, body)
    return {"sent": to, "body": body}


@durable.tool(
    name="apf.post",
    safety="idempotent_write",
    requires_approval=True,
    allow_edit=True,
    approver_group="editors",
)
def apf_post(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """An approved write whose parameters the approver (group "editors") may edit."""
    record("apf.post", idempotency_key.split(":")[0], text)
    return {"posted": text}


def _undo_charge(params: dict[str, Any], result: Any, *, idempotency_key: str) -> str:
    label = params["label"]
    run_id = idempotency_key.split(":")[0]
    record("undo", run_id, label, idempotency_key)
    if label in CRASH_UNDO:
        CRASH_UNDO.discard(label)
        raise WorkerDied(f"worker died while undoing {label}")
    if label in FAIL_UNDO:
        raise durable.PermanentError(f"refund of {label} refused by the bank")
    REFUNDS.setdefault(idempotency_key, label)
    return f"refunded {label}"


@durable.tool(name="apf.charge", safety="idempotent_write", compensate=_undo_charge)
def apf_charge(label: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    record("charge", idempotency_key.split(":")[0], label)
    return {"charge": label, "amount": amount}


# ---------------------------------------------------------------------- approvals


@durable.workflow(name="apf.approve", version="1")
def approve_flow(ctx, data):
    """One approval wait whose options come from the input; returns the Decision."""
    options = {
        k: data[k]
        for k in (
            "approvers",
            "timeout",
            "on_timeout",
            "escalate_to",
            "required",
            "allow_edit",
            "four_eyes",
        )
        if k in data
    }
    decision = ctx.wait_for_approval(
        "ok", title=data.get("title", "Approve"), payload=data.get("payload"), **options
    )
    ctx.step("after", body("after"), ctx.run_id)
    return decision.to_dict()


@durable.tool(
    name="apf.wire",
    safety="idempotent_write",
    requires_approval=True,
    approvals_required=2,
    approval_timeout=3600,
)
def apf_wire(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """A write two people must approve within an hour (else it is rejected)."""
    record("apf.wire", idempotency_key.split(":")[0], amount)
    return {"wired": amount}


@durable.workflow(name="apf.tool_wire", version="1")
def tool_wire_flow(ctx, data):
    result = ctx.call_tool("apf.wire", {"amount": data["amount"]})
    if isinstance(result, durable.ModelRecoverable):
        return {"error": result.message, "type": result.error_type, "details": result.details}
    return {"result": result}


@durable.workflow(name="apf.tool_send", version="1")
def tool_send_flow(ctx, data):
    result = ctx.call_tool("apf.send", {"to": data["to"], "body": "hello"})
    if isinstance(result, durable.ModelRecoverable):
        return {"error": result.message, "type": result.error_type, "details": result.details}
    return {"result": result}


@durable.workflow(name="apf.tool_post", version="1")
def tool_post_flow(ctx, data):
    result = ctx.call_tool("apf.post", {"text": data["text"]})
    if isinstance(result, durable.ModelRecoverable):
        return {"error": result.message}
    return {"result": result}


@durable.workflow(name="apf.s09", version="1")
def s09_flow(ctx, data):
    """Two approvals, then a counted side effect: one answer must not answer both (S09)."""
    budget = ctx.wait_for_approval("approve_budget", title="Approve the budget")
    if not budget:
        return "no budget"
    send = ctx.wait_for_approval("approve_send", title="Approve sending")
    if not send:
        return "not sent"
    ctx.step("send_email", body("send_email"), ctx.run_id)
    return "sent"


# ------------------------------------------------------------------------- timers


@durable.workflow(name="apf.sleep", version="1")
def sleep_flow(ctx, data):
    ctx.step("a", body("a"), ctx.run_id)
    ctx.sleep(data["seconds"])
    ctx.step("b", body("b"), ctx.run_id)
    return "done"


@durable.workflow(name="apf.sleep_until", version="1")
def sleep_until_flow(ctx, data):
    ctx.sleep_until(data["when"])
    ctx.step("b", body("b"), ctx.run_id)
    return "done"


@durable.workflow(name="apf.sleep_naive", version="1")
def sleep_naive_flow(ctx, data):
    try:
        ctx.sleep_until(data["when"])
    except ValueError as exc:
        return {"error": "ValueError", "message": str(exc)}
    return {"error": None}


@durable.workflow(name="apf.sleep_loop", version="1")
def sleep_loop_flow(ctx, data):
    for _i in range(data["n"]):
        ctx.sleep(data["seconds"])
        ctx.step("tick", body("tick"), ctx.run_id)
    return "done"


# ------------------------------------------------------------------------ signals


@durable.workflow(name="apf.signal", version="1")
def signal_flow(ctx, data):
    got = ctx.wait_for_signal("go", timeout=data.get("timeout"), default="timed out")
    ctx.step("after", body("after"), ctx.run_id)
    return {"got": got}


@durable.workflow(name="apf.signal_loop", version="1")
def signal_loop_flow(ctx, data):
    return [ctx.wait_for_signal("go") for _ in range(data["n"])]


# -------------------------------------------------------------------- cancellation


@durable.workflow(name="apf.charge_then_wait", version="1")
def charge_then_wait_flow(ctx, data):
    ctx.call_tool("apf.charge", {"label": "a", "amount": 10}, step_id="charge_a")
    ctx.wait_for_approval("go_on", title="Go on?")
    ctx.step("after", body("after"), ctx.run_id)
    return "done"


@durable.workflow(name="apf.retrying", version="1")
def retrying_flow(ctx, data):
    ctx.step(
        "flaky",
        _always_transient,
        ctx.run_id,
        retry=durable.RetryPolicy(max_attempts=5, initial_interval=3600, jitter=False),
    )
    return "done"


def _always_transient(run_id: str) -> None:
    record("flaky", run_id)
    raise durable.TransientError("503 from upstream")


@durable.workflow(name="apf.self_cancel", version="1")
def self_cancel_flow(ctx, data):
    """Step "a" cancels its own run, then returns (or fails): the late result."""
    ctx.call_tool("apf.charge", {"label": "a", "amount": 10}, step_id="charge_a")
    first = ctx.step(
        "a",
        _cancel_then,
        ctx.run_id,
        data["outcome"],
        retry=durable.RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False),
    )
    ctx.step("b", body("b"), ctx.run_id)
    return first


def _cancel_then(run_id: str, outcome: str) -> str:
    record("a", run_id)
    durable.cancel(run_id, by="self", reason="cancel while the step runs")
    if outcome == "permanent":
        raise durable.PermanentError("late failure")
    if outcome == "transient":
        raise durable.TransientError("late transient failure")
    return "late result"


@durable.workflow(name="apf.cancel_between", version="1")
def cancel_between_flow(ctx, data):
    """An operator's cancel commits between two steps, with no time passing in between
    (orchestration code calls the service itself, deterministically)."""
    ctx.step("a", body("a"), ctx.run_id)
    durable.cancel(ctx.run_id, by="operator", reason="between two steps")
    ctx.step("b", body("b"), ctx.run_id)
    ctx.step("c", body("c"), ctx.run_id)
    return "unreachable"


@durable.workflow(name="apf.cancel_before_write", version="1")
def cancel_before_write_flow(ctx, data):
    """An operator's cancel commits between a step and a write (no time in between)."""
    ctx.step("a", body("a"), ctx.run_id)
    durable.cancel(ctx.run_id, by="operator", reason="before a write")
    ctx.call_tool("apf.charge", {"label": "x", "amount": 1})
    return "unreachable"


# -------------------------------------------------------------------- compensation


@durable.workflow(name="apf.charges_then_fail", version="1")
def charges_then_fail_flow(ctx, data):
    for label, amount in (("a", 10), ("b", 20), ("c", 30)):
        ctx.call_tool("apf.charge", {"label": label, "amount": amount}, step_id=f"charge_{label}")
    ctx.step("boom", _boom, ctx.run_id, retry=durable.RetryPolicy(max_attempts=1))
    return "unreachable"


def _boom(run_id: str) -> None:
    record("boom", run_id)
    raise durable.PermanentError("card declined")


# ---------------------------------------------------------------- resume and fork


@durable.workflow(name="apf.resume", version="1")
def resume_flow(ctx, data):
    a = ctx.step("a", body("a"), ctx.run_id)
    b = ctx.step(
        "b",
        _flaky_b,
        ctx.run_id,
        retry=durable.RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False),
    )
    c = ctx.step("c", body("c"), ctx.run_id)
    return [a, b, c]


def _flaky_b(run_id: str) -> str:
    record("b", run_id)
    with _lock:
        if B_FAILURES["left"] > 0:
            B_FAILURES["left"] -= 1
            raise durable.TransientError("upstream 503")
    return "b"


@durable.workflow(name="apf.simple", version="1")
def simple_flow(ctx, data):
    ctx.step("a", body("a"), ctx.run_id)
    ctx.step("b", body("b"), ctx.run_id)
    return "done"


# --------------------------------------------------------------------------- races


@durable.workflow(name="apf.loop", version="1")
def loop_flow(ctx, data):
    """A loop of short steps (``data["ms"]`` milliseconds each) to cancel at random (S04)."""
    for i in range(data["n"]):
        ctx.step("tick", _tick, ctx.run_id, i, data["ms"])
    return data["n"]


def _tick(run_id: str, i: int, ms: int) -> int:
    STARTS.append((run_id, i, time.monotonic(), "step"))
    time.sleep(ms / 1000.0)
    return i


@durable.tool(name="apf.tick_write", safety="unsafe_write")
def apf_tick_write(i: int, ms: int, *, idempotency_key: str) -> int:
    """An unsafe write of the S04 write loop (no approval): records when its body began."""
    STARTS.append((idempotency_key.split(":")[0], i, time.monotonic(), "write"))
    time.sleep(ms / 1000.0)
    return i


@durable.workflow(name="apf.write_loop", version="1")
def write_loop_flow(ctx, data):
    """Short plain steps and unsafe writes in turn, to cancel at random (S04, writes)."""
    for i in range(data["n"]):
        if i % 2:
            ctx.call_tool("apf.tick_write", {"i": i, "ms": data["ms"]}, step_id="w")
        else:
            ctx.step("tick", _tick, ctx.run_id, i, data["ms"])
    return data["n"]


# ------------------------------------------------------------ real worker processes


@durable.workflow(name="apf.proc_sleep", version="1")
def proc_sleep_flow(ctx, data):
    """A, a durable sleep, B -- in real worker processes, the sleep falling due while no
    worker is up (S07)."""
    ctx.step("A", body("A"), ctx.run_id)
    ctx.sleep(data["seconds"])
    ctx.step("B", body("B"), ctx.run_id)
    return "done"


@durable.workflow(name="apf.proc_approval", version="1")
def proc_approval_flow(ctx, data):
    ctx.step("A", body("A"), ctx.run_id)
    decision = ctx.wait_for_approval("go", title="Go on after the crash?")
    ctx.step("B", body("B"), ctx.run_id)
    return decision.to_dict()


# ------------------------------------------------------------ requesters and signals


@durable.workflow(name="apf.named_requester", version="1")
def named_requester_flow(ctx, data):
    """A four-eyes approval that names the person it is for (as the reference procurement
    workflow names the purchase's requester)."""
    decision = ctx.wait_for_approval(
        "purchase", title="Buy it?", four_eyes=True, requesters=[data["requester"]]
    )
    return decision.to_dict()


@durable.workflow(name="apf.goods", version="1")
def goods_flow(ctx, data):
    """Wait on ``goods_received`` with a (2 s) timeout, for misaddressed signals (S21)."""
    goods = ctx.wait_for_signal("goods_received", timeout=data.get("timeout", 2.0), default=None)
    return {"goods": goods}
