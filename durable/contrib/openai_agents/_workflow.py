"""The SDK's own code as a Durable workflow: ``Runner.run`` / ``Runner.run_streamed``
calls inside it run durably.

Invariant: every ``Runner.run`` and ``Runner.run_streamed`` the function makes (on the
agent's loop, in the run's context) goes through ``_DurableAgentRunner`` to the run's
clones, so each model request, tool, guardrail and handoff is a step as under
:class:`~durable.contrib.openai_agents.DurableRunner`; a streamed run's requests stream
into the run's stream and its items are told there, once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agents import ModelProvider
from agents.models.multi_provider import MultiProvider
from pydantic_core import to_jsonable_python

from durable import registry
from durable.contrib._bridge import LoopBridge
from durable.contrib.openai_agents._steps import _Clones, _running, _Session, install_runner
from durable.retry import RetryPolicy

F = TypeVar("F", bound=Callable[[Any], Awaitable[Any]])


def agent_workflow(
    name: str,
    *,
    version: str = "1",
    model_provider: Callable[[], ModelProvider] = MultiProvider,
    tool_retry: RetryPolicy | None = None,
) -> Callable[[F], F]:
    """Register the coroutine function ``fn(input)`` as the Durable workflow ``name``
    (``durable.start(name, input)``), its code the SDK's as written: the
    ``Runner.run(agent, ...)`` and ``Runner.run_streamed(agent, ...)`` it makes run the
    agent durably (every agent reachable from it a clone whose model requests, function
    tools, guardrails and handoffs are steps; a streamed request writes the run's
    stream live, and on a replay ``stream_events()`` yields the record's events).
    ``model_provider``: the factory of the ``ModelProvider`` of a ``Runner`` call given
    no ``run_config`` (called once per execution); ``tool_retry``: as
    :class:`~durable.contrib.openai_agents.DurableRunner`'s. The run's output is what
    ``fn`` returns, as JSON (``pydantic_core.to_jsonable_python``). Code between the
    ``Runner`` calls is re-executed on a replay: keep its side effects in tools. Returns
    ``fn`` unchanged. Approvals (``needs_approval``) are the function's to handle with
    the SDK's ``RunState``; they do not wait in the inbox here."""

    def decorate(fn: F) -> F:
        install_runner()

        def run_agents(ctx: Any, input: Any) -> Any:
            bridge = LoopBridge()
            session = _Session(ctx, bridge, model_provider(), tool_retry)
            _Clones(session)

            async def main() -> Any:
                _running.set(session)  # the SDK's Runner calls find the run here
                output = await fn(input)
                await bridge.call(session.flush)
                return to_jsonable_python(output)

            return bridge.run(main)

        run_agents.__qualname__ = f"agent_workflow[{name}]"
        registry.workflow(name=name, version=str(version))(run_agents)
        return fn

    return decorate
