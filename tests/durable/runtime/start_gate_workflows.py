"""Workflows and tools of the start-gate tests (tests/durable/runtime/test_start_gate.py):
paths where a body would start after a wait since the fence that authorized it (a
parallel group's queued call, a retry after its backoff).

Importing this module registers them. ``BODIES`` lists the labels of the bodies that
began, in order; ``CANCELLED`` is set once a body's cancel committed.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import durable
from durable import RetryPolicy, TransientError

BODIES: list[str] = []
CANCELLED = threading.Event()
_lock = threading.Lock()

#: the backoff of ``gate.retry``'s step (seconds): the tests recognise its sleep by it
BACKOFF = 0.777


def reset() -> None:
    BODIES.clear()
    CANCELLED.clear()


def _began(label: str) -> None:
    with _lock:
        BODIES.append(label)


@durable.tool(safety="read_only")
def gate_lookup(
    label: str, cancel: bool = False, hold: bool = False, *, idempotency_key: str
) -> str:
    """A read-only tool whose body may cancel its own run (an operator's cancel while
    the body runs), or ``hold`` until such a cancel committed."""
    _began(label)
    if cancel:
        durable.cancel(idempotency_key.partition(":")[0], reason="S30")
        CANCELLED.set()
    if hold and not CANCELLED.wait(timeout=30):
        raise AssertionError(f"{label}: the cancel never came")
    return f"{label}-done"


def _call(label: str, **flags: bool) -> dict[str, Any]:
    args = json.dumps({"label": label, **flags})
    return {"id": f"call-{label}", "function": {"name": "gate_lookup", "arguments": args}}


@durable.workflow(name="gate.s30", version="1")
def s30(ctx, data):
    """S30: a model turn's three read-only tool calls, ``max_concurrency`` at a time; the
    first one's body is cancelled under it (with two threads, the second holds its
    thread until then, so the third is queued behind them when the cancel commits)."""
    width = data.get("max_concurrency", 1)
    turn = [_call("first", cancel=True), _call("second", hold=width > 1), _call("third")]
    return ctx.run_tool_calls(turn, max_concurrency=width)


def _fails_once(label: str) -> str:
    _began(label)
    if BODIES.count(label) == 1:
        raise TransientError("the provider is busy")
    return f"{label}-done"


@durable.workflow(name="gate.retry", version="1")
def retry(ctx, data):
    """A step that fails transiently once and is retried after an in-process backoff."""
    policy = RetryPolicy(max_attempts=3, initial_interval=BACKOFF, jitter=False)
    if data.get("pooled"):
        return ctx.parallel([durable.call(_fails_once, "flaky", retry=policy)])
    return ctx.step("flaky", _fails_once, "flaky", retry=policy)
