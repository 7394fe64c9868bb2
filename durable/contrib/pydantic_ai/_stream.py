"""A streamed model request of a PydanticAI run: live to the run's stream, recorded once.

Invariant: a streamed request is the step ``model`` (``model#2``, ...) that an
unstreamed one is, and records the same ``{"response", "stamps"}`` (the
``ModelResponse`` the stream assembled, in PydanticAI's JSON): a run recorded streamed
replays unstreamed and the other way round. On a live try the body opens the wrapped
model's ``request_stream`` inside a :class:`~durable.runtime.llm_stream.StepStream`
(``interrupted`` when the step streamed before, ``step_started``, the events,
``step_ended``), maps PydanticAI's events (``PartStartEvent``, ``PartDeltaEvent``,
``PartEndEvent``) to the run's stream kinds as they arrive, and hands the same events to
the run's ``event_stream_handler`` inside the step -- as PydanticAI's DBOS and Temporal
integrations run the handler inside the step or activity. A replay returns the record:
no model, nothing written to the run's stream. See docs/streaming.md.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

from pydantic_ai import (
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    RunContext,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
)
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.messages import ModelResponseStreamEvent
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RequestUsage
from pydantic_core import to_jsonable_python

from durable.exceptions import PermanentError
from durable.vocabulary import StreamKind

Event = tuple[str, dict[str, Any]]


def _args_text(args: Any) -> str:
    """A tool call's arguments (or a fragment of them) as JSON text."""
    if args is None:
        return ""
    return args if isinstance(args, str) else json.dumps(to_jsonable_python(args))


class StreamMapping:
    """PydanticAI's model stream events as the run's stream events (docs/streaming.md).

    :meth:`events` takes one ``ModelResponseStreamEvent`` and returns the
    ``(kind, data)`` pairs it makes: a text part's content and deltas are ``token``
    ``{"delta"}``; a tool call (a ``ToolCallPart``, output tools included) is
    ``tool_call_started`` ``{"index", "id", "name"}``, its argument fragments
    ``tool_call_delta`` ``{"index", "delta"}`` and its ``PartEndEvent``
    ``tool_call_ended`` ``{"index", "id", "name", "arguments"}`` (the JSON text), where
    ``index`` numbers the response's tool calls from 0 (not its parts). Thinking and
    other parts make no event.
    """

    def __init__(self) -> None:
        #: a tool call's part index -> its index among the response's tool calls
        self.tools: dict[int, int] = {}

    def events(self, event: ModelResponseStreamEvent) -> list[Event]:
        if isinstance(event, PartStartEvent):
            part = event.part
            if isinstance(part, TextPart):
                return [(StreamKind.TOKEN, {"delta": part.content})] if part.content else []
            if isinstance(part, ToolCallPart):
                index = self.tools.setdefault(event.index, len(self.tools))
                out: list[Event] = [
                    (
                        StreamKind.TOOL_CALL_STARTED,
                        {"index": index, "id": part.tool_call_id, "name": part.tool_name},
                    )
                ]
                args = _args_text(part.args)
                if args:
                    out.append((StreamKind.TOOL_CALL_DELTA, {"index": index, "delta": args}))
                return out
        elif isinstance(event, PartDeltaEvent):
            delta = event.delta
            if isinstance(delta, TextPartDelta) and delta.content_delta:
                return [(StreamKind.TOKEN, {"delta": delta.content_delta})]
            if isinstance(delta, ToolCallPartDelta) and event.index in self.tools:
                args = _args_text(delta.args_delta)
                if args:
                    index = self.tools[event.index]
                    return [(StreamKind.TOOL_CALL_DELTA, {"index": index, "delta": args})]
        elif isinstance(event, PartEndEvent) and event.index in self.tools:
            part = event.part
            if isinstance(part, ToolCallPart):
                ended = {
                    "index": self.tools[event.index],
                    "id": part.tool_call_id,
                    "name": part.tool_name,
                    "arguments": part.args_as_json_str(),
                }
                return [(StreamKind.TOOL_CALL_ENDED, ended)]
        return []


def usage_data(usage: RequestUsage) -> dict[str, int]:
    """A request's usage in the shape ``step_ended`` gives a ``ctx.llm`` call's."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


async def stream_request(
    model: Model,
    messages: list[ModelMessage],
    model_settings: ModelSettings | None,
    parameters: ModelRequestParameters,
    run_context: RunContext[Any] | None,
    *,
    emit: Callable[[str, dict[str, Any]], None],
    handler: EventStreamHandler[Any] | None,
) -> ModelResponse:
    """One streamed request to ``model`` (on the agent's loop): each event mapped to
    ``emit(kind, data)`` as it arrives and handed to ``handler(run_context, events)``
    (when both are given); the events the handler leaves are drained. Returns the
    assembled ``ModelResponse``. Raises :class:`~durable.exceptions.PermanentError`
    (not tried again) when the model cannot stream."""
    mapping = StreamMapping()
    async with AsyncExitStack() as stack:
        try:
            streamed = await stack.enter_async_context(
                model.request_stream(messages, model_settings, parameters, run_context)
            )
        except NotImplementedError as exc:  # PydanticAI's base Model: no streamed requests
            raise PermanentError(
                f"the model {model.model_name!r} cannot stream ({exc}): this run streams its "
                "model requests (an event_stream_handler, or stream=True / run_stream); use "
                "a model that streams, or run without them"
            ) from exc

        async def events() -> AsyncIterator[ModelResponseStreamEvent]:
            async for event in streamed:
                for kind, data in mapping.events(event):
                    emit(kind, data)
                yield event

        # one iterator: draining goes on where the handler stopped
        stream = events()
        if handler is not None and run_context is not None:
            await handler(run_context, stream)
        async for _ in stream:
            pass
    return streamed.get()
