"""The chaos audit's framework agents: LangGraph, PydanticAI and the OpenAI Agents SDK.

Beside the reference agents and examples/chaos_agents.py's, the audit (``manage.py
durable_chaos``) starts runs of one agent per framework adapter, under the same SIGKILLs
and payments-service faults. Each asks the audit's scripted LLM (examples/fake_llm.py,
script ``chaos-frameworks``: one tool call a turn, then a summary, so three model calls
a run) and makes two writes to the payments service through the framework's own tool
mechanism, wrapped durably:

- ``examples.langgraph`` (:mod:`durable.contrib.langgraph`): a graph ``model -> tools ->
  model``; the tools node calls :func:`~durable.contrib.langgraph.call_tool` for
  ``examples.tickets.create`` (an ``idempotent_write``) and ``examples.payments.refund``
  (an ``unsafe_write`` a support lead approves: the audit's operator does);
- ``examples.pydantic_ai`` (:mod:`durable.contrib.pydantic_ai`): a ``DurableAgent`` whose
  ticket tool is ``durable_tool("examples.tickets.create")`` (``ctx.call_tool``: ledger,
  reconcile) and whose refund is a plain PydanticAI tool (a ``tool:refund_charge`` step)
  that passes :func:`~durable.contrib.pydantic_ai.current_idempotency_key` to the service;
- ``examples.openai_agents`` (:mod:`durable.contrib.openai_agents`): an agent whose two
  ``function_tool`` s pass :func:`~durable.contrib.openai_agents.current_idempotency_key`.

Each run leaves one ticket, whose subject starts with the run id, and one refund of a
charge only that run names (``ch_fw<run number>``), so the audit finds a duplicate by key
and by business identity. The run id reaches the model's system prompt (``run: <id>``):
the scripted LLM's request log then says which run asked what, and the audit checks that
a model call a run recorded was not asked again on replay (:data:`MODEL_STEPS`).

**Lazy imports.** The three frameworks cost a worker about 3 s to import (measured on a
2-core machine: OpenAI Agents SDK ~1.9 s, PydanticAI ~0.5 s, LangGraph ~0.5 s): a chaos
worker importing them at start was ready after 8.5-11.9 s instead of 2.5-3.5 s (medians,
loaded machine), and the audit kills a worker every few seconds. So importing this
module (workers name it in
``DURABLE_WORKFLOW_MODULES``) imports none of them: each kind is a thin workflow that,
on its first execution in a process, imports its framework, builds the adapter's
workflow (registered under ``examples.chaos.<kind>-agent``) and runs it with its own
``ctx``. A worker pays for a framework only when it executes a run of that kind.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import durable
from durable import registry

from . import clients
from .tools import SERVICE_RETRY

SCRIPT = "durable-script: chaos-frameworks"
INSTRUCTIONS = (
    "You are a support agent. Open a ticket for the customer, then refund the charge "
    "they name.\n" + SCRIPT
)
#: what one succeeded run of each agent leaves in the services: (collection, count)
EXPECTED = {
    "langgraph": {"ticket": 1, "refund": 1},
    "pydantic_ai": {"ticket": 1, "refund": 1},
    "openai_agents": {"ticket": 1, "refund": 1},
}
#: per kind, the prefix of the step ids inside which the model is asked: a model call
#: answered for a run more often than once, beyond the attempts of those steps that were
#: lost or failed, is a completed model call asked again (examples/chaos_audit.py)
MODEL_STEPS = {"langgraph": "superstep-", "pydantic_ai": "model", "openai_agents": "model"}
#: the tools the model is offered (OpenAI function calling)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "open_ticket",
            "description": "Open a support ticket.",
            "parameters": {
                "type": "object",
                "properties": {"customer": {"type": "string"}, "subject": {"type": "string"}},
                "required": ["customer", "subject"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "refund_charge",
            "description": "Refund (part of) a charge, in cents.",
            "parameters": {
                "type": "object",
                "properties": {
                    "charge_id": {"type": "string"},
                    "amount_cents": {"type": "integer"},
                },
                "required": ["charge_id", "amount_cents"],
            },
        },
    },
]


def message(i: int) -> str:
    """The customer's message of chaos run number ``i`` (the charge only it names)."""
    return (
        f"Customer: Chaos Customer {i} <customer{i}@example.com>\nMessage:\n"
        f"Please refund the duplicate charge ch_fw{i:05d} of ${5 + i % 40}.{i % 100:02d}."
    )


def _ticket(customer: str, subject: str, key: str | None) -> dict[str, Any]:
    return clients.payments(
        "POST",
        "/v1/tickets",
        idempotency_key=key,
        json={"customer": customer, "subject": subject, "priority": "low"},
    )


def _refund(charge_id: str, amount_cents: int, key: str | None) -> dict[str, Any]:
    return clients.payments(
        "POST",
        "/v1/refunds",
        idempotency_key=key,
        json={
            "charge_id": charge_id,
            "amount_cents": int(amount_cents),
            "reason": "duplicate charge (chaos)",
        },
    )


def _lazy(kind: str, build: Callable[[], str]) -> Callable[[Any, Any], Any]:
    """The thin workflow of ``kind``: ``build()`` (once a process) registers the
    adapter's workflow and returns its name; each execution runs it with this ctx."""
    built = functools.cache(build)

    def run(ctx: Any, data: Any) -> Any:
        return registry.get_workflow(built()).fn(ctx, _adapter_input(kind, ctx, data))

    run.__name__ = run.__qualname__ = kind
    run.__doc__ = f"The chaos audit's {kind} agent (built on its first execution)."
    return durable.workflow(name=f"examples.{kind}", version="1")(run)


def _adapter_input(kind: str, ctx: Any, data: dict[str, Any]) -> Any:
    text = str(data["message"])
    if kind == "langgraph":
        return {"message": text}
    if kind == "pydantic_ai":
        return {"prompt": text, "message_history": None}
    # the SDK's input items: the run id goes to the system prompt, as the others'
    return [
        {"role": "system", "content": f"run: {ctx.run_id}"},
        {"role": "user", "content": text},
    ]


# ------------------------------------------------------------------------ LangGraph


class State(TypedDict, total=False):
    """The LangGraph agent's state (here: string annotations resolve in this module)."""

    message: str
    messages: Annotated[list[dict[str, Any]], operator.add]


def _build_langgraph() -> str:
    from langgraph.config import get_config
    from langgraph.graph import END, START, StateGraph

    from durable.contrib.langgraph import call_tool, graph_workflow
    from durable.runtime import llm

    durable_tools = {
        "open_ticket": "examples.tickets.create",
        "refund_charge": "examples.payments.refund",
    }

    def model(state: State) -> dict[str, Any]:
        run_id = get_config()["configurable"]["thread_id"]
        messages = [
            {"role": "system", "content": f"{INSTRUCTIONS}\nrun: {run_id}"},
            {"role": "user", "content": state["message"]},
            *state.get("messages", []),
        ]
        reply = llm.chat(messages, tools=TOOLS, timeout=30)
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        if reply.get("tool_calls"):
            assistant["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for c in reply["tool_calls"]
            ]
        return {"messages": [assistant]}

    def tools(state: State) -> dict[str, Any]:
        out = []
        for call in state["messages"][-1].get("tool_calls") or []:
            args = json.loads(call["function"]["arguments"] or "{}")
            result = call_tool(durable_tools[call["function"]["name"]], args)
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": json.dumps({"result": result}, default=str),
                }
            )
        return {"messages": out}

    def after_model(state: State) -> str:
        return "tools" if state["messages"][-1].get("tool_calls") else END

    def build() -> StateGraph:
        graph = StateGraph(State)
        graph.add_node("model", model)
        graph.add_node("tools", tools)
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", after_model, ["tools", END])
        graph.add_edge("tools", "model")
        return graph

    name = "examples.chaos.langgraph-agent"
    graph_workflow(name, "1", build, approvers="support-leads")
    return name


# ----------------------------------------------------------------------- PydanticAI


def _build_pydantic_ai() -> str:
    import os

    from pydantic_ai import Agent, RunContext
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from durable.contrib.pydantic_ai import DurableAgent, current_idempotency_key, durable_tool

    agent = Agent(
        instructions=INSTRUCTIONS,
        tools=[durable_tool("examples.tickets.create", name="open_ticket")],
    )

    @agent.instructions
    def run_line(ctx: RunContext[None]) -> str:
        return f"run: {ctx.conversation_id}"  # the adapter's conversation id: the run id

    @agent.tool_plain
    def refund_charge(charge_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund (part of) a charge, in cents."""
        return _refund(charge_id, amount_cents, current_idempotency_key())

    def model() -> OpenAIChatModel:
        provider = OpenAIProvider(
            base_url=os.environ.get("OPENAI_BASE_URL"),
            api_key=os.environ.get("OPENAI_API_KEY") or "scripted",
        )
        return OpenAIChatModel(os.environ.get("DURABLE_LLM_MODEL") or "scripted", provider=provider)

    name = "examples.chaos.pydantic_ai-agent"
    DurableAgent(agent, name=name, version="1", model=model)
    return name


# ---------------------------------------------------------------- OpenAI Agents SDK


def _build_openai_agents() -> str:
    from agents import Agent, function_tool
    from agents.models.multi_provider import MultiProvider

    from durable.contrib import openai_agents

    @function_tool(name_override="open_ticket")
    def open_ticket(customer: str, subject: str) -> str:
        """Open a support ticket."""
        return json.dumps(_ticket(customer, subject, openai_agents.current_idempotency_key()))

    @function_tool(name_override="refund_charge")
    def refund_charge(charge_id: str, amount_cents: int) -> str:
        """Refund (part of) a charge, in cents."""
        return json.dumps(_refund(charge_id, amount_cents, openai_agents.current_idempotency_key()))

    agent = Agent(
        name="Support",
        instructions=INSTRUCTIONS,
        model="scripted",
        tools=[open_ticket, refund_charge],
    )
    name = "examples.chaos.openai_agents-agent"
    openai_agents.register(
        agent,
        name=name,
        version="1",
        model_provider=lambda: MultiProvider(openai_use_responses=False),
        # the function tools call the flaky services: the reference agents' retry policy,
        # not the default step's three attempts (three 429s in a row failed a run)
        tool_retry=SERVICE_RETRY,
    )
    return name


langgraph = _lazy("langgraph", _build_langgraph)
pydantic_ai = _lazy("pydantic_ai", _build_pydantic_ai)
openai_agents = _lazy("openai_agents", _build_openai_agents)
