"""The OpenAI Agents SDK on Durable: a ``Runner`` whose model calls and tool calls are steps.

Invariant: a run started with :func:`durable_run` replays to the same state after a
crash. Every agent reachable from the starting agent (its handoffs, recursively) runs as
a clone whose model is wrapped so that ``get_response`` is one ``ctx.step`` (``model``,
``model#2``, ...) recording the ``ModelResponse`` (output items as the Responses API's
JSON), whose function tools' ``on_invoke_tool`` is one step (``tool:<name>``), and whose
handoffs record a step ``handoff:<agent>``, so the run page shows which agent took over.
A tool's body gets the step's idempotency key (:func:`current_idempotency_key`). A tool
failure that may have reached a service (:func:`retried_by_durable`: a 429 or 5xx, a
dropped connection, a timeout) fails the step's try and Durable tries it again with the
same key, as its retry policy says; it is not handed to the model as the SDK's "Please
try again" message, after which the model would call again under a new key and a write
whose answer was lost would be made twice. Other tool errors reach the model as the
SDK's ``failure_error_function`` makes them, recorded with the step.
A tool with ``needs_approval`` interrupts the SDK's run; each interruption waits for a
decision in the inbox and the run continues through the SDK's own
``RunState.approve`` / ``RunState.reject(rejection_message=...)``. Needs the
``durable[openai-agents]`` extra; the core never imports this module.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai
from agents import (
    Agent,
    FunctionTool,
    Handoff,
    Model,
    ModelProvider,
    ModelResponse,
    RunConfig,
    Runner,
    ToolApprovalItem,
    Usage,
    handoff,
)
from agents.models.multi_provider import MultiProvider
from agents.tool import (
    maybe_invoke_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from durable import registry
from durable.contrib._bridge import LoopBridge, current_idempotency_key, with_key
from durable.exceptions import AmbiguousOutcomeError, TransientError
from durable.retry import AMBIGUOUS, TRANSIENT, RetryPolicy, classify
from durable.types import Decision

__all__ = [
    "DurableRunner",
    "current_idempotency_key",
    "durable_run",
    "register",
    "retried_by_durable",
]

_OUTPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)
_runners: dict[int, DurableRunner] = {}


@dataclass
class _Session:
    ctx: Any
    bridge: LoopBridge
    #: the retry policy of the agents' function-tool steps (None: the default step's)
    tool_retry: RetryPolicy | None = None

    async def step(self, step_id: str, body: Any, retry: RetryPolicy | None = None) -> Any:
        return await self.bridge.call(lambda: self.ctx.step(step_id, body, retry=retry))


def _dump(response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    return {
        "output": [item.model_dump(mode="json") for item in response.output],
        "usage": {
            "requests": usage.requests,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        },
        "response_id": response.response_id,
    }


def _load(data: dict[str, Any]) -> ModelResponse:
    return ModelResponse(
        output=[_OUTPUT_ITEM.validate_python(item) for item in data["output"]],
        usage=Usage(**data["usage"]),
        response_id=data.get("response_id"),
    )


def retried_by_durable(exc: BaseException) -> bool:
    """Whether a function tool's exception fails its step's try, so that Durable tries
    the call again with the same idempotency key, instead of reaching the model as the
    SDK's error message ("An error occurred while running the tool. Please try again").

    True for a failure of a request that may have reached a service: an HTTP answer
    Durable retries (408, 409, 425, 429, 5xx: :func:`durable.retry.classify`), a network
    error or timeout (``httpx.TransportError``, ``openai.APIConnectionError``,
    ``ConnectionError``, ``TimeoutError``), :class:`~durable.TransientError`,
    :class:`~durable.AmbiguousOutcomeError`. Told "please try again", a model would call
    the tool anew, as a new step with a new key: a write whose answer was lost would be
    made twice. Anything else (a refused request, the tool's own error) reaches the model
    as the SDK's message, as without Durable.
    """
    if isinstance(exc, (TransientError, AmbiguousOutcomeError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, (httpx.TransportError, openai.APIConnectionError)):
        return True
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return isinstance(status, int) and classify(exc)[0] in (TRANSIENT, AMBIGUOUS)


class DurableModel(Model):
    """A model whose ``get_response`` is a durable step; streaming is refused."""

    def __init__(self, model: Model, session: _Session) -> None:
        self.model = model
        self._session = session

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        model = self.model
        bridge = self._session.bridge

        def body() -> dict[str, Any]:
            async def send() -> ModelResponse:
                return await model.get_response(*args, **kwargs)

            return _dump(bridge.run_on_loop(send))

        return _load(await self._session.step("model", body))

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError(
            "a durable OpenAI Agents run records whole responses: use durable_run "
            "(Runner.run), not Runner.run_streamed"
        )


class _Clones:
    """The durable clones of one run's agents, built once per agent (handoff cycles)."""

    def __init__(self, session: _Session, provider: ModelProvider) -> None:
        self.session = session
        self.made: dict[int, Agent[Any]] = {}
        self.provider = provider

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        if id(agent) in self.made:
            return self.made[id(agent)]
        clone = agent.clone()
        self.made[id(agent)] = clone
        model = agent.model
        if not isinstance(model, Model):
            model = self.provider.get_model(model)
        clone.model = DurableModel(model, self.session)
        clone.tools = [self.tool(t) for t in agent.tools]
        clone.handoffs = [self.handoff(h) for h in agent.handoffs]
        return clone

    def tool(self, tool: Any) -> Any:
        if not isinstance(tool, FunctionTool):
            return tool  # hosted tools run at the provider, inside the model step
        session = self.session
        # the tool without the SDK's failure handling: its exceptions reach the step
        raising = set_function_tool_failure_error_function(copy.copy(tool), None)
        invoke = raising.on_invoke_tool

        async def durable_invoke(tool_ctx: Any, arguments: str) -> Any:
            def body(*, idempotency_key: str) -> Any:
                async def call() -> Any:
                    try:
                        return await with_key(idempotency_key, lambda: invoke(tool_ctx, arguments))
                    except Exception as exc:
                        if retried_by_durable(exc):
                            raise  # Durable tries the step again, with the same key
                        handled = await maybe_invoke_function_tool_failure_error_function(
                            function_tool=tool, context=tool_ctx, error=exc
                        )
                        if handled is None:  # the tool's failure_error_function=None
                            raise
                        return handled  # the model sees the SDK's message, as without us

                return to_jsonable_python(session.bridge.run_on_loop(call))

            return await session.step(f"tool:{tool.name}", body, session.tool_retry)

        wrapped = copy.copy(tool)
        wrapped.on_invoke_tool = durable_invoke
        return wrapped

    def handoff(self, target: Any) -> Handoff[Any, Any]:
        spec: Handoff[Any, Any] = handoff(target) if isinstance(target, Agent) else target
        invoke = spec.on_invoke_handoff
        session = self.session

        async def durable_invoke(run_ctx: Any, input_json: str) -> Agent[Any]:
            chosen = await invoke(run_ctx, input_json)
            await session.step(
                f"handoff:{chosen.name}", lambda: {"to": chosen.name, "input": input_json}
            )
            return self.agent(chosen)

        wrapped = copy.copy(spec)
        wrapped.on_invoke_handoff = durable_invoke
        return wrapped


class DurableRunner:
    """The Durable workflow ``name`` running ``agent`` with the OpenAI Agents SDK.

    Input: the SDK's ``input`` (a string or a list of input items, JSON); output
    ``{"final_output": <JSON>, "last_agent": str, "items": [...]}`` (``items``: the
    run's ``to_input_list()``). ``approval_timeout``: seconds per approval (``None``: no
    limit); ``max_turns``: as ``Runner.run``. ``model_provider``: a factory of the
    ``ModelProvider`` resolving agents' model names, called once per execution so its
    clients live on that execution's event loop (default ``MultiProvider()``; e.g.
    ``lambda: MultiProvider(openai_use_responses=False)`` for a chat-completions endpoint).
    ``tool_retry``: the :class:`~durable.RetryPolicy` of each function tool's step, for
    the failures Durable retries (:func:`retried_by_durable`); ``None``: the default
    step policy (3 attempts). Give the policy a flaky service needs: three 429s in a
    row fail the run under the default.
    """

    def __init__(
        self,
        agent: Agent[Any],
        *,
        name: str,
        version: str = "1",
        approval_timeout: float | None = None,
        max_turns: int = 10,
        model_provider: Callable[[], ModelProvider] = MultiProvider,
        tool_retry: RetryPolicy | None = None,
    ) -> None:
        self.agent = agent
        self.tool_retry = tool_retry
        self.model_provider = model_provider
        self.name = name
        self.version = str(version)
        self.approval_timeout = approval_timeout
        self.max_turns = max_turns

        def run_agent(ctx: Any, input: Any) -> Any:
            return self._run(ctx, input)

        run_agent.__qualname__ = f"DurableRunner[{name}]"
        registry.workflow(name=name, version=self.version)(run_agent)
        _runners[id(agent)] = self

    def start(self, input: Any, *, run_id: str | None = None, **options: Any) -> Any:
        """Start a run (``durable.start``, idempotent on ``run_id``); returns the Run."""
        from durable import start

        return start(self.name, to_jsonable_python(input), run_id, **options)

    def _run(self, ctx: Any, input: Any) -> Any:
        if not isinstance(input, (str, list)):
            raise ValueError(
                f"DurableRunner {self.name!r}: input must be a string or a list of input items"
            )
        bridge = LoopBridge()
        return bridge.run(lambda: self._converse(_Session(ctx, bridge, self.tool_retry), input))

    async def _converse(self, session: _Session, input: Any) -> Any:
        start = _Clones(session, self.model_provider()).agent(self.agent)
        config = RunConfig(tracing_disabled=True)
        result = await Runner.run(start, input, max_turns=self.max_turns, run_config=config)
        while result.interruptions:
            state = result.to_state()
            pending = list(result.interruptions)
            decisions = await session.bridge.call(
                functools.partial(self._decide, session.ctx, pending)
            )
            for item, decision in zip(pending, decisions, strict=True):
                if decision.approved:
                    state.approve(item)
                else:
                    state.reject(item, rejection_message=_rejection(item, decision))
            result = await Runner.run(start, state, max_turns=self.max_turns, run_config=config)
        return {
            "final_output": to_jsonable_python(result.final_output),
            "last_agent": result.last_agent.name,
            "items": to_jsonable_python(result.to_input_list()),
        }

    def _decide(self, ctx: Any, items: list[ToolApprovalItem]) -> list[Decision]:
        decisions = []
        for item in items:
            raw = item.raw_item
            call_id = getattr(raw, "call_id", None) or (
                raw.get("call_id") if isinstance(raw, dict) else None
            )
            arguments = getattr(raw, "arguments", None) or (
                raw.get("arguments") if isinstance(raw, dict) else None
            )
            decisions.append(
                ctx.wait_for_approval(
                    f"{item.tool_name}:{call_id}",
                    title=f"Run {item.tool_name}",
                    payload={"tool": item.tool_name, "arguments": arguments},
                    timeout=self.approval_timeout,
                )
            )
        return decisions


def _rejection(item: ToolApprovalItem, decision: Decision) -> str:
    who = ", ".join(decision.decided_by) or "an approver"
    reason = f": {decision.comment}" if decision.comment else ""
    return f"The call to {item.tool_name} was rejected by {who}{reason}"


def register(agent: Agent[Any], *, name: str, version: str = "1", **options: Any) -> DurableRunner:
    """Register ``agent`` as the Durable workflow ``name``; see :class:`DurableRunner`.

    Call it at import time in a module the workers import (``DURABLE_WORKFLOW_MODULES``).
    """
    return DurableRunner(agent, name=name, version=version, **options)


def durable_run(agent: Agent[Any], input: Any, *, run_id: str | None = None, **options: Any) -> Any:
    """Start a Durable run of ``agent`` (the ``Runner.run`` equivalent); returns the Run.

    The agent must have been registered with :func:`register`; raises ``LookupError``
    otherwise. ``durable.result(run.id)`` waits for ``{"final_output", "last_agent",
    "items"}``.
    """
    runner = _runners.get(id(agent))
    if runner is None:
        raise LookupError(
            f"agent {agent.name!r} is not registered: call "
            "durable.contrib.openai_agents.register(agent, name=...) where the workers import it"
        )
    return runner.start(input, run_id=run_id, **options)
