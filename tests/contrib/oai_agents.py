"""OpenAI Agents SDK fixture agents for tests/contrib, against the scripted LLM server.

``oai.refund-desk``: a triage agent hands over to a refunds agent, which looks the order
up (``lookup_order``) and refunds it (``refund_order``, ``needs_approval=True``); the
``refund-desk`` script of ``examples/fake_llm.py`` plays the model. ``oai.guarded-desk``:
the refunds agent with an agent-backed input guardrail (``refund_check`` asks
``checker``, whose model records ``("model", "checker")``) and a code output guardrail;
``oai.formatted-desk``: a run config's ``tool_error_formatter``; ``oai.noter``: a context
its tools change, with run hooks (the docs' scripted model). Tool bodies append
to ``CALLS`` (or ``$CRASH_TEST_DIR/calls.jsonl``, with ``CRASH_AT=tool:lookup_order``
killing the worker there once), as in ``pai_agents``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agents import (
    Agent,
    GuardrailFunctionOutput,
    Model,
    ModelResponse,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Runner,
    function_tool,
    input_guardrail,
    output_guardrail,
)
from agents.models.multi_provider import MultiProvider
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from durable import RetryPolicy
from durable.contrib.openai_agents import current_idempotency_key, register
from tests.contrib import openai_doc_agents as _docs
from tests.contrib.pai_agents import record

INSTRUCTIONS = "durable-script: refund-desk\n"


@function_tool
def lookup_order(order_id: str) -> str:
    """Look an order up: its amount."""
    record("tool", "lookup_order")
    return json.dumps({"order_id": order_id, "amount": 30})


@function_tool(needs_approval=True)
def refund_order(order_id: str, amount: int) -> str:
    """Refund an order (needs approval)."""
    record("tool", "refund_order", amount=amount, key=current_idempotency_key())
    return json.dumps({"order_id": order_id, "refunded": amount})


refunds = Agent(
    name="Refunds",
    instructions=INSTRUCTIONS + "You refund orders.",
    model="scripted",
    tools=[lookup_order, refund_order],
)
triage = Agent(
    name="Triage",
    instructions=INSTRUCTIONS + "You route customers.",
    model="scripted",
    handoffs=[refunds],
)
#: ``flaky_lookup``'s failures still to raise, each an exception to raise
FLAKY: list[Exception] = []


@function_tool(name_override="lookup_order")
def flaky_lookup(order_id: str) -> str:
    """Look an order up (raises ``FLAKY``'s next exception first: the answer was lost)."""
    record("tool", "lookup_order", key=current_idempotency_key())
    if FLAKY:
        raise FLAKY.pop(0)
    return json.dumps({"order_id": order_id, "amount": 30})


flaky_refunds = Agent(
    name="Refunds",
    instructions=INSTRUCTIONS + "You refund orders.",
    model="scripted",
    tools=[flaky_lookup, refund_order],
)
flaky_desk = register(
    flaky_refunds,
    name="oai.flaky-desk",
    version="1",
    model_provider=lambda: MultiProvider(openai_use_responses=False),
)
refund_desk = register(
    triage,
    name="oai.refund-desk",
    version="1",
    model_provider=lambda: MultiProvider(openai_use_responses=False),
)

#: the same agent, its function tools' steps with their own retry policy (tool_retry)
patient_refunds = flaky_refunds.clone(name="PatientRefunds")
patient_desk = register(
    patient_refunds,
    name="oai.patient-desk",
    version="1",
    model_provider=lambda: MultiProvider(openai_use_responses=False),
    tool_retry=RetryPolicy(max_attempts=5, initial_interval=0.01, jitter=False),
)


class CheckerModel(Model):
    """The guardrail agent's model: answers "yes", recording each request."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        record("model", "checker")
        text = ResponseOutputText(type="output_text", text="yes", annotations=[])
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


#: the agent an agent-backed guardrail asks
checker = Agent(
    name="Checker", instructions="Is this a refund request? Answer yes.", model=CheckerModel()
)


@input_guardrail
async def refund_check(ctx, agent, input) -> GuardrailFunctionOutput:
    """Agent-backed: one model call of its own, which only its step records."""
    record("guardrail", "refund_check")
    result = await Runner.run(checker, input, context=ctx.context)
    return GuardrailFunctionOutput(
        output_info={"checker": str(result.final_output)[:80]}, tripwire_triggered=False
    )


@output_guardrail
def no_card_numbers(ctx, agent, output) -> GuardrailFunctionOutput:
    record("guardrail", "no_card_numbers")
    return GuardrailFunctionOutput(
        output_info={"length": len(str(output))}, tripwire_triggered="4111" in str(output)
    )


guarded_refunds = flaky_refunds.clone(
    name="GuardedRefunds", input_guardrails=[refund_check], output_guardrails=[no_card_numbers]
)
guarded_desk = register(
    guarded_refunds,
    name="oai.guarded-desk",
    version="1",
    model_provider=lambda: MultiProvider(openai_use_responses=False),
)

#: the refunds agent with a run config's tool_error_formatter (custom rejection text)
formatted_refunds = flaky_refunds.clone(name="FormattedRefunds")


def _format_rejection(args) -> str | None:
    if args.kind != "approval_rejected":
        return None
    return f"Refund declined by policy ({args.tool_name})."


formatted_desk = register(
    formatted_refunds,
    name="oai.formatted-desk",
    version="1",
    run_config=RunConfig(
        model_provider=MultiProvider(openai_use_responses=False),
        tool_error_formatter=_format_rejection,
        tracing_disabled=True,
    ),
)


# --- a context the tools change, hooks, per-run settings (the docs' scripted model) ---


@dataclass
class Notes:
    user: str
    count: int = 0


@function_tool
def remember(wrapper: RunContextWrapper[Notes]) -> str:
    """Count one more note in the run's context."""
    record("tool", "remember")
    wrapper.context.count += 1
    return "noted"


@function_tool(needs_approval=True)
def report(wrapper: RunContextWrapper[Notes]) -> str:
    """Report the notes (needs approval)."""
    return f"{wrapper.context.user} has {wrapper.context.count} note(s)"


class Hooks(RunHooks[Any]):
    """Run hooks that record the tools they see start."""

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        record("hook", f"tool_start:{tool.name}")


noter = Agent(name="Noter", instructions="Keep notes.", tools=[remember, report])
register(
    noter,
    name="oai.noter",
    model_provider=_docs.ScriptedProvider,
    context_type=Notes,
    hooks=Hooks(),
)
