"""Fixture workflows for tests/durable/values/test_redaction_everywhere.py: identifiers and
titles that come from the input, so a test can put a secret into them."""

from __future__ import annotations

from typing import Any

import durable

SEEN: list[Any] = []


def _echo(value: Any) -> Any:
    SEEN.append(value)
    return value


@durable.workflow(name="sec.echo", version="1")
def echo(ctx, data):
    """One step that receives the whole input (the step must get the real values)."""
    return {"echo": ctx.step("echo", _echo, data)}


@durable.workflow(name="sec.step_id", version="1")
def step_id(ctx, data):
    return ctx.step(data["step_id"], _echo, 1)


@durable.workflow(name="sec.signal", version="1")
def signal(ctx, data):
    return ctx.wait_for_signal(data["name"], step_id=data.get("step_id"))


@durable.workflow(name="sec.approval", version="1")
def approval(ctx, data):
    decision = ctx.wait_for_approval(data.get("key", "ok"), title=data["title"])
    return {"approved": decision.approved}


@durable.workflow(name="sec.fail", version="1")
def fail(ctx, data):
    ctx.step("boom", _boom, data["why"], retry=durable.RetryPolicy(max_attempts=1))


def _boom(why: str) -> None:
    raise durable.PermanentError(f"upstream refused the request: {why}")
