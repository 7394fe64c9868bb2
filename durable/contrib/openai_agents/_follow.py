"""Following a durable OpenAI Agents run from outside the worker, in the SDK's shapes.

Invariant: what :meth:`StreamedRun.stream_events` yields is rebuilt from the run's
stream (``durable.stream``) alone, in its order: the SDK's ``RawResponsesStreamEvent``
(Responses API events of each model request's try, as they were written),
``RunItemStreamEvent`` and ``AgentUpdatedStreamEvent`` (the ``run_item`` and
``agent_updated`` events). A try cut off (``interrupted``) is told as a raw ``error``
event with the reason as its ``code``: the next ``response.created`` is the request
asked again, whose text is a new answer, not the continuation.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterable
from typing import Any

from agents import (
    Agent,
    AgentUpdatedStreamEvent,
    RawResponsesStreamEvent,
    RunItemStreamEvent,
)
from agents.items import (
    HandoffCallItem,
    HandoffOutputItem,
    MessageOutputItem,
    ReasoningItem,
    ToolCallItem,
    ToolCallOutputItem,
)
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
)
from openai.types.responses.response_function_call_arguments_done_event import (
    ResponseFunctionCallArgumentsDoneEvent,
)

from durable.contrib.openai_agents._model import _OUTPUT_ITEM
from durable.contrib.openai_agents._stream import _response
from durable.vocabulary import StreamKind

_ITEMS: dict[str, Any] = {
    "message_output_item": MessageOutputItem,
    "tool_call_item": ToolCallItem,
    "tool_call_output_item": ToolCallOutputItem,
    "handoff_call_item": HandoffCallItem,
    "handoff_output_item": HandoffOutputItem,
    "reasoning_item": ReasoningItem,
}
_DONE = object()


def agents_of(agent: Agent[Any]) -> dict[str, Agent[Any]]:
    """The agents reachable from ``agent`` (handoffs, recursively), by name."""
    found: dict[str, Agent[Any]] = {}
    stack: list[Any] = [agent]
    while stack:
        current = stack.pop()
        current = getattr(current, "agent", current)  # a Handoff made by handoff(agent)
        if not isinstance(current, Agent) or current.name in found:
            continue
        found[current.name] = current
        stack.extend(current.handoffs)
    return found


class StreamedRun:
    """A durable OpenAI Agents run followed as the SDK's ``RunResultStreaming``.

    ``async for event in run.stream_events()`` yields the SDK's stream events rebuilt
    from the run's stream (``durable.stream(run_id)``: what was written, then live),
    until the run ends or waits (an approval): then :attr:`is_complete` says which,
    and a later ``stream_events()`` goes on after the last event read. A run that
    failed raises :class:`durable.RunFailed` from ``stream_events()`` once its events
    are read. :attr:`final_output` is the run's ``final_output`` once it succeeded
    (``None`` before); :attr:`current_agent` the agent last told, :attr:`new_items` the
    run items told so far (the SDK's ``RunItem`` objects). ``agents``: the ``Agent``
    objects by name (``AgentUpdatedStreamEvent.new_agent``, each item's ``agent``); a
    name not there gets an ``Agent`` of that name. ``poll``: seconds between two reads
    of the stream. :meth:`cancel` cancels the run, as the SDK's ``cancel()`` stops its
    own.
    """

    def __init__(
        self,
        run_id: str,
        *,
        agents: dict[str, Agent[Any]] | None = None,
        poll: float = 0.25,
    ) -> None:
        self.run_id = str(run_id)
        self.agents = dict(agents or {})
        self.poll = poll
        self.after = 0
        self.is_complete = False
        self.final_output: Any = None
        self.current_agent: Agent[Any] | None = None
        self.new_items: list[Any] = []
        self.status: str | None = None
        self._try: _Try | None = None
        self._cancel_mode: str | None = None

    def cancel(self, mode: str = "immediate") -> None:
        """Cancel the run, as ``RunResultStreaming.cancel(mode)`` stops the SDK's own
        (openai-agents-python PR #579 and #2710): :func:`durable.cancel` (by
        ``openai-agents``), which stops the run at its next step boundary, so a model
        request in flight finishes and is recorded. ``mode="immediate"``:
        ``stream_events()`` ends at once and :attr:`is_complete` is true;
        ``"after_turn"``: it goes on with what the run still writes until the run ends
        (cancelled, or done if it ended first). A run that has already ended is left as
        it is. Safe to call inside ``async for``: the database is reached from a thread.
        Raises ``ValueError`` for another ``mode``.
        """
        if mode not in ("immediate", "after_turn"):
            raise ValueError(f"cancel(mode={mode!r}): mode is 'immediate' or 'after_turn'")
        self._cancel_mode = mode
        failure: list[BaseException] = []

        def cancel_run() -> None:
            from django.db import connections

            import durable
            from durable.exceptions import IllegalTransition

            try:
                durable.cancel(self.run_id, by="openai-agents", reason=f"cancel({mode!r})")
            except IllegalTransition:
                pass  # it ended first: nothing to stop
            except BaseException as exc:  # noqa: BLE001 - raised in the caller
                failure.append(exc)
            finally:
                connections.close_all()

        thread = threading.Thread(target=cancel_run, name="durable-oai-cancel")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        if mode == "immediate":
            self.is_complete = True

    def agent(self, name: str) -> Agent[Any]:
        if name not in self.agents:
            self.agents[name] = Agent(name=name)
        return self.agents[name]

    async def stream_events(self) -> AsyncIterator[Any]:
        """The SDK's events of the run from the last one read; see the class."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()  # the reader left: the thread ends at its next event

        def put(item: Any) -> None:
            if not stop.is_set():
                with contextlib.suppress(RuntimeError):  # the reader's loop is closed
                    loop.call_soon_threadsafe(queue.put_nowait, item)

        def read() -> None:
            from django.db import connections

            import durable

            try:
                for event in durable.stream(self.run_id, self.after, poll=self.poll):
                    if stop.is_set():
                        return
                    put(event)
                put((_DONE, durable.get_run(self.run_id)))
            except BaseException as exc:  # noqa: BLE001 - handed to the reader
                put((_DONE, exc))
            finally:
                connections.close_all()

        threading.Thread(target=read, name="durable-oai-follow", daemon=True).start()
        try:
            while True:
                event = await queue.get()
                if isinstance(event, tuple) and event[0] is _DONE:
                    self._end(event[1])
                    return
                self.after = event["seq"]
                for made in self.events_of(event):
                    yield made
                    if self._cancel_mode == "immediate":
                        return
        finally:
            stop.set()

    def _end(self, outcome: Any) -> None:
        if isinstance(outcome, BaseException):
            raise outcome
        from durable.client import RunFailed
        from durable.vocabulary import RunStatus

        self.status = outcome.status
        if outcome.status == RunStatus.SUCCEEDED:
            self.is_complete = True
            output = outcome.output_value()
            is_runner = isinstance(output, dict) and "final_output" in output
            self.final_output = output["final_output"] if is_runner else output
        elif outcome.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            self.is_complete = True
            if outcome.status == RunStatus.CANCELLED and self._cancel_mode:
                return  # cancelled as asked: the end of the stream, not a failure
            raise RunFailed(outcome)

    def events_of(self, event: dict[str, Any]) -> Iterable[Any]:
        """The SDK's events one event of the run's stream makes (none for some)."""
        kind, data = event["kind"], event.get("data") or {}
        if kind == StreamKind.AGENT_UPDATED:
            self.current_agent = self.agent(data["agent"])
            return [AgentUpdatedStreamEvent(new_agent=self.current_agent)]
        if kind == StreamKind.RUN_ITEM:
            item = self._item(data)
            if item is None:
                return []
            self.new_items.append(item)
            return [RunItemStreamEvent(name=data["name"], item=item)]
        if kind == StreamKind.STEP_STARTED or self._try is None:
            self._try = _Try()
        raw = self._try.add(kind, data)
        return [RawResponsesStreamEvent(data=e) for e in raw]

    def _item(self, data: dict[str, Any]) -> Any:
        cls = _ITEMS.get(data.get("type", ""))
        if cls is None:
            return None
        raw = data.get("raw_item")
        agent = self.agent(data.get("agent", ""))
        if cls in (MessageOutputItem, ToolCallItem, HandoffCallItem, ReasoningItem):
            with contextlib.suppress(ValueError):  # else kept as its JSON
                raw = _OUTPUT_ITEM.validate_python(raw, by_alias=True, by_name=True)
        if cls is ToolCallOutputItem:
            return cls(agent=agent, raw_item=raw, output=data.get("output"))
        if cls is HandoffOutputItem:
            return cls(
                agent=agent,
                raw_item=raw,
                source_agent=self.agent(data.get("source_agent", "")),
                target_agent=self.agent(data.get("target_agent", "")),
            )
        return cls(agent=agent, raw_item=raw)


class _Try:
    """One try of a model request, as the Responses API events it streamed."""

    def __init__(self) -> None:
        self.seq = 0
        self.text: list[str] = []
        self.calls: dict[int, ResponseFunctionToolCall] = {}
        self.message_index: int | None = None

    def next(self) -> int:
        self.seq += 1
        return self.seq - 1

    def add(self, kind: str, data: dict[str, Any]) -> list[Any]:
        if kind == StreamKind.STEP_STARTED:
            return [
                ResponseCreatedEvent(
                    type="response.created",
                    response=_response([], usage=None, response_id=None),
                    sequence_number=self.next(),
                )
            ]
        if kind == StreamKind.TOKEN:
            if self.message_index is None:
                self.message_index = len(self.calls)
            self.text.append(data["delta"])
            return [
                ResponseTextDeltaEvent(
                    type="response.output_text.delta",
                    item_id="",
                    output_index=self.message_index,
                    content_index=0,
                    delta=data["delta"],
                    logprobs=[],
                    sequence_number=self.next(),
                )
            ]
        if kind == StreamKind.TOOL_CALL_STARTED:
            index = int(data.get("index") or 0)
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=data.get("id") or "",
                name=data.get("name") or "",
                arguments="",
                status="in_progress",
            )
            self.calls[index] = call
            return [
                ResponseOutputItemAddedEvent(
                    type="response.output_item.added",
                    item=call,
                    output_index=index,
                    sequence_number=self.next(),
                )
            ]
        if kind == StreamKind.TOOL_CALL_DELTA:
            return [
                ResponseFunctionCallArgumentsDeltaEvent(
                    type="response.function_call_arguments.delta",
                    item_id=self._call_id(data),
                    output_index=int(data.get("index") or 0),
                    delta=data["delta"],
                    sequence_number=self.next(),
                )
            ]
        if kind == StreamKind.TOOL_CALL_ENDED:
            return self._call_ended(data)
        if kind == StreamKind.STEP_ENDED:
            return self._ended(data)
        if kind == StreamKind.INTERRUPTED:
            return [
                ResponseErrorEvent(
                    type="error",
                    code=data.get("reason"),
                    message=data.get("message") or "",
                    param=None,
                    sequence_number=self.next(),
                )
            ]
        return []

    def _call_id(self, data: dict[str, Any]) -> str:
        call = self.calls.get(int(data.get("index") or 0))
        return call.call_id if call is not None else ""

    def _call_ended(self, data: dict[str, Any]) -> list[Any]:
        index = int(data.get("index") or 0)
        call = ResponseFunctionToolCall(
            type="function_call",
            call_id=data.get("id") or "",
            name=data.get("name") or "",
            arguments=data.get("arguments") or "",
            status="completed",
        )
        self.calls[index] = call
        done = ResponseFunctionCallArgumentsDoneEvent.model_validate(
            {
                "type": "response.function_call_arguments.done",
                "item_id": call.call_id,
                "output_index": index,
                "arguments": call.arguments,
                "name": call.name,
                "sequence_number": self.next(),
            }
        )
        item_done = ResponseOutputItemDoneEvent(
            type="response.output_item.done",
            item=call,
            output_index=index,
            sequence_number=self.next(),
        )
        return [done, item_done]

    def _ended(self, data: dict[str, Any]) -> list[Any]:
        if "error" in data:
            return [
                ResponseErrorEvent(
                    type="error",
                    code="failed",
                    message=str(data["error"]),
                    param=None,
                    sequence_number=self.next(),
                )
            ]
        output: list[Any] = []
        if self.text:
            text = ResponseOutputText(type="output_text", text="".join(self.text), annotations=[])
            output.append(
                ResponseOutputMessage(
                    id="",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[text],
                )
            )
        output.extend(call for _, call in sorted(self.calls.items()))
        return [
            ResponseCompletedEvent(
                type="response.completed",
                response=_response(output, usage=None, response_id=None, status="completed"),
                sequence_number=self.next(),
            )
        ]
