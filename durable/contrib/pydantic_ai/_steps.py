"""The durable steps of an agent run: model requests and tool calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from pydantic import TypeAdapter
from pydantic_ai import (
    ApprovalRequired,
    CallDeferred,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ModelRetry,
    RunContext,
    ToolCallPart,
    ToolDenied,
    ToolFailed,
    ToolReturn,
)
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import to_jsonable_python

from durable.calls import Call, tool_call
from durable.calls import call as durable_call
from durable.contrib._bridge import LoopBridge, with_key
from durable.contrib.pydantic_ai._options import StepSettings, tool_settings
from durable.contrib.pydantic_ai._stream import stream_request, usage_data
from durable.exceptions import PermanentError, StepTimeout
from durable.types import ModelRecoverable

try:  # the optional extra durable[otel]; PydanticAI depends on opentelemetry-api itself
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover
    otel_context = None  # type: ignore[assignment]
    otel_trace = None  # type: ignore[assignment]

T = TypeVar("T")

#: a tool's ``ToolReturn`` (value, content for the model, metadata for the application)
_TOOL_RETURN: TypeAdapter[ToolReturn] = TypeAdapter(ToolReturn)

#: the metadata key marking a PydanticAI tool that stands for a registered ``@durable.tool``
DURABLE_TOOL_KEY = "durable_tool"


def in_span(fn: Callable[[], T], *, parent: bool = False) -> Callable[[], T]:
    """``fn`` bound to the caller's OpenTelemetry context (``parent``: to its current
    span's parent, when the SDK knows it), to run on another thread."""
    if otel_context is None:  # pragma: no cover - without the durable[otel] extra
        return fn
    captured = otel_context.get_current()
    above = getattr(otel_trace.get_current_span(), "parent", None)
    if parent and above is not None:
        captured = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(above))

    def bound() -> T:
        token = otel_context.attach(captured)
        try:
            return fn()
        finally:
            otel_context.detach(token)

    return bound


@dataclass
class _Session:
    """One execution of one agent run: the workflow's ctx, the bridge to its thread, and
    the step settings of its model requests and tool calls."""

    ctx: Any
    bridge: LoopBridge
    model_step: StepSettings = field(default_factory=StepSettings)
    tool_step: StepSettings = field(default_factory=StepSettings)
    tool_steps: dict[str, StepSettings] = field(default_factory=dict)
    #: at most this many of a turn's tool calls run at once (None: all of them)
    tool_concurrency: int | None = None
    #: every model request streams to the run's stream, even one PydanticAI sends whole
    stream: bool = False
    #: the run's ``event_stream_handler``: it gets a streamed request's events live,
    #: inside the step
    handler: EventStreamHandler[Any] | None = None
    #: the MCP toolsets' listings of this execution, by prefix (one step each)
    mcp_tools: dict[str, Any] = field(default_factory=dict)
    #: the MCP toolsets' connections, by prefix, for their Durable tools' bodies
    mcp_links: dict[str, Any] = field(default_factory=dict)
    #: the RunContexts of the MCP calls made and not yet run, by (prefix, tool)
    mcp_contexts: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    turn: _Turn = field(init=False)

    def __post_init__(self) -> None:
        self.turn = _Turn(self)

    def tool_settings(self, name: str, metadata: dict[str, Any] | None) -> StepSettings:
        """A tool's settings: ``tool_steps[name]``, else its metadata's, over ``tool_step``."""
        own = self.tool_steps.get(name) or tool_settings(metadata)
        return own.over(self.tool_step) if own is not None else self.tool_step

    async def step(self, step_id: str, body: Callable[..., Any], settings: StepSettings) -> Any:
        return await self.call(lambda: self.ctx.step(step_id, body, retry=settings.retry))

    async def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the workflow thread, inside the agent's current OpenTelemetry span
        (PydanticAI's ``chat``/``execute_tool`` span when instrumented): the step's span
        is its child, in the run's trace."""
        return await self.bridge.call(in_span(fn))

    def on_loop(self, make: Callable[[], Awaitable[T]], settings: StepSettings, what: str) -> T:
        """From a step's body: ``make()`` on the agent's loop, cancelled at the settings'
        timeout (then :class:`~durable.StepTimeout`, tried again under the retry policy)."""
        timeout = settings.timeout
        if timeout is None:
            return self.bridge.run_on_loop(make)

        async def bounded() -> T:
            try:
                return await asyncio.wait_for(make(), timeout)
            except TimeoutError:
                raise StepTimeout(f"{what} did not finish within {timeout:g} s") from None

        return self.bridge.run_on_loop(bounded)


def _stamps(messages: list[ModelMessage]) -> list[list[str]]:
    """The timestamps of the requests sent (ISO 8601), each request's then its parts'."""
    return [
        [m.timestamp.isoformat() if m.timestamp else ""]
        + [p.timestamp.isoformat() for p in m.parts if hasattr(p, "timestamp")]
        for m in messages
        if isinstance(m, ModelRequest)
    ]


def _pin_stamps(messages: list[ModelMessage], stamps: list[list[str]]) -> None:
    """Give a replayed run's requests the timestamps they had when the model saw them,
    so the history a resumed run ends with is the one its model requests recorded."""
    requests = [m for m in messages if isinstance(m, ModelRequest)]
    for message, recorded in zip(requests, stamps, strict=False):
        if recorded and recorded[0]:
            message.timestamp = datetime.fromisoformat(recorded[0])
        parts = [p for p in message.parts if hasattr(p, "timestamp")]
        for part, stamp in zip(parts, recorded[1:], strict=False):
            part.timestamp = datetime.fromisoformat(stamp)


def _dump_response(response: ModelResponse) -> Any:
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]


def _load_response(data: Any) -> ModelResponse:
    message = ModelMessagesTypeAdapter.validate_python([data])[0]
    assert isinstance(message, ModelResponse)
    return message


class DurableModel(WrapperModel):
    """A model whose requests are durable steps named ``model`` (``model#2``, ...)."""

    def __init__(self, model: Model, session: _Session) -> None:
        super().__init__(model)
        self._session = session

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        if self._session.stream:  # the run streams: the same record, written live
            response, _ = await self._streamed(
                messages, model_settings, model_request_parameters, None
            )
            return response
        wrapped = self.wrapped
        session = self._session
        settings = session.model_step

        def body() -> Any:
            async def send() -> ModelResponse:
                return await wrapped.request(messages, model_settings, model_request_parameters)

            response = _dump_response(session.on_loop(send, settings, "the model request"))
            return {"response": response, "stamps": _stamps(messages)}

        return self._loaded(messages, await session.step("model", body, settings))

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse]:
        response, live = await self._streamed(
            messages, model_settings, model_request_parameters, run_context
        )
        # a live try handed its events to the handler inside the step: the graph's stream
        # is then empty (as DBOS's); a replay, or no handler, derives them from the record
        replay = not live or self._session.handler is None
        yield CompletedStreamedResponse(
            response, model_request_parameters=model_request_parameters, replay_events=replay
        )

    async def _streamed(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None,
    ) -> tuple[ModelResponse, bool]:
        """The step ``model`` of a streamed request, and whether this execution asked the
        model (``False``: the recorded response, replayed)."""
        wrapped = self.wrapped
        session = self._session
        settings = session.model_step
        ctx = session.ctx
        live = False

        def body(*, idempotency_key: str) -> Any:
            nonlocal live
            live = True
            step_id = idempotency_key[len(ctx.run_id) + 1 :]  # "{run_id}:{step_id}"
            with ctx._step_stream(step_id, model=wrapped.model_name) as out:

                def send() -> Awaitable[ModelResponse]:
                    return stream_request(
                        wrapped,
                        messages,
                        model_settings,
                        parameters,
                        run_context,
                        emit=out.emit,
                        handler=session.handler,
                    )

                response = session.on_loop(send, settings, "the model request")
                out.end(finish_reason=response.finish_reason, usage=usage_data(response.usage))
            return {"response": _dump_response(response), "stamps": _stamps(messages)}

        recorded = await session.step("model", body, settings)
        return self._loaded(messages, recorded), live

    @staticmethod
    def _loaded(messages: list[ModelMessage], recorded: Any) -> ModelResponse:
        if isinstance(recorded, ModelRecoverable):  # a 400/422: the request was refused
            raise PermanentError(f"the model refused the request: {recorded.message}")
        _pin_stamps(messages, recorded["stamps"])
        return _load_response(recorded["response"])


@dataclass
class DurableToolset(WrapperToolset[Any]):
    """A toolset whose calls are durable steps named ``tool:<name>``.

    A tool marked by :func:`durable_tool` is ``ctx.call_tool`` (its safety class, ledger
    and approval); any other tool's call is a ``ctx.step`` recording its JSON-able
    result (a ``ToolReturn`` with its content and metadata), or that it asked for
    approval, was deferred, asked the model to retry or failed (``ToolFailed``: the
    model sees the failure; the step is not tried again).
    """

    session: _Session | None = None

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        session = self.session
        assert session is not None
        order = _order(ctx)
        durable_name = (tool.tool_def.metadata or {}).get(DURABLE_TOOL_KEY)
        if durable_name:
            call = tool_call(str(durable_name), dict(tool_args), step_id=f"tool:{name}")
            result = await session.turn.run(call, order)
            if isinstance(result, ModelRecoverable):
                if result.error_type == "ApprovalRejected":  # the inbox said no: a denial
                    return ToolDenied(result.message)
                raise ModelRetry(result.message)
            return to_jsonable_python(result)
        wrapped = self.wrapped
        settings = session.tool_settings(name, tool.tool_def.metadata)

        def body(*, idempotency_key: str) -> Any:
            async def run() -> Any:
                try:
                    result = await with_key(
                        idempotency_key, lambda: wrapped.call_tool(name, tool_args, ctx, tool)
                    )
                except ApprovalRequired as exc:
                    return {"approval": exc.metadata}
                except CallDeferred as exc:
                    return {"deferred": exc.metadata, "kind": exc.kind}
                except ModelRetry as exc:
                    return {"retry": exc.message}
                except ToolFailed as exc:  # a terminal failure the model sees, not retried
                    return {"failed": exc.message}
                if isinstance(result, ToolReturn):  # its metadata and content kept
                    return {"tool_return": _TOOL_RETURN.dump_python(result, mode="json")}
                return {"return": to_jsonable_python(result)}

            return session.on_loop(run, settings, f"the tool call {name}")

        step = durable_call(body, step_id=f"tool:{name}", retry=settings.retry)
        outcome = await session.turn.run(step, order)
        if "approval" in outcome:
            raise ApprovalRequired(outcome["approval"])
        if "deferred" in outcome:
            raise CallDeferred(outcome["deferred"], kind=outcome.get("kind") or "external")
        return tool_outcome(outcome)


def tool_outcome(outcome: dict[str, Any]) -> Any:
    """A tool call's recorded outcome as PydanticAI takes it: ``{"retry": message}``
    raises ``ModelRetry``, ``{"failed": message}`` ``ToolFailed``; ``{"tool_return":
    json}`` is the ``ToolReturn`` again, ``{"return": value}`` the value."""
    if "retry" in outcome:
        raise ModelRetry(outcome["retry"])
    if "failed" in outcome:
        raise ToolFailed(outcome["failed"])
    if "tool_return" in outcome:
        return _TOOL_RETURN.validate_python(outcome["tool_return"])
    return outcome["return"]


def _order(ctx: RunContext[Any]) -> int:
    """The call's place among the tool calls of the model response it answers."""
    for message in reversed(ctx.messages):
        if isinstance(message, ModelResponse):
            ids = [p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart)]
            return ids.index(ctx.tool_call_id) if ctx.tool_call_id in ids else len(ids)
    return 0


#: event-loop rounds without a new call after which a turn's group is complete: every
#: tool call of a model turn is a task PydanticAI starts at once, and each reaches its
#: toolset without waiting for anything outside the loop
_SETTLE_ROUNDS = 3


@dataclass
class _Pending:
    order: int
    call: Call
    future: asyncio.Future[Any]


@dataclass
class _Turn:
    """Gathers the tool calls of one model turn into one ``ctx.parallel`` group."""

    session: _Session
    pending: list[_Pending] = field(default_factory=list)

    async def run(self, call: Call, order: int) -> Any:
        """``call``'s result, run in the group of the calls made alongside it."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append(_Pending(order, call, future))
        if len(self.pending) == 1:  # the first call of the group gathers and runs it
            await self._gather_and_run()
        return await future

    async def _gather_and_run(self) -> None:
        seen, still = len(self.pending), 0
        while still < _SETTLE_ROUNDS:
            await asyncio.sleep(0)
            seen, still = (seen, still + 1) if len(self.pending) == seen else (len(self.pending), 0)
        # in the order of the model's calls: positions (and step ids) the same on replay
        group, self.pending = sorted(self.pending, key=lambda p: p.order), []
        ctx = self.session.ctx
        run_group = lambda: ctx.parallel([p.call for p in group], self.session.tool_concurrency)  # noqa: E731
        try:
            if len(group) == 1:  # its step's span under the call's own span
                results = await self.session.call(run_group)
            else:  # the group's under the span the calls were made in (the agent run's)
                results = await self.session.bridge.call(in_span(run_group, parent=True))
        except BaseException as exc:  # the run fails or stops: every call of it does
            for p in group:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        for p, result in zip(group, results, strict=True):
            p.future.set_result(result)
