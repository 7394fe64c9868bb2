"""``DurableAgent``: a PydanticAI agent run as a Durable workflow."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import (
    Agent,
    AgentRunResult,
    DeferredToolRequests,
    DeferredToolResults,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.models import (
    Model,
)
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.usage import RunUsage, UsageLimits
from pydantic_core import to_jsonable_python

from durable import registry
from durable.contrib._bridge import LoopBridge
from durable.contrib.mcp.adapters import McpSafety, linked
from durable.contrib.pydantic_ai import _follow as follow
from durable.contrib.pydantic_ai._follow import AsyncStreamedRun, StreamedRun
from durable.contrib.pydantic_ai._mcp import check_mcp_toolsets, durable_mcp, is_mcp
from durable.contrib.pydantic_ai._options import (
    StepSettings,
    load_deps,
    load_usage_limits,
    store_deps,
    store_model_settings,
    store_usage_limits,
    toolset_ids,
)
from durable.contrib.pydantic_ai._steps import DurableModel, DurableToolset, _Session
from durable.retry import RetryPolicy
from durable.types import Decision


@dataclass(frozen=True)
class DurableAgentResult:
    """A finished run: ``output`` (of the agent's output type) and ``messages``
    (the whole history, ``list[ModelMessage]``, as PydanticAI's ``all_messages()``)."""

    output: Any
    messages: list[ModelMessage]


class DurableAgent:
    """Wrap a PydanticAI ``Agent`` so that a run of it is the Durable workflow ``name``.

    ``DurableAgent(agent, name="support-agent", version="1")`` registers the workflow
    (input ``{"prompt": str, "message_history": [...] | None}`` plus the run options
    :meth:`start` stores; output ``{"output": <JSON>, "messages": [...]}``, the messages
    in PydanticAI's JSON form). The agent needs its model set (``Agent("openai:...",
    ...)``, a ``TestModel``...). ``approval_timeout`` (seconds) bounds each approval,
    ``None``: no limit. ``model``: the model to use instead of the agent's, or a factory
    of it called at each execution (so a provider reads its settings, e.g.
    ``OPENAI_BASE_URL``, when the run executes, not when the module is imported); one of
    the two is required. ``deps_factory``: called at each execution (on the agent's
    event loop) with what ``start(deps=...)`` stored, it returns the run's deps -- for
    deps that cannot be stored (an ``httpx.AsyncClient``, a connection); without it the
    stored deps are rebuilt into the agent's ``deps_type``. ``toolsets``: toolsets a
    run may add with ``start(toolsets=...)``, each with a unique ``id``. ``models``: the
    models a run may choose with ``start(model=...)`` by name (each a ``Model`` or a
    factory of one, as ``model``), as Temporal's ``TemporalDurability(models=...)``.

    Step settings (as PydanticAI's Temporal integration's activity configs):
    ``model_step`` (:class:`StepSettings`: timeout, retry policy) for each model request;
    ``tool_step`` for each tool call, overridden per tool by ``tool_steps`` (tool name ->
    settings) or by the tool's own ``metadata={"durable": StepSettings(...)}``;
    ``tool_retry`` is ``tool_step``'s retry policy (kept for existing callers). A
    ``durable_tool`` keeps its registered tool's own policy.

    Streaming (docs/streaming.md): ``event_stream_handler`` (instead of the agent's own)
    gets PydanticAI's events of every run, in the worker: a model request's events live
    from the model inside its step, the tool calls' events as the agent makes them; a
    replay hands it the events derived from the records (one ``PartStartEvent`` per part,
    whole). ``event_stream_handlers``: handlers a run may choose by name with
    ``start(event_stream_handler=...)``. A run with a handler, or started with
    ``stream=True`` (``run_stream``), or of an agent built with ``stream=True``, writes
    each model request to the run's stream as it arrives; the step records the same
    ``ModelResponse`` as an unstreamed request.

    MCP servers (PydanticAI's ``MCPToolset``, with an ``id``, among the agent's toolsets
    or ``toolsets=``): the listing is the recorded step ``"<id>.tools/list"`` and each call
    is the Durable tool ``"<id>.<tool>"`` (ledger, idempotency key, approval), as
    :class:`~durable.contrib.mcp.McpTools`; ``mcp_safety`` (toolset id ->
    :class:`~durable.contrib.mcp.McpSafety`) gives each server's safety classes and
    approvals (default: every tool ``unsafe_write``, no approval). See docs/mcp.md.

    The tool calls of one model response run as one ``ctx.parallel`` group (recorded in
    the order of the calls): reads at once, at most ``tool_concurrency`` of them
    (``None``: all), writes of ``durable_tool``s one by one. The calls needing approval
    are in the inbox together, and the run continues once all are decided.

    An agent with output validators declares ``DeferredToolRequests`` in its own
    ``output_type`` (PydanticAI refuses a run's ``output_type`` then); any other agent
    gets it added at each run.

    Raises :class:`~durable.DurableConfigurationError` for a bad name or version,
    ``ValueError`` for an agent without a model, two toolsets with one id, or output
    validators without ``DeferredToolRequests`` in its output type.
    """

    def __init__(
        self,
        agent: Agent[Any, Any],
        *,
        name: str,
        version: str = "1",
        durability: str = "sync",
        approval_timeout: float | None = None,
        model: Model | Callable[[], Model] | None = None,
        tool_retry: RetryPolicy | None = None,
        deps_factory: Callable[[Any], Any] | None = None,
        toolsets: Sequence[AbstractToolset[Any]] = (),
        model_step: StepSettings | None = None,
        tool_step: StepSettings | None = None,
        tool_steps: Mapping[str, StepSettings] | None = None,
        tool_concurrency: int | None = None,
        models: Mapping[str, Model | Callable[[], Model]] | None = None,
        event_stream_handler: EventStreamHandler[Any] | None = None,
        event_stream_handlers: Mapping[str, EventStreamHandler[Any]] | None = None,
        stream: bool = False,
        mcp_safety: Mapping[str, McpSafety] | None = None,
    ) -> None:
        if agent.model is None and model is None:
            raise ValueError(f"DurableAgent {name!r}: the agent has no model; pass model=")
        self.agent = agent
        self.model = model
        self.models = dict(models or {})
        self.name = name
        self.version = str(version)
        self.approval_timeout = approval_timeout
        self.tool_retry = tool_retry
        self.deps_factory = deps_factory
        self.model_step = model_step or StepSettings()
        self.tool_step = (tool_step or StepSettings()).over(StepSettings(retry=tool_retry))
        self.tool_steps = dict(tool_steps or {})
        self.tool_concurrency = tool_concurrency
        self.event_stream_handler = event_stream_handler or agent.event_stream_handler
        self.event_stream_handlers = dict(event_stream_handlers or {})
        self.always_stream = stream
        self.mcp_safety = dict(mcp_safety or {})
        self.toolsets: dict[str, AbstractToolset[Any]] = {}
        for toolset in toolsets:
            if not toolset.id or toolset.id in self.toolsets:
                raise ValueError(
                    f"DurableAgent {name!r}: each of toolsets= needs a unique id "
                    f"(FunctionToolset(id=...)); {toolset!r} has {toolset.id!r}"
                )
            self.toolsets[toolset.id] = toolset
        check_mcp_toolsets(name, [*agent.toolsets, *self.toolsets.values()])
        output_type = agent.output_type
        declared = list(output_type) if isinstance(output_type, Sequence) else [output_type]
        self._output_types: list[Any] = [t for t in declared if t is not DeferredToolRequests]
        #: the agent's own output type allows DeferredToolRequests: a run uses its schema
        #: (PydanticAI refuses a run's output_type for an agent with output validators)
        self._own_schema = len(self._output_types) != len(declared)
        if not self._own_schema and getattr(agent, "_output_validators", None):
            raise ValueError(
                f"DurableAgent {name!r}: an agent with output validators needs "
                "DeferredToolRequests in its own output_type (Agent(..., output_type=[..., "
                "DeferredToolRequests])): approvals end a turn with DeferredToolRequests, "
                "and PydanticAI refuses a run's output_type when the agent has validators"
            )

        def run_agent(ctx: Any, input: Any) -> Any:
            return self._run(ctx, input)

        run_agent.__qualname__ = f"DurableAgent[{name}]"
        registry.workflow(name=name, version=self.version, durability=durability)(run_agent)

    # ------------------------------------------------------------- the SDK face

    def start(
        self,
        prompt: str | None,
        *,
        run_id: str | None = None,
        message_history: Sequence[ModelMessage] | None = None,
        deps: Any = None,
        usage_limits: UsageLimits | None = None,
        model_settings: ModelSettings | None = None,
        toolsets: Sequence[AbstractToolset[Any] | str] | None = None,
        model: Model | str | None = None,
        event_stream_handler: EventStreamHandler[Any] | str | None = None,
        stream: bool = False,
        **options: Any,
    ) -> Any:
        """Start a run (``durable.start``; idempotent on ``run_id``); returns the Run.

        The options are PydanticAI's ``Agent.run`` options, stored with the run so that
        every execution (a resume, a recovery on another worker) passes the same:
        ``deps`` (the agent's ``deps_type``; see the class for ``deps_factory``),
        ``usage_limits`` (counted over the whole run, across its approvals),
        ``model_settings`` (a JSON-able dict: a timeout in seconds, not an
        ``httpx.Timeout``) and ``toolsets`` (registered with the agent, given as
        themselves or their ids), ``model`` (a name of ``models=``, one of those models,
        or a PydanticAI model name such as ``"openai:gpt-4o"``, built at each execution),
        ``event_stream_handler`` (a name of ``event_stream_handlers=``, or one of them),
        ``stream`` (each model request streams to the run's stream, ``durable.stream``).
        ``options``: ``durable.start``'s (``started_by``,
        ``tags``, budgets).

        Raises :class:`~durable.PayloadError` naming the field of ``deps`` or
        ``model_settings`` that cannot be stored, ``ValueError`` for a toolset, a model
        instance or an event stream handler that is not registered, ``TypeError`` for
        ``usage_limits`` that are not a ``UsageLimits``; no run is written then.
        """
        from durable import start

        history = (
            ModelMessagesTypeAdapter.dump_python(list(message_history), mode="json")
            if message_history
            else None
        )
        given: dict[str, Any] = {
            "deps": None
            if deps is None
            else store_deps(deps, self.agent.deps_type, factory=self.deps_factory is not None),
            "usage_limits": store_usage_limits(usage_limits),
            "model_settings": store_model_settings(model_settings),
            "toolsets": toolset_ids(toolsets, self.toolsets),
            "model": self._model_name(model),
            "event_stream_handler": self._handler_name(event_stream_handler),
            "stream": True if stream else None,
        }
        # only the options given: the input of a run without them is as before
        stored = {k: v for k, v in given.items() if v is not None}
        return start(
            self.name, {"prompt": prompt, "message_history": history, **stored}, run_id, **options
        )

    def _model_name(self, model: Model | str | None) -> str | None:
        """What a run stores of ``start(model=...)``: a registered model's name, or a
        PydanticAI model name (``"openai:gpt-4o"``); ``ValueError`` for an instance that
        is not registered (it cannot be stored)."""
        if model is None or isinstance(model, str):
            return model
        for name, registered in self.models.items():
            if registered is model:
                return name
        raise ValueError(
            f"model: {model!r} is not one of the agent's registered models "
            f"({sorted(self.models) or 'none'}); a model instance cannot be stored with the "
            "run: register it with DurableAgent(..., models={name: model}) or pass a model name"
        )

    def _handler_name(self, handler: EventStreamHandler[Any] | str | None) -> str | None:
        """What a run stores of ``start(event_stream_handler=...)``: a registered name."""
        if handler is None:
            return None
        for name, registered in self.event_stream_handlers.items():
            if handler == name or registered is handler:
                return name
        raise ValueError(
            f"event_stream_handler: {handler!r} is not one of the agent's registered handlers "
            f"({sorted(self.event_stream_handlers) or 'none'}); a function cannot be stored "
            "with the run: register it with DurableAgent(..., event_stream_handlers={name: fn}) "
            "and pass its name"
        )

    # ------------------------------------------------------------- following a run

    @property
    def output_types(self) -> list[Any]:
        """The agent's output types (without ``DeferredToolRequests``)."""
        return list(self._output_types)

    def run_stream(self, prompt: str | None, **options: Any) -> Any:
        """PydanticAI's ``run_stream`` for a durable run: ``async with
        agent.run_stream(prompt) as result:`` starts the run (:meth:`start`'s options,
        with ``stream=True``) and ``result`` (an :class:`AsyncStreamedRun`) follows it:
        ``stream_text()``, ``stream_output()``, ``get_output()``. Refused inside a
        workflow (``UserError``): there, set an ``event_stream_handler``."""
        return follow.run_stream(self, prompt, options)

    def run_stream_sync(self, prompt: str | None, **options: Any) -> StreamedRun:
        """PydanticAI's ``run_stream_sync``: starts the run as :meth:`run_stream` does
        and returns a :class:`StreamedRun` (``stream_text()`` ... synchronous)."""
        return follow.run_stream_sync(self, prompt, options)

    def stream(
        self, run_id: str, *, after: int = 0, poll: float = 0.25, timeout: float | None = None
    ) -> StreamedRun:
        """Follow the run ``run_id`` (started by anyone) from the event after ``after``
        (``durable.stream``'s arguments): a :class:`StreamedRun`."""
        return StreamedRun(self, run_id, after=after, poll=poll, timeout=timeout)

    def astream(
        self, run_id: str, *, after: int = 0, poll: float = 0.25, timeout: float | None = None
    ) -> AsyncStreamedRun:
        """:meth:`stream` for ``async`` code: an :class:`AsyncStreamedRun`."""
        return AsyncStreamedRun(self, run_id, after=after, poll=poll, timeout=timeout)

    def result(self, run_id: str, timeout: float | None = 60.0) -> DurableAgentResult:
        """Wait up to ``timeout`` seconds for the run; its output validated into the
        agent's output type. Raises :class:`durable.RunFailed` as ``durable.result``."""
        from durable import result

        return self.decode(result(run_id, timeout))

    def decode(self, output: Any) -> DurableAgentResult:
        """A workflow output (``{"output", "messages"}``) as a :class:`DurableAgentResult`."""
        value = output["output"]
        if len(self._output_types) == 1 and self._output_types[0] is not str:
            value = TypeAdapter(self._output_types[0]).validate_python(value)
        return DurableAgentResult(
            value, ModelMessagesTypeAdapter.validate_python(output["messages"])
        )

    # ------------------------------------------------------------- the workflow

    def _run(self, ctx: Any, input: Any) -> Any:
        if not isinstance(input, dict) or "prompt" not in input:
            raise ValueError(
                f"DurableAgent {self.name!r}: input must be "
                '{"prompt": str, "message_history": [...] | None}'
            )
        unknown = [t for t in input.get("toolsets") or () if t not in self.toolsets]
        if unknown:
            raise ValueError(
                f"DurableAgent {self.name!r}: the run's toolsets {unknown} are not registered "
                f"on this worker (registered: {sorted(self.toolsets)})"
            )
        bridge = LoopBridge()
        session = _Session(
            ctx,
            bridge,
            model_step=self.model_step,
            tool_step=self.tool_step,
            tool_steps=self.tool_steps,
            tool_concurrency=self.tool_concurrency,
            handler=self._handler(input.get("event_stream_handler")),
        )
        session.stream = bool(self.always_stream or input.get("stream") or session.handler)
        history_data = input.get("message_history")
        history = ModelMessagesTypeAdapter.validate_python(history_data) if history_data else None
        with linked(session.mcp_links):
            return bridge.run(lambda: self._converse(session, input, history))

    async def _converse(
        self, session: _Session, input: dict[str, Any], history: list[ModelMessage] | None
    ) -> Any:
        agent = self.agent
        prompt: str | None = input.get("prompt")
        chosen: Any = self.model if self.model is not None else agent.model
        if input.get("model") is not None:
            name = input["model"]
            chosen = self.models.get(name, name)  # else a model name, as "openai:gpt-4o"
        if chosen is not None and not isinstance(chosen, Model | str) and callable(chosen):
            chosen = chosen()
        model = DurableModel(chosen if isinstance(chosen, Model) else _infer(chosen), session)
        extra = [self.toolsets[t] for t in input.get("toolsets") or ()]
        toolsets: list[AbstractToolset[Any]] = [
            durable_mcp(toolset, session, self.mcp_safety)
            if is_mcp(toolset)
            else DurableToolset(toolset, session=session)
            for toolset in [*agent.toolsets, *extra]
        ]
        deps = load_deps(input.get("deps"), agent.deps_type, self.deps_factory)
        if inspect.isawaitable(deps):
            deps = await deps
        options: dict[str, Any] = {
            "deps": deps,
            "usage_limits": load_usage_limits(input.get("usage_limits")),
            "model_settings": input.get("model_settings"),
        }
        output_type = None if self._own_schema else [*self._output_types, DeferredToolRequests]
        results: DeferredToolResults | None = None
        usage: RunUsage | None = None
        with (
            agent.override(model=model, tools=[], toolsets=toolsets),
            # a turn's calls as one parallel group, settled in the order of the calls
            ToolManager.parallel_execution_mode("parallel_ordered_events"),
        ):
            for turn in itertools.count(1):
                run: AgentRunResult[Any] = await agent.run(
                    prompt,
                    message_history=history,
                    deferred_tool_results=results,
                    output_type=output_type,
                    conversation_id=session.ctx.run_id,  # the same on every replay
                    run_id=f"{session.ctx.run_id}:{turn}",
                    usage=usage,  # the limits count the whole run, not one turn
                    event_stream_handler=session.handler,
                    **options,
                )
                history = run.all_messages()
                usage = run.usage
                if not isinstance(run.output, DeferredToolRequests):
                    return {
                        "output": to_jsonable_python(run.output),
                        "messages": ModelMessagesTypeAdapter.dump_python(history, mode="json"),
                    }
                requests = run.output
                results = await session.bridge.call(
                    functools.partial(self._decide, session.ctx, requests)
                )
                prompt = None
        raise AssertionError("unreachable")  # pragma: no cover

    def _handler(self, name: str | None) -> EventStreamHandler[Any] | None:
        if name is None:
            return self.event_stream_handler
        if name not in self.event_stream_handlers:
            raise ValueError(
                f"DurableAgent {self.name!r}: the run's event_stream_handler {name!r} is not "
                f"registered on this worker (registered: {sorted(self.event_stream_handlers)})"
            )
        return self.event_stream_handlers[name]

    def _decide(self, ctx: Any, requests: DeferredToolRequests) -> DeferredToolResults:
        """Ask the inbox about each call needing approval (workflow thread); a deferred
        external call waits for the signal ``tool-result:<tool_call_id>``."""
        asked = [(call, call.args_as_dict()) for call in requests.approvals]
        decisions: list[Decision] = ctx.wait_for_approvals(
            [
                {
                    "key": f"{call.tool_name}:{call.tool_call_id}",
                    "title": f"Run {call.tool_name}",
                    "payload": _payload(
                        call.tool_name, args, requests.metadata.get(call.tool_call_id)
                    ),
                    "allow_edit": True,
                    "timeout": self.approval_timeout,
                }
                for call, args in asked
            ]
        )
        approvals: dict[str, ToolApproved | ToolDenied] = {
            call.tool_call_id: _answer(call.tool_name, args, decision)
            for (call, args), decision in zip(asked, decisions, strict=True)
        }
        calls: dict[str, Any] = {}
        for call in requests.calls:
            calls[call.tool_call_id] = ctx.wait_for_signal(f"tool-result:{call.tool_call_id}")
        return DeferredToolResults(approvals=dict(approvals), calls=calls)


def _payload(tool: str, args: dict[str, Any], metadata: Any) -> dict[str, Any]:
    """What the inbox shows: the call, and the metadata its ``ApprovalRequired`` gave."""
    payload = {"tool": tool, "params": args}
    return {**payload, "metadata": metadata} if metadata else payload


def _answer(tool: str, args: dict[str, Any], decision: Decision) -> ToolApproved | ToolDenied:
    """A decision as PydanticAI's approval result: edits as ``override_args``."""
    if not decision.approved:
        who = ", ".join(decision.decided_by) or "an approver"
        reason = f": {decision.comment}" if decision.comment else ""
        return ToolDenied(f"The call to {tool} was rejected by {who}{reason}")
    edited = decision.edited
    if isinstance(edited, dict) and isinstance(edited.get("params"), dict):
        edited = edited["params"]
    if isinstance(edited, dict) and edited != args:
        return ToolApproved(override_args=edited)
    return ToolApproved()


def _infer(model: Any) -> Model:
    from pydantic_ai.models import infer_model

    return infer_model(model)
