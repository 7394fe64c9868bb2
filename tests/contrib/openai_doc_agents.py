"""The OpenAI Agents SDK's documentation examples, as written there, registered on Durable.

Each block below is copied from the SDK's docs (openai.github.io/openai-agents-python,
the page named above it; their source: github.com/openai/openai-agents-python); only the
lines that run it differ: instead of
``Runner.run(...)`` in ``main()``, a ``register(...)`` line here and a ``durable_run``
in ``tests/contrib/test_openai_agents_docs.py``. The docs' agents name no model (the
SDK's default); :class:`ScriptedProvider`, given to ``register``, answers every model
name with :class:`ScriptedModel`, which plays each agent deterministically from its
instructions, tools and input. Each model request appends ``{"kind": "model", "name":
<agent>}`` to ``tests.contrib.pai_agents.calls()`` (``CRASH_AT=model:<agent>`` kills a
worker there once), so "called once" is counted across processes.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    GuardrailFunctionOutput,
    Model,
    ModelProvider,
    ModelResponse,
    RunContextWrapper,
    Runner,
    SQLiteSession,
    ToolGuardrailFunctionOutput,
    TResponseInputItem,
    Usage,
)
from agents.decorators import (
    input_guardrail,
    output_guardrail,
    tool,
    tool_input_guardrail,
    tool_output_guardrail,
)
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic import BaseModel

from durable.contrib.openai_agents import register
from tests.contrib.pai_agents import record

# --- the scripted model ------------------------------------------------------------------


def _text(value: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_1",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=value, annotations=[])],
    )


def _call(name: str, arguments: dict[str, Any], n: int) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{n}",
        type="function_call",
        name=name,
        arguments=json.dumps(arguments),
        call_id=f"call_{name}_{n}",
        status="completed",
    )


def _items(input: str | list[Any]) -> list[dict[str, Any]]:
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    return [i if isinstance(i, dict) else i.model_dump() for i in input]


def _said(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return " ".join(str(part.get("text", "")) for part in content or [] if isinstance(part, dict))


def _answer(
    instructions: str, items: list[dict[str, Any]], tools: list[str], structured: bool
) -> Any:
    """(agent, output items) for one request: what the docs' model would say."""
    users = [_said(i) for i in items if i.get("role") == "user"]
    user = users[-1] if users else ""
    outputs = [str(i.get("output")) for i in items if i.get("type") == "function_call_output"]
    if instructions.startswith("Check if the user is asking you to do their math homework"):
        math = "solve for x" in user
        return "Guardrail check", [
            _text(json.dumps({"is_math_homework": math, "reasoning": f"math={math}"}))
        ]
    if instructions.startswith("Check if the output includes any math"):
        math = "x =" in user
        return "Output check", [_text(json.dumps({"reasoning": f"math={math}", "is_math": math}))]
    if instructions.startswith("You are a customer support agent"):
        reply = "x = 4" if "solve for x" in user else "Happy to help with your order."
        if structured:  # the output guardrails example's agent
            return "Structured support agent", [_text(json.dumps({"response": reply}))]
        return "Customer support agent", [_text(reply)]
    if "classify_text" in tools:
        if not outputs:
            return "Classifier", [_call("classify_text", {"text": user}, 1)]
        return "Classifier", [_text(f"Classified: {outputs[-1]}")]
    if "fetch_user_age" in tools:
        if not outputs:
            return "Assistant", [_call("fetch_user_age", {}, 1)]
        return "Assistant", [_text(outputs[-1] + ".")]
    if "get_temperature" in tools:
        if not outputs:
            city = user.rstrip("?").split(" in ")[-1]
            return "Weather assistant", [_call("get_temperature", {"city": city}, 1)]
        return "Weather assistant", [_text(outputs[-1])]
    if instructions.startswith("You translate the user's message to Spanish"):
        return "Spanish agent", [_text("Hola, ¿cómo estás?")]
    if instructions.startswith("You are a translation agent"):
        if not outputs:
            return "orchestrator_agent", [
                _call("translate_to_spanish", {"input": "Hello, how are you?"}, 1)
            ]
        return "orchestrator_agent", [_text(f"In Spanish: {outputs[-1]}")]
    if "remember" in tools:  # Durable's own: a context a tool changes (not from the docs)
        done = len(outputs)
        if done < 2:
            return "Counter", [_call(["remember", "report"][done], {}, done + 1)]
        return "Counter", [_text(outputs[-1])]
    if instructions.startswith("Reply very concisely"):
        if "Golden Gate" in user:
            return "Concise assistant", [_text("San Francisco")]
        said = " ".join(_said(i) for i in items)
        answer = "California" if "San Francisco" in said else "Which city?"
        return "Concise assistant", [_text(answer)]
    raise AssertionError(f"no script for {instructions[:60]!r}")


class ScriptedModel(Model):
    """Plays the docs' agents (see :func:`_answer`); records each request."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        agent, output = _answer(
            system_instructions or "",
            _items(input),
            [t.name for t in tools],
            output_schema is not None and not output_schema.is_plain_text(),
        )
        record("model", agent, temperature=getattr(model_settings, "temperature", None))
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class ScriptedProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return ScriptedModel()


# --- https://openai.github.io/openai-agents-python/guardrails/ (input guardrails) ---


class MathHomeworkOutput(BaseModel):
    is_math_homework: bool
    reasoning: str


guardrail_agent = Agent(  # (1)!
    name="Guardrail check",
    instructions="Check if the user is asking you to do their math homework.",
    output_type=MathHomeworkOutput,
)


@input_guardrail
async def math_guardrail(  # (2)!
    ctx: RunContextWrapper[None], agent: Agent, input: str | list[TResponseInputItem]
) -> GuardrailFunctionOutput:
    result = await Runner.run(guardrail_agent, input, context=ctx.context)

    return GuardrailFunctionOutput(
        output_info=result.final_output,  # (3)!
        tripwire_triggered=result.final_output.is_math_homework,
    )


agent = Agent(  # (4)!
    name="Customer support agent",
    instructions="You are a customer support agent. You help customers with their questions.",
    input_guardrails=[math_guardrail],
)

# --- https://openai.github.io/openai-agents-python/guardrails/ (output guardrails) ---


class MessageOutput(BaseModel):  # (1)!
    response: str


class MathOutput(BaseModel):  # (2)!
    reasoning: str
    is_math: bool


output_guardrail_agent = Agent(
    name="Guardrail check",
    instructions="Check if the output includes any math.",
    output_type=MathOutput,
)


@output_guardrail
async def math_output_guardrail(  # (3)!
    ctx: RunContextWrapper, agent: Agent, output: MessageOutput
) -> GuardrailFunctionOutput:
    result = await Runner.run(output_guardrail_agent, output.response, context=ctx.context)

    return GuardrailFunctionOutput(
        output_info=result.final_output,
        tripwire_triggered=result.final_output.is_math,
    )


output_agent = Agent(  # (4)!
    name="Customer support agent",
    instructions="You are a customer support agent. You help customers with their questions.",
    output_guardrails=[math_output_guardrail],
    output_type=MessageOutput,
)

# --- https://openai.github.io/openai-agents-python/guardrails/ (tool guardrails) ---


@tool_input_guardrail
def block_secrets(data):
    args = json.loads(data.context.tool_arguments or "{}")
    if "sk-" in json.dumps(args):
        return ToolGuardrailFunctionOutput.reject_content(
            "Remove secrets before calling this tool."
        )
    return ToolGuardrailFunctionOutput.allow()


@tool_output_guardrail
def redact_output(data):
    text = str(data.output or "")
    if "sk-" in text:
        return ToolGuardrailFunctionOutput.reject_content("Output contained sensitive data.")
    return ToolGuardrailFunctionOutput.allow()


@tool(
    tool_input_guardrails=[block_secrets],
    tool_output_guardrails=[redact_output],
)
def classify_text(text: str) -> str:
    """Classify text for internal routing."""
    record("tool", "classify_text")
    return f"length:{len(text)}"


classifier = Agent(name="Classifier", tools=[classify_text])

# --- https://openai.github.io/openai-agents-python/context/ ---


@dataclass
class UserInfo:  # (1)!
    name: str
    uid: int


@tool
async def fetch_user_age(wrapper: RunContextWrapper[UserInfo]) -> str:  # (2)!
    """Fetch the age of the user. Call this function to get user's age information."""
    record("tool", "fetch_user_age")
    return f"The user {wrapper.context.name} is 47 years old"


assistant = Agent[UserInfo](  # (3)!
    name="Assistant",
    tools=[fetch_user_age],
)

# --- https://openai.github.io/openai-agents-python/human_in_the_loop/ ---


async def needs_oakland_approval(_ctx, params, _call_id) -> bool:
    return "Oakland" in params.get("city", "")


@tool(needs_approval=needs_oakland_approval)
async def get_temperature(city: str) -> str:
    record("tool", "get_temperature", city=city)
    return f"The temperature in {city} is 20° Celsius"


weather = Agent(
    name="Weather assistant",
    instructions="Answer weather questions with the provided tools.",
    tools=[get_temperature],
)

# --- https://openai.github.io/openai-agents-python/tools/ (agents as tools) ---

spanish_agent = Agent(
    name="Spanish agent",
    instructions="You translate the user's message to Spanish",
)

french_agent = Agent(
    name="French agent",
    instructions="You translate the user's message to French",
)

orchestrator_agent = Agent(
    name="orchestrator_agent",
    instructions=(
        "You are a translation agent. You use the tools given to you to translate. "
        "If asked for multiple translations, you call the relevant tools."
    ),
    tools=[
        spanish_agent.as_tool(
            tool_name="translate_to_spanish",
            tool_description="Translate the user's message to Spanish",
        ),
        french_agent.as_tool(
            tool_name="translate_to_french",
            tool_description="Translate the user's message to French",
        ),
    ],
)

# --- https://openai.github.io/openai-agents-python/sessions/ ---

concise = Agent(
    name="Assistant",
    instructions="Reply very concisely.",
)


def sessions_db() -> str:
    """The SQLite file of the sessions: in the crash test's folder (shared with its
    workers), else in the temporary folder (the in-process tests give their own)."""
    folder = os.environ.get("CRASH_TEST_DIR") or tempfile.gettempdir()
    return str(Path(folder) / "oai-sessions.db")


# --- the Durable wrapper lines ---------------------------------------------------------

register(agent, name="oai.docs.input-guardrail", model_provider=ScriptedProvider)
register(output_agent, name="oai.docs.output-guardrail", model_provider=ScriptedProvider)
register(classifier, name="oai.docs.tool-guardrails", model_provider=ScriptedProvider)
register(assistant, name="oai.docs.context", model_provider=ScriptedProvider, context_type=UserInfo)
register(weather, name="oai.docs.hitl", model_provider=ScriptedProvider)
register(orchestrator_agent, name="oai.docs.agents-as-tools", model_provider=ScriptedProvider)
register(
    concise,
    name="oai.docs.sessions",
    model_provider=ScriptedProvider,
    session=lambda session_id: SQLiteSession(session_id, sessions_db()),
)
