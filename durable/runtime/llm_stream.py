"""Streamed LLM calls: ``ctx.llm(..., stream=True)``.

Invariant: a streamed call is recorded exactly as an unstreamed one -- the chunks are
assembled into a ``chat.completion`` (content, tool calls from their argument fragments,
usage, finish reason) and go through :func:`durable.runtime.llm.parse_response`, so the
step's result, its tokens counted against ``max_tokens`` and its cost are the same dict
``ctx.llm`` returns without streaming. What streams live is a view: the events go to the
run's stream (``durable/runtime/stream_writer.py``) as the chunks arrive, and a replay
returns the record without calling the model or streaming anything. The request asks
for ``stream_options={"include_usage": True}``, the OpenAI API's way to bill a streamed
call in its last chunk. See docs/streaming.md.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from durable.exceptions import DatabaseUnavailable
from durable.runtime import llm
from durable.runtime.dbconn import is_db_fault
from durable.runtime.failures import safe_str
from durable.runtime.stream_writer import StreamWriter
from durable.vocabulary import StreamKind

if TYPE_CHECKING:
    from durable.runtime.replay import ReplayCursor

Event = tuple[str, dict[str, Any]]


class Assembly:
    """The chunks of one streamed chat completion, put together as they arrive.

    :meth:`add` takes a ``chat.completion.chunk`` (the ``openai`` client's object or its
    dict) and returns the stream events it makes; :meth:`response` is the whole reply in
    the shape of a ``chat.completion`` (only the first choice is kept, as ``ctx.llm``
    reads only it).
    """

    def __init__(self) -> None:
        self.id = ""
        self.model = ""
        self.fingerprint: str | None = None
        self.content: list[str] = []
        self.refusal: list[str] = []
        #: tool calls by their index here: ``{"id", "name", "arguments": [fragments]}``
        self.calls: dict[int, dict[str, Any]] = {}
        #: the provider's ``index`` of a call -> its index here (the same, unless the
        #: provider gave one index to several calls)
        self.slots: dict[Any, int] = {}
        #: the index here of the call started last
        self.last: int | None = None
        self.ended: set[int] = set()
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def add(self, chunk: Any) -> list[Event]:
        data = chunk.model_dump() if hasattr(chunk, "model_dump") else dict(chunk)
        self.id = self.id or data.get("id") or ""
        self.model = data.get("model") or self.model
        self.fingerprint = data.get("system_fingerprint") or self.fingerprint
        if data.get("usage"):  # the last chunk, when include_usage was asked
            self.usage = data["usage"]
        events: list[Event] = []
        for choice in data.get("choices") or []:
            if (choice.get("index") or 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
                events.append((StreamKind.TOKEN, {"delta": delta["content"]}))
            if delta.get("refusal"):
                self.refusal.append(delta["refusal"])
                events.append((StreamKind.REFUSAL, {"delta": delta["refusal"]}))
            for fragment in delta.get("tool_calls") or []:
                events.extend(self._tool_fragment(fragment))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                events.extend(self.end_tool_calls())
        return events

    def _slot(self, fragment: dict[str, Any]) -> int:
        """The index here of the call ``fragment`` belongs to (a new one when it starts
        a call). The ``index`` says which call, as the OpenAI API sends it; without one
        (Gemini's OpenAI-compatible endpoint, older Ollama), a fragment with neither an
        id nor a name of its own goes on with the call started last; an index already
        given to a call with another id (Ollama says 0 for every call of a parallel
        batch) starts a new call."""
        index = fragment.get("index")
        call_id = fragment.get("id") or ""
        name = (fragment.get("function") or {}).get("name") or ""
        if index is None:
            if self.last is not None:
                last = self.calls[self.last]
                if call_id in ("", last["id"]) and name in ("", last["name"]):
                    return self.last
        elif index in self.slots:
            slot = self.slots[index]
            known = self.calls[slot]["id"]
            if not call_id or not known or call_id == known:
                return slot
        slot = (
            index
            if isinstance(index, int) and index not in self.calls
            else max(self.calls, default=-1) + 1
        )
        if index is not None:
            self.slots[index] = slot
        self.last = slot
        return slot

    def _tool_fragment(self, fragment: dict[str, Any]) -> list[Event]:
        index = self._slot(fragment)
        function = fragment.get("function") or {}
        events: list[Event] = []
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = {
                "id": fragment.get("id") or "",
                "name": function.get("name") or "",
                "arguments": [],
            }
            events.append(
                (
                    StreamKind.TOOL_CALL_STARTED,
                    {"index": index, "id": call["id"], "name": call["name"]},
                )
            )
        else:
            call["id"] = call["id"] or fragment.get("id") or ""
            call["name"] = call["name"] or function.get("name") or ""
        if function.get("arguments"):
            call["arguments"].append(function["arguments"])
            events.append(
                (StreamKind.TOOL_CALL_DELTA, {"index": index, "delta": function["arguments"]})
            )
        return events

    def end_tool_calls(self) -> list[Event]:
        """``tool_call_ended`` for every call not ended yet (its arguments are whole)."""
        events: list[Event] = []
        for index in sorted(self.calls):
            if index in self.ended:
                continue
            self.ended.add(index)
            call = self.calls[index]
            events.append(
                (
                    StreamKind.TOOL_CALL_ENDED,
                    {
                        "index": index,
                        "id": call["id"],
                        "name": call["name"],
                        "arguments": "".join(call["arguments"]),
                    },
                )
            )
        return events

    def response(self) -> dict[str, Any]:
        """The reply as a ``chat.completion`` dict."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content else None,
            "refusal": "".join(self.refusal) if self.refusal else None,
        }
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": "".join(call["arguments"])},
                }
                for _, call in sorted(self.calls.items())
            ]
        return {
            "id": self.id,
            "object": "chat.completion",
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
            "usage": self.usage,
        }


def chat_stream(
    messages: list[dict[str, Any]],
    *,
    emit: Any,
    model: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    timeout: float = 60.0,
    **options: Any,
) -> dict[str, Any]:
    """One streamed chat-completions call; ``emit(kind, data)`` gets each stream event.

    Returns what :func:`durable.runtime.llm.chat` returns for the same reply."""
    model = model or llm.default_model()
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": messages,
        **options,
        "stream": True,
        "stream_options": {"include_usage": True, **(options.get("stream_options") or {})},
    }
    if tools:
        kwargs["tools"] = tools
    assembly = Assembly()
    stream = llm.client(timeout).chat.completions.create(**kwargs)
    try:
        for chunk in stream:
            for kind, data in assembly.add(chunk):
                emit(kind, data)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    for kind, data in assembly.end_tool_calls():  # a stream cut without a finish reason
        emit(kind, data)
    return llm.finish(assembly.response(), requested=model)


class StepStream:
    """The stream of one try of a streamed model step, as a context manager.

    On entry: an ``interrupted`` event when the step streamed before without being
    recorded (a lost worker, a failed try), then ``step_started`` with ``{"model"}`` (and
    the keys of ``started``: LangGraph's message ``metadata``). Inside, :meth:`emit`
    queues events (any thread: the model's client may stream on an agent framework's
    event loop); :meth:`end` sets the ``step_ended`` data. On exit:
    ``step_ended`` (``{"error"}`` when the body raised an ``Exception``; none for engine
    control flow, a dying execution claims no end) and the events are committed. Used by
    ``ctx.llm(stream=True)`` and the framework adapters' streamed model requests
    (``WorkflowContext._step_stream``). A database fault while writing is tried again
    by the writer, and never raised on exit: the reply in hand is recorded by the step's
    checkpoint, not asked again. One while reading the step's earlier events on entry
    raises :class:`~durable.exceptions.DatabaseUnavailable` (nothing was asked yet).
    """

    def __init__(
        self,
        cursor: ReplayCursor,
        step_id: str,
        *,
        model: str,
        started: dict[str, Any] | None = None,
    ) -> None:
        heartbeat = cursor.heartbeat
        self.writer = StreamWriter(
            cursor.run_id, step_id, live=lambda: heartbeat is None or not heartbeat.lost
        )
        self.model = model
        self.started = dict(started or {})
        self.ended: dict[str, Any] = {}

    def __enter__(self) -> StepStream:
        try:
            self.writer.interrupted_before()
        except Exception as exc:
            self.writer.close()
            if is_db_fault(exc):  # the engine's own read: not the call's failure
                raise DatabaseUnavailable(exc) from exc
            raise
        self.writer.emit(StreamKind.STEP_STARTED, {**self.started, "model": self.model})
        return self

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Queue one event (``kind`` a :class:`~durable.vocabulary.StreamKind`)."""
        self.writer.emit(kind, data)

    def end(self, *, finish_reason: Any = None, usage: Any = None, cost_usd: Any = None) -> None:
        """What ``step_ended`` says when the body returns."""
        self.ended = {"finish_reason": finish_reason, "usage": usage, "cost_usd": cost_usd}

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.writer.emit(StreamKind.STEP_ENDED, self.ended)
            self.writer.close()
        elif isinstance(exc, Exception):
            self.writer.emit(StreamKind.STEP_ENDED, {"error": safe_str(exc)[:500]})
            with contextlib.suppress(BaseException):  # the call's own failure is reported
                self.writer.close()
        else:
            self.writer.close()  # a dying execution: what arrived is shown; no end is claimed


def streamed_chat(
    cursor: ReplayCursor, step_id: str, messages: list[dict[str, Any]], **kwargs: Any
) -> dict[str, Any]:
    """One try of a streamed ``ctx.llm`` step: its events go to the run's stream,
    framed by ``step_started`` and ``step_ended`` (:class:`StepStream`)."""
    with StepStream(cursor, step_id, model=kwargs.get("model") or llm.default_model()) as out:
        result = chat_stream(messages, emit=out.emit, **kwargs)
        out.end(
            finish_reason=result.get("finish_reason"),
            usage=result.get("usage"),
            cost_usd=result.get("cost_usd"),
        )
    return result
