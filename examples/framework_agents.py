"""Reference agents on two agent frameworks: a PydanticAI agent and an OpenAI Agents SDK
agent, each refunding an order, with the refund (a write to the payments service) waiting
for a support lead's approval in the inbox.

Both talk to the scripted LLM of ``make up`` (``examples/fake_llm.py``, the
``refund-desk`` script; ``OPENAI_BASE_URL`` points elsewhere for a real provider). The
PydanticAI agent refunds through a ``@durable.tool`` (``examples.orders.refund``: ledger,
reconcile, approval); the OpenAI agent through a ``needs_approval`` function tool that
passes its step's idempotency key to the payments service, which deduplicates. Imported
by ``examples/workflows.py`` when the ``pydantic-ai`` and ``openai-agents`` extras are
installed (``make up`` installs them with the ``demo`` extra).
"""

from __future__ import annotations

import json
import os
from typing import Any

from agents import Agent as OpenAIAgent
from agents import function_tool
from agents.models.multi_provider import MultiProvider
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import durable
from durable.contrib import openai_agents
from durable.contrib.pydantic_ai import DurableAgent, durable_tool

from . import clients
from .tools import SERVICE_RETRY, _by_key, _object_id

SCRIPT = "durable-script: refund-desk\n"
ORDERS = {"A-1": 30, "B-7": 45, "C-3": 12}


def _charge(order_id: str) -> str:
    return "ch_order_" + "".join(c if c.isalnum() else "_" for c in order_id)


def _lookup(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "amount": ORDERS.get(order_id, 20), "charge": _charge(order_id)}


def _refund(order_id: str, amount: int, idempotency_key: str | None) -> dict[str, Any]:
    return clients.payments(
        "POST",
        "/v1/refunds",
        idempotency_key=idempotency_key,
        json={
            "charge_id": _charge(order_id),
            "amount_cents": int(amount) * 100,
            "reason": f"refund of order {order_id}",
        },
    )


# ------------------------------------------------------------------ PydanticAI


@durable.tool(
    name="examples.orders.refund",
    safety="unsafe_write",
    requires_approval=True,
    allow_edit=True,
    approver_group="support-leads",
    retry=SERVICE_RETRY,
    reconcile=_by_key("refunds"),
    external_id=_object_id,
)
def orders_refund(order_id: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order in full (dollars). Money leaves: a support lead approves it first."""
    return _refund(order_id, amount, idempotency_key)


def _scripted_model() -> OpenAIChatModel:
    """The chat model at ``OPENAI_BASE_URL``, read when a run executes (make up sets it)."""
    provider = OpenAIProvider(
        base_url=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY") or "scripted",
    )
    return OpenAIChatModel(os.environ.get("DURABLE_LLM_MODEL") or "scripted", provider=provider)


pydantic_desk = Agent(
    instructions=SCRIPT + "You are a refund desk. Look the order up, then refund it.",
    tools=[durable_tool("examples.orders.refund", name="refund_order")],
)


@pydantic_desk.tool_plain
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up: its amount in dollars and its charge."""
    return _lookup(order_id)


pydantic_refund = DurableAgent(
    pydantic_desk, name="examples.pydantic-refund", version="1", model=_scripted_model
)


# ------------------------------------------------------------------ OpenAI Agents SDK


@function_tool(name_override="lookup_order")
def oai_lookup_order(order_id: str) -> str:
    """Look an order up: its amount in dollars and its charge."""
    return json.dumps(_lookup(order_id))  # the SDK sends str(output): JSON, not a repr


@function_tool(name_override="refund_order", needs_approval=True)
def oai_refund_order(order_id: str, amount: int) -> str:
    """Refund an order in full (dollars); needs a support lead's approval."""
    return json.dumps(_refund(order_id, amount, openai_agents.current_idempotency_key()))


oai_refunds = OpenAIAgent(
    name="Refunds",
    instructions=SCRIPT + "You refund orders: look the order up, then refund it.",
    model="scripted",
    tools=[oai_lookup_order, oai_refund_order],
)
oai_triage = OpenAIAgent(
    name="Triage",
    instructions=SCRIPT + "You route customers to the right desk.",
    model="scripted",
    handoffs=[oai_refunds],
)
openai_refund = openai_agents.register(
    oai_triage,
    name="examples.openai-refund",
    version="1",
    # the scripted LLM speaks chat completions, not the Responses API
    model_provider=lambda: MultiProvider(openai_use_responses=False),
)
