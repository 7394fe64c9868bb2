"""PydanticAI agents that stream, for the streaming tests (in-process and workers).

``pai-stream.weather``: the weather agent of PydanticAI's "Streaming Events and Final
Output" example (ai.pydantic.dev/agent, ``run_stream_event_stream_handler.py``), its
``handle_event`` and ``event_stream_handler`` as the page writes them; only its model is
a ``FunctionModel`` streaming what the page's output shows, and the wrapper lines are
Durable's. ``pai-stream.approve``: the same model, the tool needing approval (a run
that waits, then replays). ``pai-stream.capital``: the ``run_agent.py`` example's
agent, whose text streams word by word. ``pai-stream.scripted``: the scripted chat
model at ``OPENAI_BASE_URL`` (examples/fake_llm.py), for the worker-process tests.
Every model request appends to ``MODEL_CALLS`` (or ``$CRASH_TEST_DIR/calls.jsonl``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, AsyncIterator
from datetime import date
from pathlib import Path
from typing import Any, NotRequired

from pydantic_ai import (
    Agent,
    AgentStreamEvent,
    FinalResultEvent,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    RunContext,
    TextPart,
    TextPartDelta,
    ThinkingPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
    ToolReturnPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from typing_extensions import TypedDict  # pydantic wants it before Python 3.12

from durable import RetryPolicy
from durable.contrib.pydantic_ai import DurableAgent, StepSettings
from tests.crash_workflows import append_jsonl

MODEL_CALLS: list[str] = []


def _record(name: str) -> None:
    folder = os.environ.get("CRASH_TEST_DIR")
    if folder:
        append_jsonl(Path(folder) / "calls.jsonl", {"kind": "model", "name": name})
    else:
        MODEL_CALLS.append(name)


def _answered(messages: list[ModelMessage]) -> bool:
    return any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)


# ------------------------------------------------ the page's example (its model scripted)

TOOL_ARGS = ['{"location":"Pa', 'ris","forecast_', 'date":"2030-01-', '01"}']
TEXT = ["It will be ", "warm and sunny ", "in Paris on ", "Tuesday."]


async def weather_stream(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    _record("weather")
    if _answered(messages):
        for piece in TEXT:
            yield piece
        return
    yield {0: DeltaToolCall(name="weather_forecast", tool_call_id="0001")}
    for piece in TOOL_ARGS:
        yield {0: DeltaToolCall(json_args=piece)}


def weather_whole(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _record("weather")
    if _answered(messages):
        return ModelResponse(parts=[TextPart("".join(TEXT))])
    args = "".join(TOOL_ARGS)
    return ModelResponse(parts=[ToolCallPart("weather_forecast", args, tool_call_id="0001")])


weather_agent = Agent(
    FunctionModel(weather_whole, stream_function=weather_stream),
    system_prompt="Providing a weather forecast at the locations the user provides.",
)


@weather_agent.tool
async def weather_forecast(
    ctx: RunContext,
    location: str,
    forecast_date: date,
) -> str:
    return f"The forecast in {location} on {forecast_date} is 24°C and sunny."


output_messages: list[str] = []


async def handle_event(event: AgentStreamEvent):
    if isinstance(event, PartStartEvent):
        output_messages.append(f"[Request] Starting part {event.index}: {event.part!r}")
    elif isinstance(event, PartDeltaEvent):
        if isinstance(event.delta, TextPartDelta):
            output_messages.append(
                f"[Request] Part {event.index} text delta: {event.delta.content_delta!r}"
            )
        elif isinstance(event.delta, ThinkingPartDelta):
            output_messages.append(
                f"[Request] Part {event.index} thinking delta: {event.delta.content_delta!r}"
            )
        elif isinstance(event.delta, ToolCallPartDelta):
            output_messages.append(
                f"[Request] Part {event.index} args delta: {event.delta.args_delta}"
            )
    elif isinstance(event, FunctionToolCallEvent):
        output_messages.append(
            f"[Tools] The LLM calls tool={event.part.tool_name!r} with args={event.part.args} "
            f"(tool_call_id={event.part.tool_call_id!r})"
        )
    elif isinstance(event, FunctionToolResultEvent):
        output_messages.append(
            f"[Tools] Tool call {event.tool_call_id!r} returned => {event.part.content}"
        )
    elif isinstance(event, FinalResultEvent):
        output_messages.append(
            f"[Result] The model starting producing a final result (tool_name={event.tool_name})"
        )


async def event_stream_handler(
    ctx: RunContext,
    event_stream: AsyncIterable[AgentStreamEvent],
):
    async for event in event_stream:
        await handle_event(event)


durable_weather = DurableAgent(
    weather_agent,
    name="pai-stream.weather",
    version="1",
    event_stream_handler=event_stream_handler,
)
#: the same agent, no handler of its own: a run chooses one by name
weather_by_name = DurableAgent(
    weather_agent,
    name="pai-stream.weather-by-name",
    version="1",
    event_stream_handlers={"page": event_stream_handler},
)

approve_agent = Agent(
    FunctionModel(weather_whole, stream_function=weather_stream),
    system_prompt="Providing a weather forecast at the locations the user provides.",
)


@approve_agent.tool(requires_approval=True, name="weather_forecast")
async def weather_forecast_approved(ctx: RunContext, location: str, forecast_date: date) -> str:
    return f"The forecast in {location} on {forecast_date} is 24°C and sunny."


durable_approve = DurableAgent(
    approve_agent,
    name="pai-stream.approve",
    version="1",
    event_stream_handler=event_stream_handler,
)


# ------------------------------------------------ run_agent.py's and streamed_user_profile.py's

CAPITAL = ["The capital of ", "the UK is ", "London."]


async def capital_stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    _record("capital")
    for piece in CAPITAL:
        yield piece


capital_agent = Agent(FunctionModel(stream_function=capital_stream))
durable_capital = DurableAgent(capital_agent, name="pai-stream.capital", version="1")


class UserProfile(TypedDict):  # streamed_user_profile.py (ai.pydantic.dev/output)
    name: str
    dob: NotRequired[date]
    bio: NotRequired[str]


PROFILE_ARGS = [
    '{"name": "Ben", "dob": "1990-01-28", "bio": "Likes',
    " the chain the ",
    "dog and the pyr",
    'amid"}',
]


async def profile_stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    _record("profile")
    yield {0: DeltaToolCall(name=info.output_tools[0].name, tool_call_id="p1")}
    for piece in PROFILE_ARGS:
        yield {0: DeltaToolCall(json_args=piece)}


profile_agent = Agent(
    FunctionModel(stream_function=profile_stream),
    output_type=UserProfile,
    instructions="Extract a user profile from the input",
)
durable_profile = DurableAgent(profile_agent, name="pai-stream.profile", version="1")


# ------------------------------------------------ the scripted model, for worker processes


def scripted_model() -> OpenAIChatModel:
    """The chat model at ``OPENAI_BASE_URL`` (examples/fake_llm.py), built per execution."""
    provider = OpenAIProvider(
        base_url=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY") or "scripted",
    )
    return OpenAIChatModel("scripted", provider=provider)


scripted_agent = Agent(instructions="durable-script: echo")
durable_scripted = DurableAgent(
    scripted_agent, name="pai-stream.scripted", version="1", model=scripted_model
)


# ------------------------------------------------ a try that fails mid-stream; a model that cannot

#: names of the streams that already failed once
FAILED_ONCE: set[str] = set()


async def flaky_stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    _record("flaky")
    yield "It will be "
    if "flaky" not in FAILED_ONCE:
        FAILED_ONCE.add("flaky")
        raise ConnectionError("the connection dropped mid-stream")
    yield "sunny."


flaky_agent = Agent(FunctionModel(stream_function=flaky_stream))
durable_flaky = DurableAgent(
    flaky_agent,
    name="pai-stream.flaky",
    version="1",
    event_stream_handler=event_stream_handler,
    model_step=StepSettings(retry=RetryPolicy(initial_interval=0.01, jitter=False)),
)


class WholeOnly(Model):
    """A model that answers whole and cannot stream (PydanticAI's base ``request_stream``)."""

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        _record("whole-only")
        return ModelResponse(parts=[TextPart("whole")])

    @property
    def model_name(self) -> str:
        return "whole-only"

    @property
    def system(self) -> str:
        return "test"


durable_whole_only = DurableAgent(Agent(WholeOnly()), name="pai-stream.whole-only", version="1")
