"""``Runner.run_streamed`` in a durable run: each model request streamed into the run's
stream, recorded once, and the run's items told to readers.

Invariant: a streamed model request is the step ``model`` (``model#2``, ...) recording
the same ``ModelResponse`` JSON as ``get_response``'s step (``_steps._dump``): a run
recorded streamed replays unstreamed and the other way round. On a live try the SDK
gets the model's own events as they arrive while :class:`Relay` writes them to the
run's stream through the step's ``StepStream``; on a replay the step returns its record,
nothing is written, and the SDK gets :func:`replayed_events`, the Responses API events
of that record. The run's items and agent changes (``RunItemStreamEvent``,
``AgentUpdatedStreamEvent``) go to the run's stream as ``run_item`` / ``agent_updated``
events through :class:`ItemLog`, each once: an execution numbers them as the SDK emits
them and writes only those past the ones already written (a replay emits the same ones
in the same order, from the records). See docs/streaming.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from agents import AgentUpdatedStreamEvent, ModelResponse, RunItemStreamEvent, Usage
from agents.usage import _response_usage_to_usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
)
from openai.types.responses.response_function_call_arguments_done_event import (
    ResponseFunctionCallArgumentsDoneEvent,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic_core import to_jsonable_python

from durable.vocabulary import StreamKind

#: the SDK's run-item types whose events reach the run's stream (``run_item`` events)
ITEM_TYPES = (
    "message_output_item",
    "tool_call_item",
    "tool_call_output_item",
    "handoff_call_item",
    "handoff_output_item",
    "reasoning_item",
)


class Relay:
    """The Responses API events of one live try of a streamed model request, as the
    run's stream events (``emit(kind, data)``), and the ``ModelResponse`` they make.

    Text deltas are ``token`` ``{"delta"}``; a function call is ``tool_call_started``
    ``{"index", "id", "name"}`` (``index``: its ``output_index``, ``id``: its
    ``call_id``), ``tool_call_delta`` ``{"index", "delta"}`` and ``tool_call_ended``
    ``{"index", "id", "name", "arguments"}``. Other events (reasoning, refusals, hosted
    tools) are not written: they are in the record.
    """

    def __init__(self, emit: Callable[[str, dict[str, Any]], None]) -> None:
        self.emit = emit
        self.started: set[int] = set()
        self.done_items: list[Any] = []
        self.completed: Response | None = None

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "response.output_text.delta" and event.delta:
            self.emit(StreamKind.TOKEN, {"delta": event.delta})
        elif kind == "response.output_item.added" and _is_call(event.item):
            self._start(event.output_index, event.item)
        elif kind == "response.function_call_arguments.delta" and event.delta:
            self.emit(
                StreamKind.TOOL_CALL_DELTA, {"index": event.output_index, "delta": event.delta}
            )
        elif kind == "response.output_item.done":
            self.done_items.append(event.item)
            if _is_call(event.item):
                self._start(event.output_index, event.item)
                self.emit(
                    StreamKind.TOOL_CALL_ENDED,
                    {
                        "index": event.output_index,
                        "id": event.item.call_id,
                        "name": event.item.name,
                        "arguments": event.item.arguments,
                    },
                )
        elif kind == "response.completed":
            self.completed = event.response

    def _start(self, index: int, item: Any) -> None:
        if index not in self.started:
            self.started.add(index)
            self.emit(
                StreamKind.TOOL_CALL_STARTED,
                {"index": index, "id": item.call_id, "name": item.name},
            )

    def response(self) -> ModelResponse:
        """The ``ModelResponse`` the SDK's streamed run makes of these events (its
        ``run_loop``: the completed response's output, else the items done; its usage)."""
        done = self.completed
        if done is None:
            from agents.exceptions import ModelBehaviorError

            raise ModelBehaviorError("Model did not produce a final response!")
        output = list(done.output) or list(self.done_items)
        usage = _response_usage_to_usage(done.usage) if done.usage else Usage(requests=1)
        return ModelResponse(output=output, usage=usage, response_id=done.id)

    def ended(self) -> dict[str, Any]:
        """The ``step_ended`` data: the response's status as the finish reason, its usage."""
        done = self.completed
        usage = done.usage if done is not None else None
        return {
            "finish_reason": getattr(done, "status", None),
            "usage": usage.model_dump(
                mode="json", include={"input_tokens", "output_tokens", "total_tokens"}
            )
            if usage is not None
            else None,
        }


def _is_call(item: Any) -> bool:
    return getattr(item, "type", None) == "function_call"


def _response(
    output: list[Any],
    *,
    usage: ResponseUsage | None,
    response_id: str | None,
    status: str | None = None,
) -> Response:
    """A ``Response`` without validation (the API's required fields the record lacks)."""
    return Response.model_construct(
        id=response_id or "",
        created_at=0,
        model="",
        object="response",
        output=output,
        tool_choice="auto",
        tools=[],
        parallel_tool_calls=True,
        status=status or ("completed" if usage is not None else "in_progress"),
        usage=usage,
    )


def response_usage(usage: Usage) -> ResponseUsage:
    """``usage`` as the Responses API's, carrying its request count for the SDK."""
    made = ResponseUsage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
        input_tokens_details=InputTokensDetails.model_validate(
            {"cached_tokens": 0, "cache_write_tokens": 0}
        ),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
    )
    object.__setattr__(made, "_agents_sdk_request_count", usage.requests)
    return made


def replayed_events(response: ModelResponse) -> list[Any]:
    """The Responses API events of a recorded response, as a model streaming it would
    send them: ``response.created``; per output item ``response.output_item.added``, a
    message's text as one ``response.output_text.delta`` (between its content part's
    added and done), a function call's arguments as one
    ``response.function_call_arguments.delta`` and ``.done``, ``response.output_item.done``;
    then ``response.completed`` with the whole response."""
    events: list[Any] = []
    seq = iter(range(1_000_000))
    events.append(
        ResponseCreatedEvent(
            type="response.created",
            response=_response([], usage=None, response_id=response.response_id),
            sequence_number=next(seq),
        )
    )
    for index, item in enumerate(response.output):
        added = item
        if isinstance(item, ResponseOutputMessage):
            added = item.model_copy(update={"content": [], "status": "in_progress"})
        elif isinstance(item, ResponseFunctionToolCall):
            added = item.model_copy(update={"arguments": "", "status": "in_progress"})
        events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                item=added,
                output_index=index,
                sequence_number=next(seq),
            )
        )
        if isinstance(item, ResponseOutputMessage):
            for part_index, part in enumerate(item.content):
                if not isinstance(part, ResponseOutputText):
                    continue
                common: dict[str, Any] = {
                    "item_id": item.id,
                    "output_index": index,
                    "content_index": part_index,
                }
                events.append(
                    ResponseContentPartAddedEvent(
                        type="response.content_part.added",
                        part=part.model_copy(update={"text": "", "annotations": []}),
                        sequence_number=next(seq),
                        **common,
                    )
                )
                events.append(
                    ResponseTextDeltaEvent(
                        type="response.output_text.delta",
                        delta=part.text,
                        logprobs=[],
                        sequence_number=next(seq),
                        **common,
                    )
                )
                events.append(
                    ResponseTextDoneEvent(
                        type="response.output_text.done",
                        text=part.text,
                        logprobs=[],
                        sequence_number=next(seq),
                        **common,
                    )
                )
                events.append(
                    ResponseContentPartDoneEvent(
                        type="response.content_part.done",
                        part=part,
                        sequence_number=next(seq),
                        **common,
                    )
                )
        elif isinstance(item, ResponseFunctionToolCall):
            item_id = item.id or item.call_id
            events.append(
                ResponseFunctionCallArgumentsDeltaEvent(
                    type="response.function_call_arguments.delta",
                    item_id=item_id,
                    output_index=index,
                    delta=item.arguments,
                    sequence_number=next(seq),
                )
            )
            events.append(
                ResponseFunctionCallArgumentsDoneEvent.model_validate(
                    {
                        "type": "response.function_call_arguments.done",
                        "item_id": item_id,
                        "output_index": index,
                        "arguments": item.arguments,
                        "name": item.name,
                        "sequence_number": next(seq),
                    }
                )
            )
        events.append(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                item=item,
                output_index=index,
                sequence_number=next(seq),
            )
        )
    events.append(
        ResponseCompletedEvent(
            type="response.completed",
            response=_response(
                list(response.output),
                usage=response_usage(response.usage),
                response_id=response.response_id,
            ),
            sequence_number=next(seq),
        )
    )
    return events


async def merge(
    step: asyncio.Future[Any], live: asyncio.Queue[Any], seen: list[bool]
) -> AsyncIterator[Any]:
    """The events ``live`` receives while ``step`` runs, then ``step``'s end (its
    exception raised); ``seen[0]`` true once a live event came."""
    getter: asyncio.Future[Any] | None = None
    try:
        while True:
            if getter is None:
                getter = asyncio.ensure_future(live.get())
            done, _ = await asyncio.wait({getter, step}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                seen[0] = True
                yield getter.result()
                getter = None
                continue
            getter.cancel()
            getter = None
            while not live.empty():
                seen[0] = True
                yield live.get_nowait()
            step.result()
            return
    finally:
        if getter is not None:
            getter.cancel()
        if not step.done():
            step.cancel()
            with contextlib.suppress(BaseException):
                await step


def item_data(event: Any) -> tuple[str, dict[str, Any]] | None:
    """A ``RunItemStreamEvent`` / ``AgentUpdatedStreamEvent`` as a stream event of the run
    (``None`` for others and for items of types not in :data:`ITEM_TYPES`)."""
    if isinstance(event, AgentUpdatedStreamEvent):
        return StreamKind.AGENT_UPDATED, {"agent": event.new_agent.name}
    if not isinstance(event, RunItemStreamEvent) or event.item.type not in ITEM_TYPES:
        return None
    item = event.item
    raw: Any = item.raw_item
    if hasattr(raw, "model_dump"):
        raw = raw.model_dump(mode="json", by_alias=True, exclude_unset=True)
    data: dict[str, Any] = {
        "name": event.name,
        "type": item.type,
        "agent": item.agent.name,
        "raw_item": to_jsonable_python(raw, fallback=repr),
    }
    if item.type == "tool_call_output_item":
        data["output"] = to_jsonable_python(item.output, fallback=repr)
    if item.type == "handoff_output_item":
        data["source_agent"] = item.source_agent.name
        data["target_agent"] = item.target_agent.name
    return StreamKind.RUN_ITEM, data


class ItemLog:
    """The run items and agent changes of one execution's streamed runs, for the run's
    stream: :meth:`add` (the agent's loop) numbers each as the SDK emits it,
    :meth:`flush` (the workflow thread, before each step and wait) writes those past
    the ones already written, so a replay writes nothing again."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.count = 0
        self.pending: list[tuple[int, str, dict[str, Any]]] = []
        self.written: int | None = None

    def add(self, event: Any) -> None:
        made = item_data(event)
        if made is not None:
            self.count += 1
            self.pending.append((self.count, *made))

    def flush(self) -> None:
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        if self.ctx._execution.cursor.dry:  # the replay check: nothing is written
            return
        if self.written is None:
            from durable.models import StreamEvent

            self.written = StreamEvent.objects.filter(
                run_id=self.ctx.run_id, kind__in=(StreamKind.RUN_ITEM, StreamKind.AGENT_UPDATED)
            ).count()
        fresh = [(kind, data) for n, kind, data in pending if n > self.written]
        if not fresh:
            return
        writer = self.ctx._stream_writer("")
        for kind, data in fresh:
            writer.emit(kind, data)
        writer.close()
        self.written += len(fresh)
