"""Streamed OpenAI Agents SDK runs (``register(..., stream=True)``) for the tests.

``oai.stream-desk``: the refund desk of ``oai_agents`` (triage hands over to refunds,
``lookup_order``, ``refund_order`` needing approval), streamed, against the scripted LLM
server's ``refund-desk`` script through chat completions. ``oai.docs.stream-text`` and
``oai.docs.stream-items``: the agents of the SDK's ``docs/streaming.md`` (and
``examples/basic/stream_text.py``, ``stream_items.py``), as written there but for the
``register`` lines; :class:`JokeModel` plays them, streaming its text word by word
(``JOKE_DELAY`` seconds between two words). ``oai.stream-orchestrator``: an agent that
uses a streamed agent as a tool (``Agent.as_tool(on_stream=...)``, the SDK's in-run
streaming hook), its events in ``NESTED``. ``oai.docs.stream-text-in-worker`` and
``oai.docs.stream-items-in-worker``: the docs' two ``main()`` functions as workflow code
(``agent_workflow``), printing in the worker.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from agents import (
    Agent,
    ItemHelpers,
    Model,
    ModelProvider,
    ModelResponse,
    Runner,
    Usage,
    function_tool,
)
from agents.models.multi_provider import MultiProvider
from openai.types.responses import ResponseTextDeltaEvent

from durable.contrib.openai_agents import agent_workflow, register
from durable.contrib.openai_agents._stream import replayed_events
from tests.contrib import oai_agents as oa
from tests.contrib.openai_doc_agents import _call, _items, _text
from tests.contrib.pai_agents import record

# --- the refund desk, streamed --------------------------------------------------------

stream_refunds = oa.refunds.clone(name="Refunds")
stream_triage = oa.triage.clone(name="Triage", handoffs=[stream_refunds])
stream_desk = register(
    stream_triage,
    name="oai.stream-desk",
    version="1",
    model_provider=lambda: MultiProvider(openai_use_responses=False),
    stream=True,
)

# --- the SDK's streaming docs -----------------------------------------------------------

#: seconds between two streamed words of JokeModel
JOKE_DELAY = float(os.environ.get("JOKE_DELAY", "0"))
#: JokeModel's streams still to cut, each after that many words (a dropped connection)
CUT_AFTER: list[int] = []


def joke_answer(instructions: str, input: Any, tools: list[str]) -> list[Any]:
    items = _items(input)
    outputs = [str(i.get("output")) for i in items if i.get("type") == "function_call_output"]
    if "how_many_jokes" in tools and not outputs:
        return [_call("how_many_jokes", {}, 1)]
    n = int(outputs[-1]) if outputs else 5
    jokes = " ".join(f"{i}. Why did joke {i} cross the road? To get streamed." for i in range(n))
    return [_text(f"Sure, here are {n} jokes: {jokes}")]


class JokeModel(Model):
    """Plays the docs' Joker, and streams as the Responses API does (a word a delta)."""

    async def get_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: Any,
        *a: Any,
        **k: Any,
    ) -> ModelResponse:
        record("model", "joker")
        output = joke_answer(system_instructions or "", input, [t.name for t in tools])
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    async def stream_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: Any,
        *a: Any,
        **k: Any,
    ) -> AsyncIterator[Any]:
        record("model", "joker", streamed=True)
        output = joke_answer(system_instructions or "", input, [t.name for t in tools])
        usage = Usage(requests=1, input_tokens=10, output_tokens=20, total_tokens=30)
        for event in replayed_events(ModelResponse(output=output, usage=usage, response_id="r1")):
            if isinstance(event, ResponseTextDeltaEvent):
                words = event.delta.split(" ")
                cut = CUT_AFTER.pop(0) if CUT_AFTER else None
                for n, word in enumerate(words):
                    if n == cut:
                        raise ConnectionError("the model's stream was cut")
                    delta = word if n == len(words) - 1 else word + " "
                    yield event.model_copy(update={"delta": delta})
                    if JOKE_DELAY:
                        await asyncio.sleep(JOKE_DELAY)
                continue
            yield event


class JokeProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return JokeModel()


# https://openai.github.io/openai-agents-python/streaming/ (raw response events)
agent = Agent(
    name="Joker",
    instructions="You are a helpful assistant.",
)
register(agent, name="oai.docs.stream-text", model_provider=JokeProvider, stream=True)


# https://openai.github.io/openai-agents-python/streaming/ (run item events and agent events)
@function_tool
def how_many_jokes() -> int:
    """Return a random integer of jokes to tell between 1 and 10 (inclusive)."""
    record("tool", "how_many_jokes")
    return 4  # the docs': random.randint(1, 10); a fixed one here, to assert on


items_agent = Agent(
    name="Joker",
    instructions="First call the `how_many_jokes` tool, then tell that many jokes.",
    tools=[how_many_jokes],
)
register(items_agent, name="oai.docs.stream-items", model_provider=JokeProvider, stream=True)


# --- an agent used as a tool, its events streamed to on_stream --------------------------

#: (event type, data type) of each event on_stream received, per execution
NESTED: list[tuple[str, str]] = []


async def on_stream(payload: Any) -> None:
    event = payload["event"]
    NESTED.append((event.type, type(getattr(event, "data", event)).__name__))


joker_tool = items_agent.clone(name="JokerTool").as_tool(
    tool_name="tell_jokes", tool_description="Tell jokes.", on_stream=on_stream
)


class OrchestratorModel(JokeModel):
    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        if system_instructions != "Ask the joker.":
            return await super().get_response(system_instructions, input, *a, **k)
        record("model", "orchestrator")
        items = _items(input)
        outputs = [str(i.get("output")) for i in items if i.get("type") == "function_call_output"]
        if not outputs:
            output = [_call("tell_jokes", {"input": "jokes please"}, 1)]
        else:
            output = [_text("The joker said: " + json.dumps(outputs[-1])[:60])]
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)


class OrchestratorProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return OrchestratorModel()


orchestrator = Agent(name="Orchestrator", instructions="Ask the joker.", tools=[joker_tool])
register(orchestrator, name="oai.stream-orchestrator", model_provider=OrchestratorProvider)


# --- a plain streamed agent of the scripted LLM server (its "no script" reply) ----------

echo = Agent(name="Echo", instructions="You answer questions.", model="scripted")
echo_runner = register(
    echo,
    name="oai.stream-echo",
    version="1",
    model_provider=lambda: MultiProvider(openai_use_responses=False),
    stream=True,
)


# --- a model that cannot stream, on a streaming runner ----------------------------------

mute = Agent(name="Mute", instructions="Check.", model=oa.CheckerModel())
register(mute, name="oai.stream-mute", stream=True)


# --- the docs' main() functions inside the worker (agent_workflow) ---------------------


@agent_workflow("oai.docs.stream-text-in-worker", model_provider=JokeProvider)
async def main(input: str) -> None:
    """docs/streaming.md's first example, its ``main()`` as workflow code: only the
    input became the workflow's (``input=input``)."""
    agent = Agent(
        name="Joker",
        instructions="You are a helpful assistant.",
    )

    result = Runner.run_streamed(agent, input=input)
    async for event in result.stream_events():
        if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent):
            print(event.data.delta, end="", flush=True)


@agent_workflow("oai.docs.stream-items-in-worker", model_provider=JokeProvider)
async def items_main(input: str) -> Any:
    """docs/streaming.md's second example as workflow code (``input=input``; it returns
    the final output, for the test)."""
    agent = Agent(
        name="Joker",
        instructions="First call the `how_many_jokes` tool, then tell that many jokes.",
        tools=[how_many_jokes],
    )

    result = Runner.run_streamed(
        agent,
        input=input,
    )
    print("=== Run starting ===")

    async for event in result.stream_events():
        # We'll ignore the raw responses event deltas
        if event.type == "raw_response_event":
            continue
        # When the agent updates, print that
        elif event.type == "agent_updated_stream_event":
            print(f"Agent updated: {event.new_agent.name}")
            continue
        # When items are generated, print them
        elif event.type == "run_item_stream_event":
            if event.item.type == "tool_call_item":
                print("-- Tool was called")
            elif event.item.type == "tool_call_output_item":
                print(f"-- Tool output: {event.item.output}")
            elif event.item.type == "message_output_item":
                print(f"-- Message output:\n {ItemHelpers.text_message_output(event.item)}")
            else:
                pass  # Ignore other event types

    print("=== Run complete ===")
    return result.final_output
