"""A scripted model for ``ctx.llm``: replies a test writes, no server, no network.

:class:`ScriptedLLM` takes the place of the ``openai`` client that ``ctx.llm`` uses
(:func:`durable.runtime.llm.client`), so everything around the request is the real
path: the step records the request and the reply, a replay returns the recorded reply
without asking again, tokens count against the run's budget, ``stream=True`` streams
the reply's words and tool calls to the run's stream, and a scripted failure
(:meth:`ScriptedLLM.fail`) is the ``openai`` exception a provider's status would raise,
classified and retried as in production.

Replies come from a queue (:meth:`ScriptedLLM.reply`, one per request, in order) or,
once it is empty, from a function of the request (:meth:`ScriptedLLM.respond`). Every
request is kept in :attr:`ScriptedLLM.requests` with the run and step it was made for.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from durable.exceptions import PermanentError
from durable.runtime import llm as llm_module
from durable.testing.crash import current_call

__all__ = ["LLMRequest", "ScriptExhausted", "ScriptedLLM"]

#: usage a reply reports unless the script gives one
DEFAULT_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


class ScriptExhausted(PermanentError):
    """The model was asked more often than the script answers: the step fails for good,
    and the run's error names the request."""


@dataclass(frozen=True)
class LLMRequest:
    """A request the scripted model received: what ``ctx.llm`` sent, and for which run
    and step (``""`` outside a run)."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    stream: bool
    run_id: str = ""
    step_id: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def last_message(self) -> dict[str, Any]:
        """The last message of the conversation (``{}`` for none)."""
        return self.messages[-1] if self.messages else {}


@dataclass(frozen=True)
class _Failure:
    status: int
    message: str
    retry_after: float | None


class ScriptedLLM:
    """See the module. Install with :meth:`install` (the ``durable_llm`` fixture does)."""

    def __init__(self) -> None:
        self.requests: list[LLMRequest] = []
        self._queue: list[dict[str, Any] | _Failure] = []
        self._responder: Callable[[LLMRequest], Any] | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._saved: Any = None

    # ------------------------------------------------------------------ the script

    def reply(
        self,
        content: str | None = None,
        *,
        tool_calls: list[dict[str, Any]] | None = None,
        usage: dict[str, int] | None = None,
        finish_reason: str | None = None,
    ) -> ScriptedLLM:
        """Queue one reply: text ``content``, or ``tool_calls`` as ``[{"name",
        "arguments": dict}]`` (an ``"id"`` is made up when missing; ``arguments`` may
        be a string, sent as is: malformed JSON reaches the agent as a
        :class:`~durable.ModelRecoverable`). Returns the model, to chain replies."""
        with self._lock:
            self._queue.append(
                {
                    "content": content,
                    "tool_calls": list(tool_calls or []),
                    "usage": dict(usage or DEFAULT_USAGE),
                    "finish_reason": finish_reason,
                }
            )
        return self

    def fail(
        self,
        status: int = 429,
        *,
        times: int = 1,
        message: str = "",
        retry_after: float | None = None,
    ) -> ScriptedLLM:
        """Queue ``times`` failures with HTTP ``status`` (429 and 5xx are retried, 401,
        403 and 404 fail the step, 400 and 422 come back as a
        :class:`~durable.ModelRecoverable`). ``retry_after``: seconds, sent as the
        ``Retry-After`` header."""
        with self._lock:
            self._queue.extend(
                [_Failure(status, message or f"scripted HTTP {status}", retry_after)] * times
            )
        return self

    def respond(self, fn: Callable[[LLMRequest], Any]) -> ScriptedLLM:
        """Answer every request the queue does not with ``fn(request)``: a ``str``
        (the content), or a dict with :meth:`reply`'s keyword arguments."""
        self._responder = fn
        return self

    def requests_of(self, run_id: str) -> list[LLMRequest]:
        """The requests made for run ``run_id``, in order."""
        return [r for r in self.requests if r.run_id == run_id]

    # ------------------------------------------------------------------ installing

    def install(self) -> ScriptedLLM:
        """Answer ``ctx.llm``'s requests from now on (in place of the ``openai`` client)."""
        if self._saved is not None:
            raise RuntimeError("this ScriptedLLM is already installed")
        self._saved = llm_module.__dict__["client"]
        client = _Client(self)
        llm_module.client = lambda timeout=60.0: client
        return self

    def uninstall(self) -> None:
        if self._saved is not None:
            llm_module.client = self._saved
            self._saved = None

    # ------------------------------------------------------------------ answering

    def _create(self, **kwargs: Any) -> Any:
        info = current_call.get()
        request = LLMRequest(
            model=str(kwargs.get("model") or ""),
            messages=copy.deepcopy(list(kwargs.get("messages") or [])),
            tools=copy.deepcopy(kwargs.get("tools")),
            stream=bool(kwargs.get("stream")),
            run_id=info.run_id if info else "",
            step_id=info.step_id if info else "",
            options={
                k: v for k, v in kwargs.items() if k not in ("model", "messages", "tools", "stream")
            },
        )
        with self._lock:
            self.requests.append(request)
            scripted = self._queue.pop(0) if self._queue else None
        if scripted is None and self._responder is not None:
            scripted = _as_reply(self._responder(request))
        if scripted is None:
            raise ScriptExhausted(
                f"the scripted model has no reply for request {len(self.requests)} "
                f"(run {request.run_id or '?'}, step {request.step_id or '?'}; last message: "
                f"{json.dumps(request.last_message, default=str)[:300]}): queue one with "
                "durable_llm.reply(...) or answer with durable_llm.respond(fn)"
            )
        if isinstance(scripted, _Failure):
            raise _status_error(scripted)
        completion = self._completion(request, scripted)
        return _chunks(completion) if request.stream else completion

    def _completion(self, request: LLMRequest, reply: dict[str, Any]) -> dict[str, Any]:
        calls = []
        for call in reply["tool_calls"]:
            arguments = call.get("arguments", {})
            calls.append(
                {
                    "id": call.get("id") or f"call_{next(self._ids)}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else json.dumps(arguments),
                    },
                }
            )
        return {
            "id": f"chatcmpl-scripted-{next(self._ids)}",
            "object": "chat.completion",
            "model": request.model,
            "system_fingerprint": llm_module.SCRIPTED_FINGERPRINT,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": reply["content"],
                        "tool_calls": calls or None,
                    },
                    "finish_reason": reply["finish_reason"] or ("tool_calls" if calls else "stop"),
                }
            ],
            "usage": reply["usage"],
        }


class _Client:
    """What ``ctx.llm`` reads of an ``openai.OpenAI`` client: ``chat.completions.create``."""

    def __init__(self, model: ScriptedLLM) -> None:
        self.chat = self
        self.completions = self
        self._model = model

    def create(self, **kwargs: Any) -> Any:
        return self._model._create(**kwargs)


def _as_reply(answer: Any) -> dict[str, Any] | None:
    if answer is None:
        return None
    if isinstance(answer, str):
        answer = {"content": answer}
    if not isinstance(answer, dict):
        raise TypeError(f"a scripted reply is a str or a dict, got {type(answer).__name__}")
    return {
        "content": answer.get("content"),
        "tool_calls": list(answer.get("tool_calls") or []),
        "usage": dict(answer.get("usage") or DEFAULT_USAGE),
        "finish_reason": answer.get("finish_reason"),
    }


def _chunks(completion: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The completion as the chunks of a stream: a word of the content at a time, each
    tool call whole, the finish reason, then the usage."""
    base = {k: completion[k] for k in ("id", "model", "system_fingerprint")}
    choice = completion["choices"][0]
    message = choice["message"]
    words = (message["content"] or "").split(" ")
    for i, word in enumerate(words if message["content"] else []):
        piece = word if i == len(words) - 1 else word + " "
        yield {**base, "choices": [{"index": 0, "delta": {"content": piece}}]}
    for index, call in enumerate(message["tool_calls"] or []):
        fragment = {"index": index, **call}
        yield {**base, "choices": [{"index": 0, "delta": {"tool_calls": [fragment]}}]}
    yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
    yield {**base, "choices": [], "usage": completion["usage"]}


def _status_error(failure: _Failure) -> Exception:
    """The ``openai`` exception a provider's answer with ``failure.status`` raises."""
    import openai
    from openai import _exceptions

    # the HTTP library the installed openai is built on (httpx, or its successor httpx2)
    http: Any = vars(_exceptions).get("httpx2") or vars(_exceptions)["httpx"]
    headers = {} if failure.retry_after is None else {"retry-after": f"{failure.retry_after:g}"}
    request = http.Request("POST", "https://scripted.invalid/v1/chat/completions")
    body = {"error": {"message": failure.message, "type": "scripted"}}
    response = http.Response(failure.status, headers=headers, json=body, request=request)
    by_status: dict[int, type[openai.APIStatusError]] = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        403: openai.PermissionDeniedError,
        404: openai.NotFoundError,
        409: openai.ConflictError,
        422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
    }
    cls = by_status.get(
        failure.status,
        openai.InternalServerError if failure.status >= 500 else openai.APIStatusError,
    )
    return cls(failure.message, response=response, body=body)
