"""PydanticAI fixture agents for tests/contrib (in-process and worker processes).

``refund-agent``: a FunctionModel that looks an order up (``lookup``, a plain PydanticAI
tool), refunds it (``refund``, a tool that needs approval) and answers with a structured
``Summary``. ``durable-refund-agent``: the same with ``refund`` a ``@durable.tool``
(``pai.refund``, ``unsafe_write``, approval with edits). Every model request and tool
body appends one line to ``calls.jsonl`` in ``$CRASH_TEST_DIR`` (or to ``CALLS`` when it
is unset), so "executed once" is counted across processes. ``CRASH_AT=model:2`` or
``CRASH_AT=tool:lookup`` makes a worker SIGKILL itself there, once (a marker file).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_ai import (
    Agent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import durable
from durable.contrib.pydantic_ai import DurableAgent, current_idempotency_key, durable_tool
from tests.crash_workflows import append_jsonl, read_jsonl

CALLS: list[dict[str, Any]] = []


def _dir() -> Path | None:
    path = os.environ.get("CRASH_TEST_DIR")
    return Path(path) if path else None


def record(kind: str, name: str, **extra: Any) -> None:
    entry = {"kind": kind, "name": name, **extra}
    folder = _dir()
    if folder is None:
        CALLS.append(entry)
    else:
        append_jsonl(folder / "calls.jsonl", entry)
    crash_point = f"{kind}:{name}"
    if folder is not None and crash_point in os.environ.get("CRASH_AT", "").split(","):
        marker = folder / ("crashed-" + crash_point.replace(":", "_"))
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)


def calls() -> list[dict[str, Any]]:
    folder = _dir()
    return list(CALLS) if folder is None else read_jsonl(folder / "calls.jsonl")


class Summary(BaseModel):
    order_id: str
    refunded: int
    status: str


def _returns(messages: list[ModelMessage]) -> dict[str, ToolReturnPart]:
    found: dict[str, ToolReturnPart] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    found[part.tool_name] = part
    return found


def _script(refund_tool: str):
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(isinstance(m, ModelResponse) for m in messages) + 1
        record("model", str(n))
        returns = _returns(messages)
        if "lookup" not in returns:
            return ModelResponse(parts=[ToolCallPart("lookup", {"order_id": "A-1"}, "call-1")])
        if refund_tool not in returns:
            amount = returns["lookup"].content["amount"]
            return ModelResponse(
                parts=[
                    TextPart("refunding"),
                    ToolCallPart(refund_tool, {"order_id": "A-1", "amount": amount}, "call-2"),
                ]
            )
        answer = returns[refund_tool]
        denied = answer.outcome == "denied"
        status = f"denied: {answer.content}" if denied else "refunded"
        refunded = 0 if denied else answer.content["amount"]
        output_tool = info.output_tools[0].name
        return ModelResponse(
            parts=[
                ToolCallPart(
                    output_tool,
                    {"order_id": "A-1", "refunded": refunded, "status": status},
                    "call-3",
                )
            ]
        )

    return model


def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    record("tool", "lookup", key=current_idempotency_key())
    return {"order_id": order_id, "amount": 30}


refund_agent: Agent[None, Summary] = Agent(
    FunctionModel(_script("refund")), output_type=Summary, name="refund"
)
refund_agent.tool_plain(lookup)


@refund_agent.tool_plain(requires_approval=True)
def refund(order_id: str, amount: int) -> dict[str, Any]:
    """Refund an order (needs approval)."""
    record("tool", "refund", amount=amount)
    return {"order_id": order_id, "amount": amount}


durable_refund_agent = DurableAgent(refund_agent, name="pai.refund-agent", version="1")


@durable.tool(name="pai.refund", safety="unsafe_write", requires_approval=True, allow_edit=True)
def pai_refund(order_id: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order through the payments service."""
    record("tool", "pai.refund", amount=amount, key=idempotency_key)
    return {"order_id": order_id, "amount": amount}


ledger_agent: Agent[None, Summary] = Agent(
    FunctionModel(_script("pai_refund")),
    output_type=Summary,
    tools=[lookup, durable_tool("pai.refund")],
)
durable_ledger_agent = DurableAgent(ledger_agent, name="pai.ledger-agent", version="1")


@durable.tool(name="pai.note", safety="read_only")
def pai_note(summary: Summary, *, idempotency_key: str) -> str:
    """Note a summary (its annotation is a model of this module)."""
    return summary.status


#: ``flaky_lookup``'s failures still to raise (transient: a 503 from the service)
FLAKY: list[Exception] = []


def flaky_lookup(order_id: str) -> dict[str, Any]:
    """Look an order up (raises ``FLAKY``'s next exception first)."""
    record("tool", "lookup", key=current_idempotency_key())
    if FLAKY:
        raise FLAKY.pop(0)
    return {"order_id": order_id, "amount": 30}


patient_agent: Agent[None, Summary] = Agent(
    FunctionModel(_script("refund")), output_type=Summary, name="patient"
)
patient_agent.tool_plain(flaky_lookup, name="lookup")
patient_agent.tool_plain(refund, requires_approval=True)
#: its tools' steps with their own retry policy (``tool_retry``)
patient_refund_agent = DurableAgent(
    patient_agent,
    name="pai.patient-agent",
    version="1",
    tool_retry=durable.RetryPolicy(max_attempts=5, initial_interval=0.01, jitter=False),
)
