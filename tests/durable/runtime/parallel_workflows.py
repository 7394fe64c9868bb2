"""Workflows and tools of the parallel-group tests (tests/durable/runtime/test_parallel.py).

Importing this module registers them. Tests steer them through module-level state:
``FAILS`` (label -> exceptions raised by the next calls), ``FLAGS``; they read
``CALLS`` (label -> bodies entered), ``ORDER`` (labels in the order bodies began),
``THREADS`` (label -> thread name) and ``PEAK`` (most bodies running at once).
``FLAGS["await"]`` (label -> labels) holds a body until those bodies have begun, so a
test can order calls of one group by a condition rather than by the pool's timing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import durable
from durable import RetryPolicy

CALLS: Counter[str] = Counter()
FAILS: dict[str, list[BaseException]] = {}
FLAGS: dict[str, Any] = {}
ORDER: list[str] = []
THREADS: dict[str, str] = {}
_lock = threading.Condition()
_running = [0]
PEAK = [0]

FAST = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
SLOW = RetryPolicy(max_attempts=3, initial_interval=60.0, jitter=False)
ONCE = RetryPolicy(max_attempts=1, initial_interval=0.01, jitter=False)


def reset() -> None:
    CALLS.clear()
    FAILS.clear()
    FLAGS.clear()
    ORDER.clear()
    THREADS.clear()
    _running[0] = 0
    PEAK[0] = 0


def work(label: str, seconds: float = 0.0, value: Any = None) -> Any:
    """A step body: counts itself, sleeps ``seconds``, fails as ``FAILS`` says."""
    with _lock:
        CALLS[label] += 1
        ORDER.append(label)
        THREADS[label] = threading.current_thread().name
        _running[0] += 1
        PEAK[0] = max(PEAK[0], _running[0])
        _lock.notify_all()
        awaited = FLAGS.get("await", {}).get(label, ())
        if not _lock.wait_for(lambda: all(CALLS[a] for a in awaited), timeout=30.0):
            raise AssertionError(f"{label}: {awaited} never began")
    try:
        if seconds:
            time.sleep(seconds)
        pending = FAILS.get(label)
        if pending:
            raise pending.pop(0)
        return value if value is not None else f"{label}-done"
    finally:
        with _lock:
            _running[0] -= 1


def lose_lease(label: str) -> str:
    """A body that makes the execution's lease lost (as another worker's claim would)."""
    work(label)
    for handle in FLAGS.get("heartbeats", []):
        handle.lost = True
    return label


def cancel_run(label: str, *, idempotency_key: str) -> str:
    """A body during which an operator cancels the run."""
    work(label)
    durable.cancel(idempotency_key.partition(":")[0], reason="test")
    return label


@durable.workflow(name="par.interrupted", version="1")
def interrupted(ctx, data):
    """``data["how"]``: ``"lease"`` or ``"cancel"``, by the group's second call."""
    body = lose_lease if data["how"] == "lease" else cancel_run
    return ctx.parallel(
        [durable.call(work, "slow", 0.6), durable.call(body, "mid"), durable.call(work, "last")]
    )


@durable.tool(safety="read_only")
def par_read(label: str, seconds: float = 0.0) -> Any:
    return work(label, seconds)


@durable.tool(safety="idempotent_write", retry=FAST)
def par_write(label: str, *, idempotency_key: str) -> dict[str, Any]:
    work(label)
    return {"label": label, "key": idempotency_key}


@durable.tool(safety="idempotent_write", requires_approval=True, retry=FAST)
def par_guarded_write(label: str, *, idempotency_key: str) -> dict[str, Any]:
    work(label)
    return {"label": label, "key": idempotency_key}


def _policy(data: dict[str, Any]) -> RetryPolicy:
    return {"fast": FAST, "slow": SLOW, "once": ONCE}[data.get("policy", "fast")]


@durable.workflow(name="par.steps", version="1")
def steps(ctx, data):
    """``data``: ``labels``, ``seconds`` (label -> sleep), ``max``, ``policy``, ``ids``
    (label -> explicit step id), ``groups`` (how many groups), ``after`` (a step after)."""
    out = []
    for _ in range(data.get("groups", 1)):
        calls = [
            durable.call(
                work,
                label,
                data.get("seconds", {}).get(label, 0.0),
                step_id=data.get("ids", {}).get(label),
                retry=_policy(data),
            )
            for label in FLAGS.get("labels", data["labels"])
        ]
        out.append(ctx.parallel(calls, max_concurrency=data.get("max")))
    if data.get("after"):
        ctx.step("after", work, "after", retry=_policy(data))
    return [[r.to_dict() if isinstance(r, durable.ModelRecoverable) else r for r in g] for g in out]


@durable.workflow(name="par.mixed", version="1")
def mixed(ctx, data):
    """Reads, plain steps and writes in one group (``data["calls"]``: [kind, label])."""
    calls = []
    for kind, label in data["calls"]:
        if kind == "read":
            calls.append(durable.tool_call("par_read", {"label": label, "seconds": 0.05}))
        elif kind == "write":
            calls.append(durable.tool_call("par_write", {"label": label}))
        else:
            calls.append(durable.call(work, label, 0.05, durability=data.get("durability")))
    return ctx.parallel(calls)


@durable.workflow(name="par.turn", version="1")
def turn(ctx, data):
    """One model turn's tool calls (``data["tool_calls"]``); ``after`` adds a step."""
    messages = ctx.run_tool_calls(data["tool_calls"], names=data.get("names"))
    if data.get("after"):
        ctx.step("after", work, "after", retry=SLOW)
    return messages


@durable.workflow(name="par.bad", version="1")
def bad(ctx, data):
    """``ctx.parallel`` with a bad ``max_concurrency`` or a bad call list."""
    calls = data.get("calls") or [durable.call(work, "x")]
    return ctx.parallel(calls, max_concurrency=data.get("max"))
