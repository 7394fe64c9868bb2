"""The SDK's calls that leave the process, each as a durable step of the workflow.

Invariant: on a replay, every model call, function tool, guardrail and session read or
write that finished before returns its record without running again, in the order the
SDK asks for it. :class:`_Clones` builds an execution's agents: their models go through
:class:`DurableModel`, their function tools, guardrails and handoffs through steps.
The SDK's ``Runner.run`` calls made from inside a run (an agent used as a tool) are
routed to the same clones by :class:`_DurableAgentRunner`, so a nested agent's model
calls are steps of the run too. A step's body (a tool, a guardrail) runs outside the
run: a ``Runner.run`` it makes (an agent-backed guardrail) is recorded with its step,
and uses the registered model provider.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    GuardrailFunctionOutput,
    Handoff,
    Model,
    ModelProvider,
    RunConfig,
    ToolGuardrailFunctionOutput,
    handoff,
)
from agents.memory import SessionABC
from agents.run import AgentRunner, get_default_agent_runner, set_default_agent_runner
from agents.run_internal.run_steps import QueueCompleteSentinel
from agents.tool import (
    maybe_invoke_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

from durable.contrib._bridge import LoopBridge, with_key
from durable.contrib.openai_agents._errors import retried_by_durable
from durable.contrib.openai_agents._model import DurableModel, _DurableProvider, _in_step, _running
from durable.contrib.openai_agents._stream import ItemLog
from durable.retry import RetryPolicy


@dataclasses.dataclass
class _Session:
    ctx: Any
    bridge: LoopBridge
    #: the model provider resolving names, not recorded (a step body's nested run)
    provider: ModelProvider
    #: the retry policy of the agents' function-tool steps (None: the default step's)
    tool_retry: RetryPolicy | None = None
    #: rebuilds the run's context from its JSON; None: the context is not recorded
    context_adapter: TypeAdapter[Any] | None = None
    #: a run started before guardrails and nested agents were steps (its input is the
    #: SDK's input alone): it replays as it was recorded, with neither
    legacy: bool = False
    clones: _Clones | None = None
    #: the durable RunConfigs of this run (by id): passed on unchanged to nested runs
    configs: set[int] = dataclasses.field(default_factory=set)
    #: approved calls' edited arguments (JSON text) by call id: what their tool receives
    edits: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the items of the run's streamed runs, for the run's stream (None: none streamed)
    items: ItemLog | None = None
    #: a streamed run's items are being told (a nested streamed run's are not)
    publishing: bool = False
    #: each MCP server's safety classes and approvals, by server name
    mcp_safety: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the MCP servers' listings of this execution, by prefix (one step each)
    mcp_tools: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the MCP servers' connections, by prefix, for their Durable tools' bodies
    mcp_links: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the SDK's ``_meta`` of an MCP call about to run, by (prefix, tool)
    mcp_meta: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)

    def arguments(self, tool_ctx: Any, arguments: str) -> str:
        """The arguments a tool call runs with: the approver's edit, else the model's."""
        return self.edits.get(getattr(tool_ctx, "tool_call_id", None) or "", arguments)

    async def step(self, step_id: str, body: Any, retry: RetryPolicy | None = None) -> Any:
        def run() -> Any:
            self.flush()  # the items before this step, first
            return self.ctx.step(step_id, body, retry=retry)

        return await self.bridge.call(run)

    def flush(self) -> None:
        """(Workflow thread) write the streamed runs' items not written yet."""
        if self.items is not None:
            self.items.flush()

    def publish(self, result: Any) -> None:
        """Tell the items of the streamed run ``result`` (``Runner.run_streamed``'s) to
        the run's stream, unless a streamed run around it already does."""
        if self.publishing:
            return
        queue = getattr(result, "_event_queue", None)
        if queue is None:  # pragma: no cover - an SDK without it: items are not told
            return
        if self.items is None:
            self.items = ItemLog(self.ctx)
        items = self.items
        put = queue.put_nowait
        self.publishing = True

        def tapped(event: Any) -> None:
            if isinstance(event, QueueCompleteSentinel):
                self.publishing = False
            else:
                items.add(event)
            put(event)

        queue.put_nowait = tapped

    def run_body(self, make: Callable[[], Awaitable[Any]]) -> Any:
        """Inside a step (workflow thread): await ``make()`` on the agent's loop, where a
        ``Runner.run`` it makes uses the run's provider and records nothing of its own."""

        async def call() -> Any:
            token = _in_step.set(self)
            try:
                return await make()
            finally:
                _in_step.reset(token)

        return self.bridge.run_on_loop(call)

    def dump_context(self, wrapper: Any) -> dict[str, Any]:
        if self.context_adapter is None:
            return {}
        return {"context": self.context_adapter.dump_python(wrapper.context, mode="json")}

    def restore_context(self, wrapper: Any, record: Any) -> None:
        """A replayed step: the run's context as the step's body left it."""
        if self.context_adapter is None or not isinstance(record, dict) or "context" not in record:
            return
        fresh = self.context_adapter.validate_python(record["context"])
        current = wrapper.context
        if isinstance(current, dict) and isinstance(fresh, dict):
            current.clear()
            current.update(fresh)
        elif hasattr(current, "__dict__") and type(current) is type(fresh):
            current.__dict__.update(fresh.__dict__)
        else:
            wrapper.context = fresh

    def default_config(self) -> RunConfig:
        """The run config of a run given none: the run's model provider, no tracing."""
        return RunConfig(model_provider=self.provider, tracing_disabled=True)

    def config(self, given: RunConfig | None) -> RunConfig:
        """``given`` with its model provider, model and guardrails going through steps."""
        if given is not None and id(given) in self.configs:
            return given
        base = given if given is not None else RunConfig(tracing_disabled=True)
        clones = self.clones
        assert clones is not None
        model = base.model
        if self.legacy:  # as recorded: the agents' models were wrapped, nothing else
            self.configs.add(id(base))
            return base
        made = dataclasses.replace(
            base,
            model=DurableModel(model, self) if isinstance(model, Model) else model,
            model_provider=_DurableProvider(base.model_provider, self),
            input_guardrails=[
                clones.guardrail("input_guardrail", g) for g in base.input_guardrails or []
            ],
            output_guardrails=[
                clones.guardrail("output_guardrail", g) for g in base.output_guardrails or []
            ],
        )
        self.configs.add(id(made))
        return made


def _type_name(value: Any) -> str | None:
    """``module:qualname`` of a pydantic model or dataclass instance, else None."""
    cls = type(value)
    typed = isinstance(value, BaseModel) or dataclasses.is_dataclass(cls)
    if typed and "<locals>" not in cls.__qualname__:
        return f"{cls.__module__}:{cls.__qualname__}"
    return None


def _rebuild(data: Any, type_name: str | None) -> Any:
    """A recorded ``output_info`` as the type it had (a pydantic model, a dataclass)."""
    if not type_name:
        return data
    module, _, qualname = type_name.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return TypeAdapter(target).validate_python(data)


def _run_context(kind: str, args: tuple[Any, ...]) -> Any:
    """The RunContextWrapper a guardrail function is called with."""
    if kind.startswith("tool_"):
        return args[0].context  # ToolInputGuardrailData / ToolOutputGuardrailData
    return args[0]


class _Clones:
    """The durable clones of one run's agents, built once per agent (handoff cycles)."""

    def __init__(self, session: _Session) -> None:
        self.session = session
        self.made: dict[int, Agent[Any]] = {}
        self.clone_ids: set[int] = set()
        session.clones = self

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        if id(agent) in self.clone_ids:
            return agent
        if id(agent) in self.made:
            return self.made[id(agent)]
        clone = agent.clone()
        self.made[id(agent)] = clone
        self.clone_ids.add(id(clone))
        if isinstance(agent.model, Model):
            clone.model = DurableModel(agent.model, self.session)
        elif self.session.legacy:
            clone.model = DurableModel(self.session.provider.get_model(agent.model), self.session)
        clone.tools = [self.tool(t) for t in agent.tools]
        clone.handoffs = [self.handoff(h) for h in agent.handoffs]
        if self.session.legacy:
            return clone
        if agent.mcp_servers:
            from durable.contrib.openai_agents._mcp import durable_servers

            clone.mcp_servers = durable_servers(
                list(agent.mcp_servers), self.session, self.session.mcp_safety
            )
        clone.input_guardrails = [
            self.guardrail("input_guardrail", g) for g in agent.input_guardrails
        ]
        clone.output_guardrails = [
            self.guardrail("output_guardrail", g) for g in agent.output_guardrails
        ]
        return clone

    def guardrail(self, kind: str, guardrail: Any) -> Any:
        """``guardrail`` whose function is the step ``<kind>:<name>``: it records the
        ``output_info`` (JSON; a pydantic model or dataclass comes back as its type) and the
        tripwire or behavior, and on a replay returns them without running again."""
        function = guardrail.guardrail_function
        if getattr(function, "_durable_step", False):
            return guardrail
        session = self.session
        step_id = f"{kind}:{guardrail.get_name()}"
        tool_kind = kind.startswith("tool_")

        async def durable_function(*args: Any) -> Any:
            live: list[Any] = []
            wrapper = _run_context(kind, args)

            def body() -> dict[str, Any]:
                async def call() -> Any:
                    out = function(*args)
                    return await out if inspect.isawaitable(out) else out

                out = session.run_body(call)
                live.append(out)
                record = {
                    "output_info": to_jsonable_python(out.output_info, fallback=repr),
                    "type": _type_name(out.output_info),
                    **session.dump_context(wrapper),
                }
                if tool_kind:
                    record["behavior"] = dict(out.behavior)
                else:
                    record["tripwire_triggered"] = bool(out.tripwire_triggered)
                return record

            record = await session.step(step_id, body)
            if live:
                return live[0]
            session.restore_context(wrapper, record)
            info = _rebuild(record["output_info"], record.get("type"))
            if tool_kind:
                return ToolGuardrailFunctionOutput(output_info=info, behavior=record["behavior"])
            return GuardrailFunctionOutput(
                output_info=info, tripwire_triggered=record["tripwire_triggered"]
            )

        durable_function._durable_step = True  # type: ignore[attr-defined]
        durable_function.__name__ = guardrail.get_name()
        return dataclasses.replace(guardrail, guardrail_function=durable_function)

    def tool(self, tool: Any) -> Any:
        if not isinstance(tool, FunctionTool):
            return tool  # hosted tools run at the provider, inside the model step
        if self.session.legacy:
            return self.function_tool(tool, copy.copy(tool))  # one step, as recorded
        wrapped = copy.copy(tool)
        wrapped.tool_input_guardrails = [
            self.guardrail("tool_input_guardrail", g) for g in tool.tool_input_guardrails or []
        ] or tool.tool_input_guardrails
        wrapped.tool_output_guardrails = [
            self.guardrail("tool_output_guardrail", g) for g in tool.tool_output_guardrails or []
        ] or tool.tool_output_guardrails
        session = self.session
        if getattr(tool, "_is_agent_tool", False):
            # Agent.as_tool: its nested Runner.run comes back to these clones
            # (_DurableAgentRunner), so each of its model calls and tools is a step
            run_nested = tool.on_invoke_tool

            async def nested(tool_ctx: Any, arguments: str) -> Any:
                return await run_nested(tool_ctx, session.arguments(tool_ctx, arguments))

            wrapped.on_invoke_tool = nested
            return wrapped
        return self.function_tool(tool, wrapped)

    def function_tool(self, tool: FunctionTool, wrapped: FunctionTool) -> FunctionTool:
        """``wrapped`` (a copy of ``tool``) with its invocation the step ``tool:<name>``."""
        session = self.session
        # the tool without the SDK's failure handling: its exceptions reach the step
        raising = set_function_tool_failure_error_function(copy.copy(tool), None)
        invoke = raising.on_invoke_tool

        async def durable_invoke(tool_ctx: Any, arguments: str) -> Any:
            if _in_step.get() is not None:  # inside a step's body, which records it
                return await tool.on_invoke_tool(tool_ctx, arguments)
            live: list[Any] = []
            arguments = session.arguments(tool_ctx, arguments)

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

                output = to_jsonable_python(session.run_body(call))
                if session.context_adapter is None:
                    return output  # the record of runs without a recorded context
                live.append(output)
                return {"output": output, **session.dump_context(tool_ctx)}

            record = await session.step(f"tool:{tool.name}", body, session.tool_retry)
            if session.context_adapter is None:
                return record
            if not live:
                session.restore_context(tool_ctx, record)
            return record["output"]

        wrapped.on_invoke_tool = durable_invoke
        return wrapped

    def handoff(self, target: Any) -> Handoff[Any, Any]:
        """``target`` whose invocation is the step ``handoff:<agent>``: the handoff's
        ``on_handoff`` (a side effect, the SDK's docs: "kicking off some data fetching")
        runs inside it, so a replay takes the recorded agent without calling it again."""
        spec: Handoff[Any, Any] = handoff(target) if isinstance(target, Agent) else target
        invoke = spec.on_invoke_handoff
        session = self.session
        ref = getattr(spec, "_agent_ref", None)  # the SDK's handoff(agent) keeps its agent

        async def durable_invoke(run_ctx: Any, input_json: str) -> Agent[Any]:
            known = ref() if ref is not None else None
            if known is None:  # a hand-made Handoff: only its callback knows the agent
                chosen = await invoke(run_ctx, input_json)
                await session.step(
                    f"handoff:{chosen.name}", lambda: {"to": chosen.name, "input": input_json}
                )
                return self.agent(chosen)
            live: list[Agent[Any]] = []

            def body() -> dict[str, Any]:
                chosen = session.run_body(lambda: invoke(run_ctx, input_json))
                live.append(chosen)
                return {"to": chosen.name, "input": input_json, **session.dump_context(run_ctx)}

            record = await session.step(f"handoff:{spec.agent_name}", body)
            if live:
                return self.agent(live[0])
            session.restore_context(run_ctx, record)
            return self.agent(known)

        wrapped = copy.copy(spec)
        wrapped.on_invoke_handoff = durable_invoke
        return wrapped


class _StepSession(SessionABC):
    """An SDK ``Session`` whose reads and writes are steps (``session:<method>``): a
    replay reads the history the run read, and writes nothing again."""

    def __init__(self, inner: Any, session: _Session) -> None:
        self.inner = inner
        self.session_id = inner.session_id
        self.session_settings = getattr(inner, "session_settings", None)
        self._session = session

    async def _step(self, method: str, make: Callable[[], Awaitable[Any]]) -> Any:
        session = self._session

        def body() -> Any:
            return to_jsonable_python(session.run_body(make))

        return await session.step(f"session:{method}", body)

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return list(await self._step("get_items", lambda: self.inner.get_items(limit)))

    async def add_items(self, items: list[Any]) -> None:
        await self._step("add_items", lambda: self.inner.add_items(items))

    async def pop_item(self) -> Any:
        return await self._step("pop_item", self.inner.pop_item)

    async def clear_session(self) -> None:
        await self._step("clear_session", self.inner.clear_session)


class _DurableAgentRunner(AgentRunner):
    """The SDK's default runner, which sends a ``Runner.run`` made inside a durable run
    (an agent used as a tool) to that run's clones, and one made inside a step's body
    (an agent-backed guardrail) to the run's model provider; others pass unchanged."""

    def __init__(self, inner: AgentRunner) -> None:
        self.inner = inner

    async def run(self, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        session = _running.get()
        if session is not None and session.clones is not None and not session.legacy:
            starting_agent = session.clones.agent(starting_agent)
            kwargs["run_config"] = session.config(
                _as_config(kwargs.get("run_config")) or session.default_config()
            )
        else:
            inside = _in_step.get()
            if inside is not None and kwargs.get("run_config") is None:
                kwargs["run_config"] = RunConfig(
                    model_provider=inside.provider, tracing_disabled=True
                )
        return await self.inner.run(starting_agent, input, **kwargs)

    def run_sync(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.run_sync(*args, **kwargs)

    def run_streamed(self, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        session = _running.get()
        if session is not None and session.clones is not None and not session.legacy:
            starting_agent = session.clones.agent(starting_agent)
            kwargs["run_config"] = session.config(
                _as_config(kwargs.get("run_config")) or session.default_config()
            )
            result = self.inner.run_streamed(starting_agent, input, **kwargs)
            session.publish(result)
            return result
        inside = _in_step.get()
        if inside is not None and kwargs.get("run_config") is None:
            kwargs["run_config"] = RunConfig(model_provider=inside.provider, tracing_disabled=True)
        return self.inner.run_streamed(starting_agent, input, **kwargs)


def _as_config(value: Any) -> RunConfig | None:
    if value is None or isinstance(value, RunConfig):
        return value
    return RunConfig(**value)


def install_runner() -> None:
    """Make :class:`_DurableAgentRunner` the SDK's default runner (once per process)."""
    current = get_default_agent_runner()
    if not isinstance(current, _DurableAgentRunner):
        set_default_agent_runner(_DurableAgentRunner(current))
