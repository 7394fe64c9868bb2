"""PydanticAI agents as Durable workflows: every model request and tool call is a step.

Invariant: a run of a :class:`DurableAgent` replays to the same state after a crash.
Model requests go through a wrapped ``Model`` whose ``request`` is one ``ctx.step``
recording the ``ModelResponse`` in PydanticAI's own serialisation
(``ModelMessagesTypeAdapter``), and tool calls through wrapped toolsets whose
``call_tool`` is one step (a ``@durable.tool`` is ``ctx.call_tool``, with its safety
class, ledger and approval), so no model request is paid twice and no tool repeated.
Tools run one at a time (``parallel_execution_mode('sequential')``): the order of the
steps is then the order of the calls, the same on every replay. Approvals use
PydanticAI's deferred tools: a run that ends with ``DeferredToolRequests`` waits for
a decision in the inbox and continues with ``DeferredToolResults`` (``ToolApproved``
with the edited arguments, ``ToolDenied`` with the reason), as PydanticAI expects.
Mirrors ``pydantic_ai.durable_exec`` (``TemporalAgent``, ``DBOSAgent``); needs the
``durable[pydantic-ai]`` extra, and the core never imports this module.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import typing
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import (
    Agent,
    AgentRunResult,
    ApprovalRequired,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ModelRetry,
    RunContext,
    Tool,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import to_jsonable_python

from durable import registry
from durable.contrib._bridge import LoopBridge, current_idempotency_key, with_key
from durable.retry import RetryPolicy
from durable.types import Decision, ModelRecoverable

__all__ = [
    "DurableAgent",
    "DurableAgentResult",
    "current_idempotency_key",
    "durable_tool",
]

#: the metadata key marking a PydanticAI tool that stands for a registered ``@durable.tool``
DURABLE_TOOL_KEY = "durable_tool"


@dataclass
class _Session:
    """One execution of one agent run: the workflow's ctx and the bridge to its thread."""

    ctx: Any
    bridge: LoopBridge
    #: the retry policy of the agent's tool steps (None: the default step's)
    tool_retry: RetryPolicy | None = None

    async def step(
        self, step_id: str, body: Callable[..., Any], retry: RetryPolicy | None = None
    ) -> Any:
        return await self.bridge.call(lambda: self.ctx.step(step_id, body, retry=retry))


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
        wrapped = self.wrapped
        bridge = self._session.bridge

        def body() -> Any:
            async def send() -> ModelResponse:
                return await wrapped.request(messages, model_settings, model_request_parameters)

            response = _dump_response(bridge.run_on_loop(send))
            return {"response": response, "stamps": _stamps(messages)}

        recorded = await self._session.step("model", body)
        _pin_stamps(messages, recorded["stamps"])
        return _load_response(recorded["response"])

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse]:
        # a stream cannot be replayed: the step records the whole response, and the
        # stream yields it as events once it is complete
        response = await self.request(messages, model_settings, model_request_parameters)
        yield CompletedStreamedResponse(
            response, model_request_parameters=model_request_parameters, replay_events=True
        )


@dataclass
class DurableToolset(WrapperToolset[Any]):
    """A toolset whose calls are durable steps named ``tool:<name>``.

    A tool marked by :func:`durable_tool` is ``ctx.call_tool`` (its safety class, ledger
    and approval); any other tool's call is a ``ctx.step`` recording its JSON-able
    result, or that it asked for approval, was deferred, or asked the model to retry.
    """

    session: _Session | None = None

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        session = self.session
        assert session is not None
        durable_name = (tool.tool_def.metadata or {}).get(DURABLE_TOOL_KEY)
        if durable_name:
            return await self._call_durable_tool(session, name, str(durable_name), tool_args)
        wrapped = self.wrapped

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
                return {"return": to_jsonable_python(result)}

            return session.bridge.run_on_loop(run)

        outcome = await session.step(f"tool:{name}", body, session.tool_retry)
        if "approval" in outcome:
            raise ApprovalRequired(outcome["approval"])
        if "deferred" in outcome:
            raise CallDeferred(outcome["deferred"], kind=outcome.get("kind") or "external")
        if "retry" in outcome:
            raise ModelRetry(outcome["retry"])
        return outcome["return"]

    @staticmethod
    async def _call_durable_tool(
        session: _Session, name: str, durable_name: str, tool_args: dict[str, Any]
    ) -> Any:
        result = await session.bridge.call(
            lambda: session.ctx.call_tool(durable_name, dict(tool_args), step_id=f"tool:{name}")
        )
        if isinstance(result, ModelRecoverable):
            if result.error_type == "ApprovalRejected":  # the inbox said no: a denial
                return ToolDenied(result.message)
            raise ModelRetry(result.message)
        return to_jsonable_python(result)


def durable_tool(tool: str | Callable[..., Any], *, name: str | None = None) -> Tool[Any]:
    """A PydanticAI ``Tool`` that calls the registered ``@durable.tool`` ``tool``.

    ``tool``: the tool's registered name or its decorated function; ``name``: the name
    the model sees (default: the registered name with dots as underscores). Its schema
    is the tool function's signature without ``idempotency_key``. Inside a
    :class:`DurableAgent` a call is ``ctx.call_tool`` (safety class, operation ledger,
    approval in the inbox; a rejection reaches the model as PydanticAI's ``ToolDenied``);
    outside one it raises ``RuntimeError``. Raises :class:`~durable.ToolNotFound` for an
    unregistered name.
    """
    tool_name = tool if isinstance(tool, str) else getattr(tool, "tool_name", tool.__name__)
    spec = registry.get_tool(str(tool_name))
    signature = inspect.signature(spec.fn)
    params = [p for n, p in signature.parameters.items() if n != "idempotency_key"]
    try:  # resolved in the tool's module: string annotations name its imports
        hints = typing.get_type_hints(spec.fn)
    except Exception:  # noqa: BLE001 - an unresolvable hint: the schema falls back to Any
        hints = {}
    annotations = {
        k: hints.get(k, p.annotation)
        for k, p in signature.parameters.items()
        if k != "idempotency_key" and p.annotation is not inspect.Parameter.empty
    }
    params = [p.replace(annotation=annotations.get(p.name, p.annotation)) for p in params]

    def call(**kwargs: Any) -> Any:
        raise RuntimeError(
            f"durable tool {spec.name!r} runs only inside a DurableAgent run "
            "(durable.contrib.pydantic_ai), where the call is ctx.call_tool"
        )

    call.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    call.__name__ = (name or spec.name).replace(".", "_")
    call.__doc__ = spec.description or inspect.getdoc(spec.fn) or spec.name
    call.__module__ = spec.fn.__module__
    return Tool(
        call,
        takes_ctx=False,
        name=call.__name__,
        metadata={DURABLE_TOOL_KEY: spec.name},
    )


@dataclass(frozen=True)
class DurableAgentResult:
    """A finished run: ``output`` (of the agent's output type) and ``messages``
    (the whole history, ``list[ModelMessage]``, as PydanticAI's ``all_messages()``)."""

    output: Any
    messages: list[ModelMessage]


class DurableAgent:
    """Wrap a PydanticAI ``Agent`` so that a run of it is the Durable workflow ``name``.

    ``DurableAgent(agent, name="support-agent", version="1")`` registers the workflow
    (input ``{"prompt": str, "message_history": [...] | None}``; output
    ``{"output": <JSON>, "messages": [...]}``, the messages in PydanticAI's JSON form).
    The agent needs its model set (``Agent("openai:...", ...)``, a ``TestModel``...).
    ``approval_timeout`` (seconds) bounds each approval, ``None``: no limit. ``model``:
    the model to use instead of the agent's, or a factory of it called at each execution
    (so a provider reads its settings, e.g. ``OPENAI_BASE_URL``, when the run executes,
    not when the module is imported); one of the two is required. ``tool_retry``: the
    :class:`~durable.RetryPolicy` of each tool's step (a transient error -- 429, 5xx, a
    dropped connection -- is tried again with the same idempotency key); ``None``: the
    default step policy (3 attempts).

    Raises :class:`~durable.DurableConfigurationError` for a bad name or version.
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
    ) -> None:
        if agent.model is None and model is None:
            raise ValueError(f"DurableAgent {name!r}: the agent has no model; pass model=")
        self.agent = agent
        self.model = model
        self.name = name
        self.version = str(version)
        self.approval_timeout = approval_timeout
        self.tool_retry = tool_retry
        output_type = agent.output_type
        self._output_types: list[Any] = (
            list(output_type) if isinstance(output_type, Sequence) else [output_type]
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
        **options: Any,
    ) -> Any:
        """Start a run (``durable.start``; idempotent on ``run_id``); returns the Run."""
        from durable import start

        history = (
            ModelMessagesTypeAdapter.dump_python(list(message_history), mode="json")
            if message_history
            else None
        )
        return start(self.name, {"prompt": prompt, "message_history": history}, run_id, **options)

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
        bridge = LoopBridge()
        session = _Session(ctx, bridge, self.tool_retry)
        history_data = input.get("message_history")
        history = ModelMessagesTypeAdapter.validate_python(history_data) if history_data else None
        return bridge.run(lambda: self._converse(session, input.get("prompt"), history))

    async def _converse(
        self, session: _Session, prompt: str | None, history: list[ModelMessage] | None
    ) -> Any:
        agent = self.agent
        chosen = self.model if self.model is not None else agent.model
        if chosen is not None and not isinstance(chosen, Model | str) and callable(chosen):
            chosen = chosen()
        model = DurableModel(chosen if isinstance(chosen, Model) else _infer(chosen), session)
        toolsets: list[AbstractToolset[Any]] = [
            DurableToolset(toolset, session=session) for toolset in agent.toolsets
        ]
        output_type = [*self._output_types, DeferredToolRequests]
        results: DeferredToolResults | None = None
        with (
            agent.override(model=model, tools=[], toolsets=toolsets),
            ToolManager.parallel_execution_mode("sequential"),
        ):
            for turn in itertools.count(1):
                run: AgentRunResult[Any] = await agent.run(
                    prompt,
                    message_history=history,
                    deferred_tool_results=results,
                    output_type=output_type,
                    conversation_id=session.ctx.run_id,  # the same on every replay
                    run_id=f"{session.ctx.run_id}:{turn}",
                )
                history = run.all_messages()
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

    def _decide(self, ctx: Any, requests: DeferredToolRequests) -> DeferredToolResults:
        """Ask the inbox about each call needing approval (workflow thread); a deferred
        external call waits for the signal ``tool-result:<tool_call_id>``."""
        approvals: dict[str, ToolApproved | ToolDenied] = {}
        for call in requests.approvals:
            args = call.args_as_dict()
            decision: Decision = ctx.wait_for_approval(
                f"{call.tool_name}:{call.tool_call_id}",
                title=f"Run {call.tool_name}",
                payload={"tool": call.tool_name, "params": args},
                allow_edit=True,
                timeout=self.approval_timeout,
            )
            approvals[call.tool_call_id] = _answer(call.tool_name, args, decision)
        calls: dict[str, Any] = {}
        for call in requests.calls:
            calls[call.tool_call_id] = ctx.wait_for_signal(f"tool-result:{call.tool_call_id}")
        return DeferredToolResults(approvals=dict(approvals), calls=calls)


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
