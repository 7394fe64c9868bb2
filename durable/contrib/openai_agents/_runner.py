"""The Durable workflow that runs one agent with the SDK's ``Runner.run``."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from agents import (
    Agent,
    ModelProvider,
    ModelSettings,
    RunConfig,
    RunHooks,
    Runner,
    ToolApprovalItem,
)
from agents.models.multi_provider import MultiProvider
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from durable import registry
from durable.contrib._bridge import LoopBridge
from durable.contrib.mcp.adapters import McpSafety, linked
from durable.contrib.openai_agents._follow import StreamedRun, agents_of
from durable.contrib.openai_agents._steps import (
    _Clones,
    _running,
    _Session,
    _StepSession,
    install_runner,
)
from durable.retry import RetryPolicy
from durable.types import Decision

_runners: dict[int, DurableRunner] = {}

#: the keys of a run's input besides the SDK's ``input`` (``durable_run``'s options)
RUN_KEYS = ("input", "context", "session_id", "run_config")
_RUN_CONFIG_FIELDS = {f.name for f in dataclasses.fields(RunConfig) if f.init}


class DurableRunner:
    """The Durable workflow ``name`` running ``agent`` with the OpenAI Agents SDK.

    Input: a dict of :data:`RUN_KEYS` (``{"input": <the SDK's input: a string or a list
    of input items>, ...}``, what :func:`durable_run` and :meth:`start` give); the SDK's
    input alone is a run started before guardrails and nested agents were steps, which
    replays as it was recorded (neither is a step). Output
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

    ``run_config``: the SDK's ``RunConfig`` of every run (its ``model_provider``
    replaces ``model_provider``; tracing stays as it says; default: tracing off);
    ``hooks``: the ``RunHooks`` of every run (they see replayed calls again, as code
    re-executed). ``context_type``: the type a run's ``context`` is rebuilt as from its
    JSON (a pydantic model, a dataclass, a TypedDict; ``None``: the JSON as is); the
    context is recorded with every tool and guardrail step, so a replay sees what their
    bodies changed. ``session``: a factory ``session_id -> Session`` (the SDK's memory,
    e.g. ``lambda sid: SQLiteSession(sid, "conversations.db")``) for runs started with
    ``session_id``; its reads and writes are steps. ``rejection_message``: ``(item,
    decision) -> str | None``, the text the model gets for a refused call (``None``:
    the run config's ``tool_error_formatter``, else the SDK's default); without it, a
    ``tool_error_formatter`` answers, else "The call to <tool> was rejected by <who>:
    <comment>". ``allow_edit``: approvers may edit a call's arguments (an object); the
    tool receives the edited ones. ``stream``: run the agent with
    ``Runner.run_streamed``: each model request streams into the run's stream (its step
    records the same response as unstreamed) and the run's items and agent changes are
    told there too; :meth:`run_streamed` follows a run in the SDK's event shapes.
    ``mcp_safety``: server name -> :class:`~durable.contrib.mcp.McpSafety` for the
    agents' ``mcp_servers``, whose listing is the recorded step ``"<name>.tools/list"``
    and whose every call is the Durable tool ``"<name>.<tool>"`` (ledger, idempotency
    key, approval; default: ``unsafe_write``, no approval), as
    :class:`~durable.contrib.mcp.McpTools`; the worker connects a server around each
    live call (docs/mcp.md).
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
        run_config: RunConfig | None = None,
        hooks: RunHooks[Any] | None = None,
        context_type: Any = None,
        session: Callable[[str], Any] | None = None,
        rejection_message: Callable[[ToolApprovalItem, Decision], str | None] | None = None,
        allow_edit: bool = True,
        stream: bool = False,
        mcp_safety: Mapping[str, McpSafety] | None = None,
    ) -> None:
        self.agent = agent
        self.mcp_safety = dict(mcp_safety or {})
        self.stream = stream
        self.tool_retry = tool_retry
        self.model_provider = model_provider
        self.name = name
        self.version = str(version)
        self.approval_timeout = approval_timeout
        self.max_turns = max_turns
        self.run_config = run_config
        self.hooks = hooks
        self.context_adapter: TypeAdapter[Any] = TypeAdapter(
            context_type if context_type is not None else Any
        )
        self.session = session
        self.rejection_message = rejection_message
        self.allow_edit = allow_edit
        install_runner()

        def run_agent(ctx: Any, input: Any) -> Any:
            return self._run(ctx, input)

        run_agent.__qualname__ = f"DurableRunner[{name}]"
        registry.workflow(name=name, version=self.version)(run_agent)
        _runners[id(agent)] = self

    def start(self, input: Any, *, run_id: str | None = None, **options: Any) -> Any:
        """Start a run (``durable.start``, idempotent on ``run_id``); returns the Run."""
        from durable import start

        if not isinstance(input, dict):
            input = {"input": input}
        return start(self.name, to_jsonable_python(input), run_id, **options)

    def run_streamed(
        self,
        input: Any,
        *,
        run_id: str | None = None,
        poll: float = 0.25,
        **options: Any,
    ) -> StreamedRun:
        """Start a run (as :meth:`start`, ``input`` the SDK's input or a dict of
        :data:`RUN_KEYS`) and follow it: a :class:`StreamedRun` whose ``stream_events()``
        yields the SDK's stream events from the run's stream (``Runner.run_streamed``'s
        shapes), with ``final_output`` and ``is_complete``. The runner must stream
        (``register(..., stream=True)``) for model requests' events; raises
        ``ValueError`` otherwise. ``poll``: seconds between two reads of the stream."""
        if not self.stream:
            raise ValueError(
                f"DurableRunner {self.name!r} does not stream: register it with stream=True "
                "to use run_streamed"
            )
        run = self.start(input, run_id=run_id, **options)
        return StreamedRun(run.id, agents=agents_of(self.agent), poll=poll)

    def follow(self, run_id: str, *, poll: float = 0.25) -> StreamedRun:
        """A run of this runner already started, followed as :meth:`run_streamed` does."""
        return StreamedRun(run_id, agents=agents_of(self.agent), poll=poll)

    def _run(self, ctx: Any, input: Any) -> Any:
        payload = input if isinstance(input, dict) else {"input": input}
        if not isinstance(payload.get("input"), (str, list)):
            raise ValueError(
                f"DurableRunner {self.name!r}: input must be a string or a list of input items"
            )
        if payload.get("session_id") is not None and self.session is None:
            raise ValueError(
                f"DurableRunner {self.name!r}: a session_id needs register(..., session=...)"
            )
        bridge = LoopBridge()
        provider = (
            self.run_config.model_provider if self.run_config is not None else self.model_provider()
        )
        session = _Session(
            ctx,
            bridge,
            provider,
            self.tool_retry,
            self.context_adapter if "context" in payload else None,
            legacy=not isinstance(input, dict),
            mcp_safety=self.mcp_safety,
        )
        with linked(session.mcp_links):
            return bridge.run(lambda: self._converse(session, payload))

    def _config(self, session: _Session, overrides: dict[str, Any] | None) -> RunConfig:
        base = self.run_config or RunConfig(tracing_disabled=True)
        base = dataclasses.replace(base, model_provider=session.provider)
        if overrides:
            changes = dict(overrides)
            if isinstance(changes.get("model_settings"), dict):
                changes["model_settings"] = ModelSettings(**changes["model_settings"])
            base = dataclasses.replace(base, **changes)
        return session.config(base)

    async def _converse(self, session: _Session, payload: dict[str, Any]) -> Any:
        _running.set(session)  # this task's context: the SDK's tasks inherit it
        start = _Clones(session).agent(self.agent)
        config = self._config(session, payload.get("run_config"))
        options: dict[str, Any] = {"max_turns": self.max_turns, "run_config": config}
        if self.hooks is not None:
            options["hooks"] = self.hooks
        if payload.get("session_id") is not None:
            assert self.session is not None
            options["session"] = _StepSession(self.session(payload["session_id"]), session)
        first = dict(options)
        if session.context_adapter is not None:
            first["context"] = session.context_adapter.validate_python(payload["context"])
        result = await self._turn(start, payload["input"], first)
        while result.interruptions:
            state = result.to_state()
            pending = list(result.interruptions)
            decisions = await session.bridge.call(functools.partial(self._decide, session, pending))
            for item, decision in zip(pending, decisions, strict=True):
                if decision.approved:
                    _apply_edit(session, item, decision)
                    state.approve(item)
                else:
                    state.reject(item, rejection_message=self._message(item, decision, config))
            result = await self._turn(start, state, options)
        await session.bridge.call(session.flush)
        return {
            "final_output": to_jsonable_python(result.final_output),
            "last_agent": result.last_agent.name,
            "items": to_jsonable_python(result.to_input_list()),
        }

    def _message(self, item: ToolApprovalItem, decision: Decision, config: RunConfig) -> str | None:
        if self.rejection_message is not None:
            return self.rejection_message(item, decision)
        if config.tool_error_formatter is not None:
            return None  # the SDK asks the run config's formatter
        who = ", ".join(decision.decided_by) or "an approver"
        reason = f": {decision.comment}" if decision.comment else ""
        return f"The call to {item.tool_name} was rejected by {who}{reason}"

    async def _turn(self, start: Agent[Any], input: Any, options: dict[str, Any]) -> Any:
        """One ``Runner.run`` (``Runner.run_streamed`` and its events drained, when the
        runner streams) up to its end or its interruptions."""
        if not self.stream:
            return await Runner.run(start, input, **options)
        result = Runner.run_streamed(start, input, **options)
        async for _ in result.stream_events():
            pass  # _DurableAgentRunner tells the items to the run's stream
        return result

    def _decide(self, session: _Session, items: list[ToolApprovalItem]) -> list[Decision]:
        session.flush()  # what the run said before it waits
        ctx = session.ctx
        decisions = []
        for item in items:
            decisions.append(
                ctx.wait_for_approval(
                    f"{item.tool_name}:{_field(item, 'call_id')}",
                    title=f"Run {item.tool_name}",
                    payload={"tool": item.tool_name, "arguments": _arguments(item)},
                    timeout=self.approval_timeout,
                    allow_edit=self.allow_edit,
                )
            )
        return decisions


def _field(item: ToolApprovalItem, name: str) -> Any:
    raw = item.raw_item
    return raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)


def _arguments(item: ToolApprovalItem) -> Any:
    """A call's arguments as the object the model wrote (its JSON text if not JSON)."""
    text = _field(item, "arguments")
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def _apply_edit(session: _Session, item: ToolApprovalItem, decision: Decision) -> None:
    """The approver's edited arguments are the ones the tool receives (the model's call
    stays in the history as it wrote it: the SDK refuses a call id whose arguments
    changed)."""
    edited = decision.edited
    if isinstance(edited, dict) and isinstance(edited.get("arguments"), dict):
        edited = edited["arguments"]
    if isinstance(edited, dict) and edited != _arguments(item):
        session.edits[str(_field(item, "call_id"))] = json.dumps(edited)


def find(agent: Agent[Any]) -> DurableRunner:
    runner = _runners.get(id(agent))
    if runner is None:
        raise LookupError(
            f"agent {agent.name!r} is not registered: call "
            "durable.contrib.openai_agents.register(agent, name=...) where the workers import it"
        )
    return runner


def run_input(
    input: Any, *, context: Any, session_id: str | None, run_config: dict[str, Any] | None
) -> Any:
    """The workflow input of a run: ``{"input": ...}`` and the options given (a run whose
    input is the SDK's input alone was started before guardrails were steps)."""
    payload: dict[str, Any] = {"input": input}
    if context is not None:
        payload["context"] = to_jsonable_python(context)
    if session_id is not None:
        payload["session_id"] = str(session_id)
    if run_config:
        unknown = sorted(set(run_config) - _RUN_CONFIG_FIELDS)
        if unknown:
            raise TypeError(f"durable_run: unknown run_config settings: {', '.join(unknown)}")
        payload["run_config"] = to_jsonable_python(run_config)
    return payload
