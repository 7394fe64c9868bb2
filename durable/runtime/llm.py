"""LLM calls as durable steps, through the official ``openai`` client.

Any OpenAI-compatible chat-completions endpoint with tool calling works: set
``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``DURABLE_LLM_MODEL`` (a real provider,
Ollama, vLLM, llama.cpp's server, or the project's scripted local server). The client's
own retries are off: the engine owns retries (docs/architecture.md#failures-and-retries).

Classification (docs/architecture.md#failures-and-retries): 429 (with ``Retry-After``),
5xx, timeouts and connection errors are transient; 401/403/404 permanent; 400/422 and
malformed tool-call JSON are model-recoverable (returned as
:class:`~durable.ModelRecoverable`, for the agent to feed back to the model).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from durable import conf
from durable.exceptions import ModelRecoverableError, PermanentError
from durable.observability import telemetry

#: ``system_fingerprint`` the scripted local server answers with (the dashboard labels
#: runs that used it)
SCRIPTED_FINGERPRINT = "durable-scripted"


def default_model() -> str:
    return os.environ.get("DURABLE_LLM_MODEL", "scripted")


@functools.lru_cache(maxsize=8)
def _client(base_url: str | None, api_key: str, timeout: float) -> Any:
    import openai

    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)


def client(timeout: float = 60.0) -> Any:
    """An ``openai.OpenAI`` client from the environment (cached per process)."""
    return _client(
        os.environ.get("OPENAI_BASE_URL") or None,
        os.environ.get("OPENAI_API_KEY") or "not-needed",
        float(timeout),
    )


def cost_usd(model: str, usage: dict[str, Any]) -> float | None:
    """Cost of a call from ``DURABLE['LLM_PRICES']`` = ``{model: [input, output]}`` in
    US dollars per million tokens; ``None`` when the model has no price."""
    prices = (conf.get("LLM_PRICES") or {}).get(model)
    if not prices:
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    return round((prompt * prices[0] + completion * prices[1]) / 1_000_000, 8)


def billed_usage(response: Any) -> dict[str, int]:
    """``{prompt_tokens, completion_tokens, total_tokens}`` of a reply, 0 where missing."""
    try:
        data = response.model_dump() if hasattr(response, "model_dump") else dict(response)
        usage = data.get("usage") or {}
        return {
            k: int(usage.get(k) or 0)
            for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        }
    except Exception:  # noqa: BLE001 - an unreadable reply: nothing known to count
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def parse_response(response: Any) -> dict[str, Any]:
    """Turn a chat completion into the plain dict a step records.

    ``{"content", "refusal", "tool_calls": [{"id", "name", "arguments": dict}],
    "finish_reason", "model", "usage": {prompt_tokens, completion_tokens, total_tokens},
    "scripted"}``; ``refusal`` is the text of a model that declined (OpenAI's
    ``message.refusal``), else ``None``.
    Raises :class:`~durable.ModelRecoverableError` when a tool call's arguments are not
    a JSON object, naming the tool and the parse error.
    """
    data = response.model_dump() if hasattr(response, "model_dump") else dict(response)
    choices = data.get("choices") or []
    if not choices:
        raise PermanentError("the LLM answered without choices")
    message = choices[0].get("message") or {}
    usage = data.get("usage") or {}
    # what a malformed reply cost, so the run's token budget counts it (it was paid for)
    spent = {
        "usage": {
            k: int(usage.get(k) or 0)
            for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        },
        "scripted": data.get("system_fingerprint") == SCRIPTED_FINGERPRINT,
    }
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        name = function.get("name") or ""
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ModelRecoverableError(
                f"the arguments of tool call {name!r} are not valid JSON ({exc.msg} at "
                f"character {exc.pos}); send the call again with a JSON object",
                details={
                    "tool": name,
                    "arguments": raw[:2000],
                    "tool_call_id": call.get("id"),
                    **spent,
                },
            ) from None
        if not isinstance(arguments, dict):
            raise ModelRecoverableError(
                f"the arguments of tool call {name!r} must be a JSON object, got "
                f"{type(arguments).__name__}",
                details={"tool": name, "tool_call_id": call.get("id"), **spent},
            )
        calls.append({"id": call.get("id") or "", "name": name, "arguments": arguments})
    return {
        "content": message.get("content"),
        "refusal": message.get("refusal") or None,
        "tool_calls": calls,
        "finish_reason": choices[0].get("finish_reason"),
        "model": data.get("model") or "",
        "usage": {
            k: int(usage.get(k) or 0)
            for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        },
        "scripted": data.get("system_fingerprint") == SCRIPTED_FINGERPRINT,
    }


def chat(
    messages: list[dict[str, Any]],
    *,
    model: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    timeout: float = 60.0,
    **options: Any,
) -> dict[str, Any]:
    """One chat-completions call; returns :func:`parse_response`'s dict (plus ``cost_usd``)."""
    model = model or default_model()
    kwargs: dict[str, Any] = {"model": model, "messages": messages, **options}
    if tools:
        kwargs["tools"] = tools
    response = client(timeout).chat.completions.create(**kwargs)
    return finish(response, requested=model)


def finish(response: Any, *, requested: str) -> dict[str, Any]:
    """:func:`parse_response`'s dict of a reply (a streamed one assembled), with its
    ``cost_usd``; the span gets its GenAI attributes."""
    try:
        result = parse_response(response)
    except Exception as exc:
        # the reply was billed even though it cannot be used: the engine counts
        # ``billed_usage`` against the run's token budget
        # (docs/compensation.md#budgets-count-what-was-billed)
        exc.billed_usage = billed_usage(response)  # type: ignore[attr-defined]
        raise
    result["cost_usd"] = cost_usd(result["model"] or requested, result["usage"])
    telemetry.llm_result(result, requested=requested)  # GenAI attributes on the step's span
    return result


def billed_tokens(usage: Any) -> int:
    """``total_tokens`` of an LLM reply's usage dict (0 when unknown)."""
    if not isinstance(usage, dict):
        return 0
    try:
        return max(0, int(usage.get("total_tokens") or 0))
    except (TypeError, ValueError):
        return 0
