"""The workflows and tools the benchmark runs (``DURABLE_WORKFLOW_MODULES=bench.workflows``)."""

from __future__ import annotations

import inspect
import time
from typing import Any

import durable


def _noop() -> None:
    return None


@durable.tool(name="bench_read", safety="read_only")
def bench_read() -> None:
    """A read-only tool that does nothing."""
    return


def _reconcile_write(params: dict[str, Any], *, idempotency_key: str) -> Any:
    return durable.NOT_FOUND


@durable.tool(name="bench_write", safety="unsafe_write", reconcile=_reconcile_write)
def bench_write(*, idempotency_key: str) -> None:
    """An unsafe write that does nothing (it goes through the operation ledger)."""
    return


@durable.workflow(name="bench.noop", version="1", max_steps=100_000)
def noop(ctx: Any, inp: dict[str, Any]) -> int:
    """``inp["steps"]`` sequential no-op ``ctx.step`` calls."""
    n = int(inp["steps"])
    for _ in range(n):
        ctx.step("s", _noop)
    return n


def batched_reason() -> str | None:
    """None when the installed durable accepts ``ctx.step(..., durability=...)``, else why
    the batched row cannot be measured (the keyword is checked on the signature: passed to
    an engine without it, it would reach the step's function as an argument)."""
    from durable.context import WorkflowContext

    if "durability" in inspect.signature(WorkflowContext.step).parameters:
        return None
    return "the installed durable's `ctx.step` has no `durability` keyword"


@durable.workflow(name="bench.chain", version="1", max_steps=100_000)
def chain(ctx: Any, inp: dict[str, Any]) -> int:
    """``inp["steps"]`` no-op ``ctx.step`` calls with ``durability=inp["durability"]``
    (``"sync"`` or ``"batched"``); run only where :func:`batched_reason` is None."""
    n = int(inp["steps"])
    mode = inp["durability"]
    for _ in range(n):
        ctx.step("s", _noop, durability=mode)
    return n


@durable.workflow(name="bench.read_tool", version="1", max_steps=100_000)
def read_tool(ctx: Any, inp: dict[str, Any]) -> int:
    """``inp["steps"]`` calls of a read-only tool; ``inp["sleep"]`` seconds between them
    (orchestration time, outside any step)."""
    n = int(inp["steps"])
    pause = float(inp.get("sleep") or 0)
    for _ in range(n):
        ctx.call_tool("bench_read", {})
        if pause:
            time.sleep(pause)
    return n


@durable.workflow(name="bench.write_tool", version="1", max_steps=100_000)
def write_tool(ctx: Any, inp: dict[str, Any]) -> int:
    """``inp["steps"]`` calls of an unsafe-write tool (operation ledger)."""
    n = int(inp["steps"])
    for _ in range(n):
        ctx.call_tool("bench_write", {})
    return n


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return time.time()


@durable.workflow(name="bench.slow", version="1", max_steps=100_000)
def slow(ctx: Any, inp: dict[str, Any]) -> int:
    """``inp["steps"]`` steps that each sleep ``inp["sleep"]`` seconds (recovery runs)."""
    n = int(inp["steps"])
    for _ in range(n):
        ctx.step("slow", _sleep, float(inp["sleep"]))
    return n


@durable.workflow(name="bench.approval", version="1")
def approval(ctx: Any, inp: dict[str, Any]) -> bool:
    """A step, an approval wait, and the step whose start time the benchmark measures."""
    ctx.step("before", _noop)
    decision = ctx.wait_for_approval("go", title="bench approval")
    ctx.step("after", _noop)
    return bool(decision.approved)


@durable.workflow(name="bench.replay", version="1", max_steps=100_000)
def replay_flow(ctx: Any, inp: dict[str, Any]) -> None:
    """``inp["steps"]`` no-op steps, then an approval: the shape of the runs the replay
    check reads (bench/replay_check.py seeds them parked on the approval)."""
    for _ in range(int(inp["steps"])):
        ctx.step("s", _noop)
    ctx.wait_for_approval("ok", title="go on?")


@durable.workflow(name="bench.stream", version="1")
def stream_flow(ctx: Any, inp: dict[str, Any]) -> Any:
    """One streamed model call (bench/stream.py): the scripted model's reply to
    ``inp["message"]``."""
    messages = [{"role": "user", "content": inp["message"]}]
    return ctx.llm(messages, stream=True)["content"]
