"""Workflows of the streaming tests (docs/streaming.md): streamed ``ctx.llm`` calls to
the scripted model (examples/fake_llm.py), whose script and faults the input names."""

from __future__ import annotations

from typing import Any

import durable


def messages(ctx: Any, data: dict[str, Any], text: str | None = None) -> list[dict[str, Any]]:
    script = data.get("script", "echo")
    return [
        {"role": "system", "content": f"durable-script: {script}\nrun: {ctx.run_id}"},
        {"role": "user", "content": text or data["message"]},
    ]


@durable.workflow(name="stream.chat", version="1")
def chat(ctx: Any, data: dict[str, Any]) -> Any:
    """One streamed model call; returns its reply."""
    return ctx.llm(messages(ctx, data), stream=bool(data.get("stream", True)))


@durable.workflow(name="stream.twice", version="1")
def twice(ctx: Any, data: dict[str, Any]) -> Any:
    """A streamed call, a wait for the signal ``go``, then a second streamed call."""
    first = ctx.llm(messages(ctx, data), stream=True)
    ctx.wait_for_signal("go")
    second = ctx.llm(messages(ctx, data, data["second"]), stream=True)
    return [first["content"], second["content"]]
