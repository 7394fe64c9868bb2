"""``DurableAgent``: a PydanticAI agent run as a Durable workflow."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
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
from pydantic_ai.models import (
    Model,
)
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.toolsets import AbstractToolset
from pydantic_core import to_jsonable_python

from durable import registry
from durable.contrib._bridge import LoopBridge
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
