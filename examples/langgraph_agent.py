"""The LangGraph reference agent: a refund desk built as a LangGraph graph, run durably.

``examples.refund_graph`` (:func:`durable.contrib.langgraph.graph_workflow`) runs this
graph with the run id as its thread::

    START -> model -> tools -> model -> END
               (no tool calls: END)

- **model** asks the LLM (any OpenAI-compatible endpoint; in development the scripted
  ``examples/fake_llm.py``, script ``refund_graph``) what to do about the customer's
  message; it answers with a ``payments_refund`` tool call, then with a summary.
- **tools** runs the calls through :func:`durable.contrib.langgraph.call_tool`: the
  refund is ``examples.payments.refund``, an ``unsafe_write`` that a support lead
  approves first (the approvals inbox), made through the operation ledger with its
  idempotency key, so a worker killed around it never refunds twice.

Each super-step is a step of the run (``superstep-1``...). The LLM call is made inside
the model node, so it is recorded with the node's super-step, not as a ``ctx.llm`` step:
a worker killed while the model answers asks again (and the run's token budget does
not count it).
"""

from __future__ import annotations

import json
import operator
from typing import Annotated, Any, TypedDict

from langgraph.config import get_config
from langgraph.graph import END, START, StateGraph

from durable.contrib.langgraph import call_tool, graph_workflow
from durable.runtime import llm

SYSTEM_PROMPT = (
    "You are a support agent who can refund duplicate charges with payments_refund.\n"
    "durable-script: refund_graph\n"
    "run: {run_id}"
)

#: the model's tools (OpenAI function calling) -> the registered Durable tools
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "payments_refund",
            "description": "Refund (part of) a charge; a support lead approves it first.",
            "parameters": {
                "type": "object",
                "properties": {
                    "charge_id": {"type": "string"},
                    "amount_cents": {"type": "integer"},
                    "reason": {"type": "string"},
                },
                "required": ["charge_id", "amount_cents"],
            },
        },
    }
]
DURABLE_TOOLS = {"payments_refund": "examples.payments.refund"}


class RefundState(TypedDict, total=False):
    customer: str
    email: str
    message: str
    messages: Annotated[list[dict[str, Any]], operator.add]
    summary: str


def model(state: RefundState) -> dict[str, Any]:
    """Ask the LLM for the next move: tool calls, or the final summary."""
    run_id = get_config()["configurable"]["thread_id"]  # graph_workflow: the run id
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT.format(run_id=run_id)},
        {
            "role": "user",
            "content": f"Customer: {state.get('customer', '')} <{state.get('email', '')}>\n"
            f"Message:\n{state.get('message', '')}",
        },
        *state.get("messages", []),
    ]
    reply = llm.chat(messages, tools=TOOLS, timeout=30)
    calls = reply.get("tool_calls") or []
    assistant: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
    if calls:
        assistant["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for c in calls
        ]
        return {"messages": [assistant]}
    return {"messages": [assistant], "summary": reply.get("content") or ""}


def tools(state: RefundState) -> dict[str, Any]:
    """Run the last turn's tool calls as Durable tool calls (ledger, approval)."""
    last = state["messages"][-1]
    out = []
    for call in last.get("tool_calls") or []:
        name = call["function"]["name"]
        args = json.loads(call["function"]["arguments"] or "{}")
        tool = DURABLE_TOOLS.get(name)
        if tool is None:
            content: dict[str, Any] = {"error": {"message": f"unknown tool {name!r}"}}
        else:
            result = call_tool(tool, args)
            if isinstance(result, dict) and "error" in result and "error_type" in result:
                content = {"error": {"type": result["error_type"], "message": result["error"]}}
            else:
                content = {"result": result}
        out.append(
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": json.dumps(content, default=str)[:8000],
            }
        )
    return {"messages": out}


def _after_model(state: RefundState) -> str:
    return "tools" if state["messages"][-1].get("tool_calls") else END


def build() -> StateGraph:
    """The refund desk's graph (compiled by graph_workflow with DurableSaver)."""
    graph = StateGraph(RefundState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", _after_model, ["tools", END])
    graph.add_edge("tools", "model")
    return graph


refund_graph = graph_workflow("examples.refund_graph", "1", build, approvers="support-leads")
