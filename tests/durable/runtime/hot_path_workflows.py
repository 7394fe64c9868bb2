"""Fixture workflows of the hot-path tests (tests/durable/runtime/test_hot_path.py)."""

from __future__ import annotations

import durable

WRITES: list[str] = []


def _one() -> int:
    return 1


@durable.tool(name="hp.write", safety="unsafe_write")
def hp_write(n: int, *, idempotency_key: str) -> dict:
    """An unsafe write (no approval) that records its key and returns its parameter."""
    WRITES.append(idempotency_key)
    return {"n": n}


@durable.workflow(name="hp.one_step", version="1")
def one_step(ctx, data):
    return {"one": ctx.step("one", _one)}


@durable.workflow(name="hp.writes", version="1")
def writes(ctx, data):
    a = ctx.call_tool("hp.write", {"n": 1})
    b = ctx.call_tool("hp.write", {"n": 2})
    return [a, b]
