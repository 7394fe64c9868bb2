"""Fixture workflows of ``test_trial_hot_path.py`` (an outside tester's trial of the
PostgreSQL hot write path: the shared prepared cursor, the row shortcuts, the binary
batch flush)."""

from __future__ import annotations

from typing import Any

import durable


def echo(value: Any) -> Any:
    return value


@durable.workflow(name="trial.batched_values", version="1", durability="batched")
def batched_values(ctx, data):
    """One batched step per value of ``data["values"]``, each echoing it back, then a
    sync step: the batch is flushed by the sync step (one statement on PostgreSQL)."""
    out = [
        ctx.step(f"v{i}", echo, value, durability="batched")
        for i, value in enumerate(data["values"])
    ]
    out.append(ctx.step("sync", echo, len(out)))
    return out


def _greet(name: str) -> str:
    return f"hello {name}"


@durable.tool(name="trial.shout", safety="read_only")
def shout(text: str) -> str:
    return text.upper()


@durable.workflow(name="trial.chain", version="1", durability="batched")
def chain(ctx, data):
    """Batched steps, a tool call and a last batched step flushed at the run's end."""
    a = ctx.step("a", _greet, data["name"], durability="batched")
    b = ctx.step("b", echo, a + "!", durability="batched")
    c = ctx.call_tool("trial.shout", {"text": b}, step_id="c")
    return ctx.step("d", echo, c, durability="batched")


@durable.workflow(name="trial.long_id", version="1")
def long_id(ctx, data):
    """A step whose id is longer than ``Step.step_id`` holds (255 characters)."""
    durability = data["durability"]
    ctx.step("short", echo, 1, durability=durability)
    return ctx.step("x" * 300, echo, 2, durability=durability)


#: what each body of ``trial.observe`` saw: its log context and the traceparent it
#: would send on an outgoing call
SEEN: list[dict[str, Any]] = []


def _look() -> str:
    from opentelemetry import propagate

    from durable.observability import logcontext

    headers: dict[str, str] = {}
    propagate.inject(headers)
    SEEN.append({"log": dict(logcontext.current()), "traceparent": headers.get("traceparent")})
    return "seen"


@durable.workflow(name="trial.observe", version="1")
def observe(ctx, data):
    ctx.step("sync_look", _look)
    ctx.step("batched_look", _look, durability="batched")
    return "ok"
