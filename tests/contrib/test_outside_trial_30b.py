"""Streaming through the three framework adapters, checked against public bug reports of
the frameworks' own streaming (and of durable integrations of them): each test names
the report it comes from. In-process, on the scripted models of the adapters' stream
tests (tests/contrib/oai_stream_agents.py, pai_stream_agents.py, lg_stream_workflows.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypedDict

import pytest
from agents import (
    Agent as OAIAgent,
)
from agents import (
    GuardrailFunctionOutput,
    Runner,
    input_guardrail,
    output_guardrail,
)
from django.contrib.auth.models import Permission, User
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
)
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.langgraph import graph_workflow, stream
from durable.contrib.openai_agents import agent_workflow, durable_run_streamed, register
from durable.contrib.pydantic_ai import DurableAgent
from durable.models import Run, RunStatus, Step, StreamEvent
from durable.testing import drive
from tests.contrib import lg_stream_workflows as lgs
from tests.contrib import oai_stream_agents as osa
from tests.contrib import pai_agents as pa
from tests.contrib import pai_stream_agents as sa

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    pa.CALLS.clear()
    osa.NESTED.clear()
    osa.CUT_AFTER.clear()
    sa.MODEL_CALLS.clear()
    sa.output_messages.clear()
    LOOKUPS.clear()


def approve(run_id: str) -> Run:
    alice, _ = User.objects.get_or_create(username="alice")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    approval_decide(
        request_id=ApprovalRequest.objects.get(run_id=run_id).pk, user=alice, approve=True
    )
    return drive(run_id)


def events_of(run_id: str) -> list[StreamEvent]:
    return list(StreamEvent.objects.filter(run_id=run_id).order_by("seq"))


# --- OpenAI Agents ------------------------------------------------------------------------


def _call_id(item: Any) -> str | None:
    raw = item.raw_item
    return raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)


def _read_to_the_end(result) -> list[Any]:
    """All the follower's events of a run driven to its end (through its approval)."""
    seen: list[Any] = []

    async def read() -> None:
        async for event in result.stream_events():
            seen.append(event)

    for _ in range(3):  # a follower stops at a wait; the run has gone on since
        asyncio.run(read())
        if result.is_complete:
            break
    return seen


def _refund_desk_streamed():
    result = osa.stream_desk.run_streamed("Please refund order B-7")
    run = drive(result.run_id)
    assert run.status == RunStatus.WAITING, run.error
    run = approve(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run, result, _read_to_the_end(result)


def test_oai_a_streamed_handoff_is_one_handoff_requested_not_also_a_tool_called(scripted_llm):
    """https://github.com/openai/openai-agents-python/issues/4144 and
    https://github.com/openai/openai-agents-python/issues/1862: in a streamed run a
    handoff call came out twice, as ``tool_called`` and ``handoff_requested`` with the
    same ``call_id``, so a consumer persisting the items duplicated the function call.
    The follower (and the run's ``run_item`` events) give each call once."""
    run, result, seen = _refund_desk_streamed()
    items = [(e.name, _call_id(e.item)) for e in seen if e.type == "run_item_stream_event"]
    handoffs = {cid for name, cid in items if name == "handoff_requested"}
    assert len(handoffs) == 1
    assert not [cid for name, cid in items if name == "tool_called" and cid in handoffs]
    requested = [cid for name, cid in items if name in ("tool_called", "handoff_requested")]
    assert len(requested) == len(set(requested)) == 3
    calls = [
        _call_id(i) for i in result.new_items if i.type in ("tool_call_item", "handoff_call_item")
    ]
    assert len(calls) == len(set(calls)) == 3
    written = [e.data["name"] for e in events_of(run.id) if e.kind == "run_item"]
    assert written == [name for name, _ in items]


def test_oai_each_tool_call_is_announced_once_before_its_output(scripted_llm):
    """https://github.com/openai/openai-agents-python/pull/1300 (issue #1282): a streamed
    run announced ``tool_called`` only after the whole turn, and the fix had to keep it
    from being sent twice. Here each function call's raw ``response.output_item.done``
    comes first, then its one ``tool_called``, then its ``tool_output``."""
    _, _, seen = _refund_desk_streamed()
    position: dict[tuple[str, str], int] = {}
    for i, e in enumerate(seen):
        if e.type == "raw_response_event" and isinstance(e.data, ResponseOutputItemDoneEvent):
            if getattr(e.data.item, "type", "") == "function_call":
                position.setdefault(("done", e.data.item.call_id), i)
        elif e.type == "run_item_stream_event" and e.name in ("tool_called", "tool_output"):
            key = (e.name, _call_id(e.item))
            assert key not in position, f"{key} twice"
            position[key] = i
    tools = [cid for kind, cid in position if kind == "tool_called"]
    assert len(tools) == 2
    for cid in tools:
        assert position[("done", cid)] < position[("tool_called", cid)]
        assert position[("tool_called", cid)] < position[("tool_output", cid)]


def test_oai_one_response_completed_per_model_request(scripted_llm):
    """https://github.com/openai/openai-agents-python/issues/2427: a streamed agent run
    emits a ``response.completed`` per model request (tool calls, handoffs), so it is
    not the end of the run. The follower gives exactly one per recorded request, each
    with that request's output; the end is ``is_complete`` / ``final_output``."""
    run, result, seen = _refund_desk_streamed()
    completed = [
        e.data
        for e in seen
        if e.type == "raw_response_event" and isinstance(e.data, ResponseCompletedEvent)
    ]
    records = Step.objects.filter(run=run, step_id__regex=r"^model(#\d+)?$").order_by("position")
    assert len(completed) == records.count() == 4
    for event, step in zip(completed, records, strict=True):
        recorded = [i["type"] for i in step.output_value()["output"]]
        assert [i.type for i in event.response.output] == recorded
    assert result.is_complete and result.final_output == "Refunded 30 for order B-7."


@input_guardrail(run_in_parallel=False)
def no_jokes_please(ctx, agent, input) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info="no jokes", tripwire_triggered=True)


@output_guardrail
def no_jokes_out(ctx, agent, output) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info="no jokes", tripwire_triggered=True)


guarded_in = osa.agent.clone(name="GuardedIn", input_guardrails=[no_jokes_please])
register(guarded_in, name="t30b.guarded-in", model_provider=osa.JokeProvider, stream=True)
guarded_out = osa.agent.clone(name="GuardedOut", output_guardrails=[no_jokes_out])
register(guarded_out, name="t30b.guarded-out", model_provider=osa.JokeProvider, stream=True)


def _follow_failed(result) -> list[Any]:
    from durable import RunFailed

    seen: list[Any] = []

    async def read() -> None:
        async for event in result.stream_events():
            seen.append(event)

    with pytest.raises(RunFailed):
        asyncio.run(read())
    return seen


def test_oai_a_blocking_input_guardrail_trips_before_anything_streams():
    """https://github.com/openai/openai-agents-python/issues/300 and
    https://github.com/openai/openai-agents-python/pull/2688: in a streamed run the
    answer streamed before (or despite) the input guardrail's tripwire. With a blocking
    guardrail (``run_in_parallel=False``) the durable run fails on the tripwire with no
    model request and nothing streamed; the follower raises the run's failure."""
    result = durable_run_streamed(guarded_in, input="Please tell me 5 jokes.")
    run = drive(result.run_id)
    assert run.status == RunStatus.FAILED
    assert "InputGuardrailTripwireTriggered" in run.error["type"]
    assert not Step.objects.filter(run=run, step_id__startswith="model").exists()
    assert not [e for e in events_of(run.id) if e.kind == "token"]
    seen = _follow_failed(result)
    assert not [e for e in seen if e.type == "raw_response_event"]
    assert result.is_complete and result.final_output is None


def test_oai_an_output_guardrail_tripwire_leaves_no_final_output():
    """https://github.com/openai/openai-agents-python/pull/2758: a streamed run swallowed
    the output guardrail's tripwire, so a caller saw a completed run with
    ``final_output`` set. The durable run fails on it: the follower has the streamed
    text, then raises, and ``final_output`` stays None."""
    result = durable_run_streamed(guarded_out, input="Please tell me 5 jokes.")
    run = drive(result.run_id)
    assert run.status == RunStatus.FAILED
    assert "OutputGuardrailTripwireTriggered" in run.error["type"]
    seen = _follow_failed(result)
    assert [e for e in seen if e.type == "raw_response_event"]  # the answer did stream
    assert result.is_complete and result.final_output is None


@agent_workflow("t30b.cancel-in-worker", model_provider=osa.JokeProvider)
async def cancel_main(input: str) -> Any:
    """The SDK's streaming docs, "Cancel streaming": ``result.cancel()`` after three
    deltas, as workflow code."""
    agent = OAIAgent(name="Joker", instructions="You are a helpful assistant.")
    result = Runner.run_streamed(agent, input=input)
    deltas: list[str] = []
    async for event in result.stream_events():
        if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent):
            deltas.append(event.data.delta)
            if len(deltas) == 3:
                result.cancel()
    return {"deltas": deltas, "final_output": result.final_output}


def test_oai_cancel_in_the_worker_stops_the_stream_and_the_run_goes_on():
    """https://github.com/openai/openai-agents-python/issues/574 (PR #579) and
    https://github.com/openai/openai-agents-python/pull/2710: ``result.cancel()`` while
    iterating ``stream_events()`` stops the run; ``final_output`` stays None. As
    workflow code the cancel stops the SDK's run and the workflow finishes."""
    run = drive(durable.start("t30b.cancel-in-worker", "Please tell me 5 jokes.").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert len(out["deltas"]) == 3 and out["final_output"] is None


@pytest.mark.xfail(
    strict=True,
    reason="a replay hands the recorded reply as one delta, so workflow code that "
    "cancels after N deltas does not cancel again: the re-execution's final_output is "
    "the whole reply where the first execution's was None",
)
def test_oai_a_cancel_after_n_deltas_is_the_same_on_a_replay():
    """https://github.com/openai/openai-agents-python/issues/574 (the SDK's cancel after
    three deltas, PR #579's own example) as workflow code, executed again (a replay):
    the live execution cancelled (``final_output`` None) and recorded the model's whole
    response; the replay derives one delta from the record, never reaches three, and
    the SDK's run completes -- the code after it sees another outcome."""
    run = drive(durable.start("t30b.cancel-in-worker", "Please tell me 5 jokes.").id)
    first = run.output_value()
    Run.objects.filter(pk=run.id).update(status=RunStatus.PENDING)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == first["final_output"] is None


def test_oai_the_followers_cancel_as_the_sdks_docs_write_it():
    """https://github.com/openai/openai-agents-python/issues/574 (PR #579): the SDK's
    streamed result has ``cancel()`` (``mode="immediate" | "after_turn"``, docs
    "Cancel streaming after the current turn", PR #2710); durable's docs say the SDK's
    streaming works "for a caller outside it" as the SDK's docs say. Calling it at the
    first delta should end the iteration (is_complete)."""
    result = durable_run_streamed(osa.agent, input="Please tell me 5 jokes.")
    drive(result.run_id)
    deltas: list[str] = []

    async def main() -> None:
        async for event in result.stream_events():
            if event.type == "raw_response_event" and isinstance(
                event.data, ResponseTextDeltaEvent
            ):
                deltas.append(event.data.delta)
                result.cancel()  # at the first delta: the writer may merge tokens

    asyncio.run(main())
    assert len(deltas) == 1 and result.is_complete


# --- PydanticAI ---------------------------------------------------------------------------


def test_pai_a_handler_and_stream_true_write_and_hand_each_event_once():
    """https://github.com/zenml-io/kitaru/issues/426 (a durable PydanticAI adapter
    published each stream event twice when an ``event_stream_handler`` was set) and
    https://github.com/pydantic/pydantic-ai/issues/2804 (under Temporal the tool events
    reached the handler from outside the activity): a run with a handler, started with
    ``stream=True`` too, writes each delta once, and the handler gets the page's events
    once, tool events included, in the worker."""
    run = drive(sa.durable_weather.start(sa_prompt(), stream=True).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    from tests.contrib.test_pydantic_ai_streaming import ANSWER, ARGS, PAGE

    assert sa.output_messages == PAGE
    events = events_of(run.id)
    tokens = [e.data["delta"] for e in events if e.kind == "token"]
    assert "".join(tokens) == ANSWER
    args = [e.data["delta"] for e in events if e.kind == "tool_call_delta"]
    assert "".join(args) == ARGS
    assert [e.kind for e in events].count("tool_call_ended") == 1


def sa_prompt() -> str:
    return "What will the weather be like in Paris on Tuesday?"


#: the preamble-then-call agent's tool calls
LOOKUPS: list[str] = []
PREAMBLE = "Let me look that up."
LOOKED_UP = "Order B-7 shipped on Monday."


def _looked_up(messages: list[ModelMessage]) -> bool:
    return any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)


async def preamble_stream(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    if _looked_up(messages):
        for piece in ("Order B-7 ", "shipped ", "on Monday."):
            yield piece
        return
    for piece in ("Let me ", "look that up."):
        yield piece
    yield {1: DeltaToolCall(name="lookup_order", tool_call_id="c1")}
    yield {1: DeltaToolCall(json_args='{"order": "B-7"}')}


preamble_agent = Agent(FunctionModel(stream_function=preamble_stream), end_strategy="early")


@preamble_agent.tool_plain
def lookup_order(order: str) -> str:
    LOOKUPS.append(order)
    return f"{order}: shipped Monday"


durable_preamble = DurableAgent(preamble_agent, name="t30b.preamble", version="1")


def test_pai_text_before_a_tool_call_does_not_end_the_streamed_run():
    """https://github.com/pydantic/pydantic-ai/issues/3574 (and #2256, #7688): with
    ``run_stream`` a response with text ahead of its tool call was taken as the final
    result; the tool never ran and the answer was the preamble. A durable
    ``run_stream`` runs the whole loop: the tool runs, the output is the answer after
    it, and ``stream_text()`` ends with that answer."""
    result = durable_preamble.run_stream_sync("Where is order B-7?")
    run = drive(result.run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert LOOKUPS == ["B-7"]
    texts = list(result.stream_text())
    assert texts[-1] == LOOKED_UP
    assert result.get_output(timeout=5) == LOOKED_UP


def test_pai_stream_text_is_cumulative_per_request_and_delta_is_each_piece_once():
    """https://github.com/pydantic/pydantic-ai/issues/177 (PR #178) and
    https://github.com/pydantic/pydantic-ai/issues/258: ``stream_text()`` yields the
    text so far, ``stream_text(delta=True)`` each new piece once. Over two model
    requests: the cumulative text grows within a request and starts over once at the
    second; the pieces join to both texts, none repeated, no tool arguments in them."""
    result = durable_preamble.run_stream_sync("Where is order B-7?")
    drive(result.run_id)
    texts = list(result.stream_text())
    restarts = [b for a, b in zip(texts, texts[1:], strict=False) if not b.startswith(a)]
    assert len(restarts) == 1 and LOOKED_UP.startswith(restarts[0])
    assert PREAMBLE in texts and texts[-1] == LOOKED_UP
    pieces = list(durable_preamble.stream(result.run_id).stream_text(delta=True))
    assert "".join(pieces) == PREAMBLE + LOOKED_UP
    assert not any('B-7"' in p or "{" in p for p in pieces)


# --- LangGraph ----------------------------------------------------------------------------


class AskState(TypedDict, total=False):
    topic: str
    joke: str


def ask_graph() -> StateGraph:
    """fetch (plain) -> confirm (asks a person: interrupt)."""

    def fetch(state: AskState):
        return {"topic": state["topic"] + " (looked up)"}

    def confirm(state: AskState):
        ok = interrupt({"question": f"tell a joke about {state['topic']}?"})
        return {"joke": "yes" if ok else "no"}

    return (
        StateGraph(AskState)
        .add_node(fetch)
        .add_node(confirm)
        .add_edge(START, "fetch")
        .add_edge("fetch", "confirm")
    )


class ChatState(TypedDict, total=False):
    topic: str
    joke: str


def chat_subgraph_graph() -> StateGraph:
    """node_1 (plain) -> node_2, a compiled subgraph whose node calls a chat model."""

    def call_model(state: ChatState):
        reply = lgs.DIRECT.invoke([{"role": "user", "content": state["topic"]}])
        return {"joke": reply.content}

    sub = StateGraph(ChatState).add_node(call_model).add_edge(START, "call_model").compile()

    def node_1(state: ChatState):
        return {"topic": state["topic"] + " and cats"}

    return (
        StateGraph(ChatState)
        .add_node("node_1", node_1)
        .add_node("node_2", sub)
        .add_edge(START, "node_1")
        .add_edge("node_1", "node_2")
    )


graph_workflow("t30b.ask", "1", ask_graph, resume="approve")
graph_workflow("t30b.chat-sub", "1", chat_subgraph_graph)

TOPIC = {"topic": "ice cream"}


def _langgraph(build, *inputs, **options) -> list[Any]:
    """LangGraph's own graph.stream over ``inputs`` in turn (a thread), concatenated."""
    graph = build().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    return [c for given in inputs for c in graph.stream(given, config, **options)]


def _plain(chunk: Any) -> Any:
    """An ``__interrupt__``'s Interrupts by value (ids differ between the two runs)."""
    if isinstance(chunk, tuple) and len(chunk) == 2 and isinstance(chunk[0], str):
        return (chunk[0], _plain(chunk[1]))
    if isinstance(chunk, dict) and "__interrupt__" in chunk:
        return {**chunk, "__interrupt__": [i.value for i in chunk["__interrupt__"]]}
    return chunk


@pytest.mark.parametrize("mode", ["values", ["values", "updates"], "updates"])
def test_lg_an_interrupt_surfaces_in_the_modes_langgraph_surfaces_it(lgs_workflows, mode):
    """https://github.com/langchain-ai/langgraph/pull/6141 (issue #5409) and
    https://github.com/langchain-ai/langgraph/pull/6475: an interrupt must surface when
    streaming ``values`` (with the state), and in both chunks with ``["values",
    "updates"]``. A durable graph run's stream ends at the question as graph.stream."""
    expected = _langgraph(ask_graph, TOPIC, stream_mode=mode)
    chunks = stream("t30b.ask", TOPIC, stream_mode=mode)
    run = drive(chunks.run_id)
    assert run.status == RunStatus.WAITING, run.error
    got = list(chunks)
    assert [_plain(c) for c in got] == [_plain(c) for c in expected]
    assert "__interrupt__" in str(got[-1])


def test_lg_updates_are_not_repeated_after_the_resume(lgs_workflows):
    """https://github.com/langchain-ai/langgraph-studio/issues/245 and the "updates
    repeated on resume" class (LangGraph replays a resumed node, not its finished
    predecessors): the whole run's ``updates``, read after the answer, are LangGraph's
    first stream then its resumed stream -- fetch's update once."""
    expected = _langgraph(ask_graph, TOPIC, Command(resume=True), stream_mode="updates")
    chunks = stream("t30b.ask", TOPIC, stream_mode="updates")
    run = drive(chunks.run_id)
    assert run.status == RunStatus.WAITING
    run = approve(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    whole = list(stream(run.id, stream_mode="updates"))
    assert [_plain(c) for c in whole] == [_plain(c) for c in expected]
    assert sum(1 for c in whole if "fetch" in c) == 1


@pytest.mark.parametrize("subgraphs", [False, True])
def test_lg_messages_of_a_chat_model_in_a_subgraph(lgs_workflows, subgraphs):
    """https://github.com/langchain-ai/langgraph/pull/2256,
    https://github.com/langchain-ai/langgraph/issues/5010 and
    https://github.com/langchain-ai/langgraph/pull/5836: ``messages`` mode with a chat
    model inside a subgraph, with and without ``subgraphs=True``. The durable run's
    chunks are LangGraph's: the same tokens, once each, from the same node and
    namespace."""
    expected = _langgraph(chat_subgraph_graph, TOPIC, stream_mode="messages", subgraphs=subgraphs)
    chunks = stream("t30b.chat-sub", TOPIC, stream_mode="messages", subgraphs=subgraphs)
    run = drive(chunks.run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    got = list(chunks)

    def shape(chunks: list[Any]) -> list[Any]:
        out = []
        for chunk in chunks:
            ns, (message, meta) = chunk if subgraphs else ((), chunk)
            names = tuple(n.split(":")[0] for n in ns)
            out.append((names, message.content, meta["langgraph_node"]))
        return out

    assert shape(got) == shape(expected)
    text = "".join(c for _, c, _ in shape(got))
    # LangGraph streams a subgraph's messages only with subgraphs=True (PR #4843)
    assert text == ("directly about ice cream and cats" if subgraphs else "")


def messages_graph(model: Any) -> StateGraph:
    """One node asks ``model`` and returns its reply into ``messages`` (add_messages)."""
    from langgraph.graph import MessagesState

    def call_model(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    return StateGraph(MessagesState).add_node(call_model).add_edge(START, "call_model")


graph_workflow("t30b.messages", "1", lambda: messages_graph(lgs.JOKER))


def test_lg_messages_mode_does_not_repeat_the_whole_reply_after_its_tokens(lgs_workflows):
    """https://github.com/langchain-ai/langgraph/issues/6153: ``stream_mode="messages"``
    gave the tokens and then the whole message again. LangGraph skips a node's returned
    message whose id it streamed already; a node returning a ``durable_chat_model``'s
    reply must not stream it a second time, whole, after its tokens."""
    question = {"messages": [{"role": "user", "content": "ice cream"}]}
    expected = _langgraph(
        lambda: messages_graph(lgs.ScriptedChat(label="joker")), question, stream_mode="messages"
    )
    chunks = stream("t30b.messages", question, stream_mode="messages")
    run = drive(chunks.run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    got = list(chunks)
    # the run's writer may merge tokens not yet committed: the text, not its cut, is compared
    assert {type(m).__name__ for m, _ in got} == {type(m).__name__ for m, _ in expected}
    assert {type(m).__name__ for m, _ in got} == {"AIMessageChunk"}
    text = "".join(m.content for m, _ in expected)
    assert "".join(m.content for m, _ in got) == text == "a joke about ice cream"


def ask_after_chat_graph() -> StateGraph:
    """One node: a durable_chat_model's joke, then a question (interrupt) about it."""

    def joke_then_ask(state: AskState):
        reply = lgs.JOKER.invoke([{"role": "user", "content": state["topic"]}])
        ok = interrupt({"question": f"tell it? {reply.content}"})
        return {"joke": reply.content if ok else "no"}

    return StateGraph(AskState).add_node(joke_then_ask).add_edge(START, "joke_then_ask")


graph_workflow("t30b.ask-after-chat", "1", ask_after_chat_graph, resume="approve")


def test_lg_a_node_resumed_after_its_interrupt_does_not_stream_its_model_again(lgs_workflows):
    """https://github.com/langchain-ai/langgraph/issues/6208: a node that interrupted is
    executed again from its start on the resume, so what it streamed before the
    interrupt (a chat model's tokens) comes again. A durable run replays the recorded
    chat step: the model is asked once, and the run's ``messages`` have its text once."""
    chunks = stream("t30b.ask-after-chat", TOPIC, stream_mode=["messages", "updates"])
    run = drive(chunks.run_id)
    assert run.status == RunStatus.WAITING, run.error
    run = approve(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    whole = list(stream(run.id, stream_mode=["messages", "updates"]))
    text = "".join(c[0].content for mode, c in whole if mode == "messages")
    assert text == "a joke about ice cream"
    assert [c for c in lgs.CALLS if c[0] == "joker"] == [("joker", "stream", "ice cream")]
    updates = [c for mode, c in whole if mode == "updates"]
    assert [list(u) for u in updates] == [["__interrupt__"], ["joke_then_ask"]]


def custom_subgraph_graph() -> StateGraph:
    """node_1 writes custom data, then node_2: a subgraph whose node writes too."""
    from langgraph.config import get_stream_writer

    def inner(state: ChatState):
        get_stream_writer()({"from": "inner"})
        return {"joke": "j"}

    sub = StateGraph(ChatState).add_node(inner).add_edge(START, "inner").compile()

    def node_1(state: ChatState):
        get_stream_writer()({"from": "node_1"})
        return {"topic": state["topic"] + "!"}

    return (
        StateGraph(ChatState)
        .add_node("node_1", node_1)
        .add_node("node_2", sub)
        .add_edge(START, "node_1")
        .add_edge("node_1", "node_2")
    )


graph_workflow("t30b.custom-sub", "1", custom_subgraph_graph)


@pytest.mark.parametrize("subgraphs", [False, True])
def test_lg_custom_data_of_a_subgraph_follows_the_subgraphs_flag(lgs_workflows, subgraphs):
    """https://github.com/langchain-ai/langgraph/pull/4843 (issue #4826): ``custom`` (and
    ``messages``) ignored ``subgraphs=False`` and streamed every subgraph's writes. The
    durable run's ``custom`` chunks are LangGraph's, with and without the flag."""
    expected = _langgraph(custom_subgraph_graph, TOPIC, stream_mode="custom", subgraphs=subgraphs)
    chunks = stream("t30b.custom-sub", TOPIC, stream_mode="custom", subgraphs=subgraphs)
    run = drive(chunks.run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error

    def shape(chunks: list[Any]) -> list[Any]:
        if not subgraphs:
            return chunks
        return [(tuple(n.split(":")[0] for n in ns), c) for ns, c in chunks]

    assert shape(list(chunks)) == shape(expected)
