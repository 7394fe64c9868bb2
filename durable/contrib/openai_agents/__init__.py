"""The OpenAI Agents SDK on Durable: a ``Runner`` whose model calls and tool calls are steps.

Invariant: a run started with :func:`durable_run` replays to the same state after a
crash. Every agent reachable from the starting agent (its handoffs, recursively, and the
agents it uses as tools) runs as a clone whose model is wrapped so that ``get_response``
is one ``ctx.step`` (``model``, ``model#2``, ...) recording the ``ModelResponse``
(output items as the Responses API's JSON), whose function tools' ``on_invoke_tool`` is
one step (``tool:<name>``), whose guardrails are steps (``input_guardrail:<name>``,
``output_guardrail:<name>``, ``tool_input_guardrail:<name>``,
``tool_output_guardrail:<name>``) recording the ``GuardrailFunctionOutput``, tripwire
included, and whose handoffs record a step ``handoff:<agent>``, so the run page shows
which agent took over. A guardrail that runs an agent of its own (an agent-backed
guardrail) runs it inside its step: a replay returns the guardrail's recorded answer and
calls no model. An agent used as a tool (``Agent.as_tool``) is no step of its own: its
model calls and tools are steps of the run. A tool's body gets the step's idempotency
key (:func:`current_idempotency_key`). A tool failure that may have reached a service
(:func:`retried_by_durable`: a 429 or 5xx, a dropped connection, a timeout) fails the
step's try and Durable tries it again with the same key, as its retry policy says; it is
not handed to the model as the SDK's "Please try again" message, after which the model
would call again under a new key and a write whose answer was lost would be made twice.
Other tool errors reach the model as the SDK's ``failure_error_function`` makes them,
recorded with the step.
A tool with ``needs_approval`` interrupts the SDK's run; each interruption waits for a
decision in the inbox (its arguments an object the approver may edit) and the run
continues through the SDK's own ``RunState.approve`` /
``RunState.reject(rejection_message=...)``. ``register(..., stream=True)`` runs the agent
with ``Runner.run_streamed``: each model request streams into the run's stream and is
recorded once, as unstreamed; :func:`durable_run_streamed` follows a run in the SDK's
event shapes (:class:`StreamedRun`), and :func:`agent_workflow` makes the SDK's own code
a workflow (docs/streaming.md#openai-agents-streamed-runs). Needs the
``durable[openai-agents]`` extra; the core never imports this module. Nested runs reach
the clones through the SDK's default agent runner, which :func:`register` replaces with
one that passes every other run through unchanged.
"""

from __future__ import annotations

from typing import Any

from agents import Agent

from durable.contrib._bridge import current_idempotency_key
from durable.contrib.openai_agents._errors import retried_by_durable
from durable.contrib.openai_agents._follow import StreamedRun
from durable.contrib.openai_agents._model import DurableModel
from durable.contrib.openai_agents._runner import DurableRunner, find, run_input
from durable.contrib.openai_agents._workflow import agent_workflow

__all__ = [
    "DurableModel",
    "DurableRunner",
    "StreamedRun",
    "agent_workflow",
    "current_idempotency_key",
    "durable_run",
    "durable_run_streamed",
    "register",
    "retried_by_durable",
]


def register(agent: Agent[Any], *, name: str, version: str = "1", **options: Any) -> DurableRunner:
    """Register ``agent`` as the Durable workflow ``name``; see :class:`DurableRunner`.

    Call it at import time in a module the workers import (``DURABLE_WORKFLOW_MODULES``).
    """
    return DurableRunner(agent, name=name, version=version, **options)


def durable_run(
    agent: Agent[Any],
    input: Any,
    *,
    run_id: str | None = None,
    context: Any = None,
    session_id: str | None = None,
    run_config: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Start a Durable run of ``agent`` (the ``Runner.run`` equivalent); returns the Run.

    ``context``: the run's context (the SDK's ``context=``), stored as JSON with the run
    and rebuilt as the registered ``context_type``; a value that is not JSON (a
    connection, a client) cannot be stored: give its JSON-able parts and build the rest
    in the tools. ``session_id``: the conversation of the registered ``session``
    factory. ``run_config``: ``RunConfig`` settings for this run (JSON values, e.g.
    ``{"model": "gpt-4.1-mini", "model_settings": {"temperature": 0}}``) over the
    registered ``run_config``; raises ``TypeError`` for a setting the SDK does not have.
    The agent must have been registered with :func:`register`; raises ``LookupError``
    otherwise. ``durable.result(run.id)`` waits for ``{"final_output", "last_agent",
    "items"}``.
    """
    runner = find(agent)
    payload = run_input(input, context=context, session_id=session_id, run_config=run_config)
    return runner.start(payload, run_id=run_id, **options)


def durable_run_streamed(
    agent: Agent[Any],
    input: Any,
    *,
    run_id: str | None = None,
    context: Any = None,
    session_id: str | None = None,
    run_config: dict[str, Any] | None = None,
    poll: float = 0.25,
    **options: Any,
) -> StreamedRun:
    """Start a Durable run of ``agent`` and follow it (the ``Runner.run_streamed``
    equivalent): a :class:`StreamedRun` with ``stream_events()``, ``final_output``,
    ``is_complete`` and ``run_id``. The options are :func:`durable_run`'s; the agent must
    be registered with ``register(..., stream=True)`` (``LookupError`` if not registered,
    ``ValueError`` if it does not stream)."""
    runner = find(agent)
    payload = run_input(input, context=context, session_id=session_id, run_config=run_config)
    return runner.run_streamed(payload, run_id=run_id, poll=poll, **options)
