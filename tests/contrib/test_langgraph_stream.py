"""LangGraph's stream modes for graph runs (docs/langgraph.md#streaming), in-process.

Each docs example runs twice: with LangGraph's own ``graph.stream`` (an ``InMemorySaver``)
and as a Durable run read with ``durable.contrib.langgraph.stream``; the chunks match.
The run is driven to its end first, so these read the stream's history; reading live,
and a worker lost mid-stream, are in tests/processes/test_langgraph_stream_processes.py.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from langchain_core.messages import AIMessageChunk
from langgraph.checkpoint.memory import InMemorySaver

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.langgraph import stream
from durable.models import RunStatus, Step, StreamEvent
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = {"topic": "ice cream"}


def langgraph(build, input=TOPIC, **options):
    """What LangGraph's own ``graph.stream`` yields for ``build()``'s graph."""
    graph = build().compile(checkpointer=InMemorySaver())
    return list(graph.stream(input, {"configurable": {"thread_id": "t"}}, **options))


def durable_stream(name, input=TOPIC, **options):
    """Start a run with ``stream()``, drive it to its end, read its stream."""
    chunks = stream(name, input, **options)
    run = drive(chunks.run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    return list(chunks)


def kinds(run_id):
    return [e.kind for e in StreamEvent.objects.filter(run_id=run_id).order_by("seq")]


# --- LangGraph's docs examples --------------------------------------------------------


@pytest.mark.parametrize(
    "mode",
    ["updates", "values", "custom", ["updates", "custom"], ["values", "updates", "custom"]],
)
def test_the_docs_graph_streams_as_langgraph_streams_it(lgs_workflows, mode):
    """ "Stream graph state" and "Stream custom data": the same chunks, in the same order,
    as LangGraph's graph.stream (one super-step per Durable step is not seen)."""
    expected = langgraph(lgs_workflows.joke_graph, stream_mode=mode)
    assert durable_stream("lgs.joke", stream_mode=mode) == expected
    if mode == "updates":
        assert expected == [
            {"refine_topic": {"topic": "ice cream and cats"}},
            {"generate_joke": {"joke": "This is a joke about ice cream and cats"}},
        ]


def test_the_default_mode_is_the_graphs_own_as_in_langgraph(lgs_workflows):
    """A StateGraph's graph.stream streams ``updates`` unless told."""
    expected = langgraph(lgs_workflows.joke_graph)
    assert durable_stream("lgs.joke") == expected
    assert list(expected[0]) == ["refine_topic"]


def test_stream_llm_tokens_of_a_durable_chat_model(lgs_workflows):
    """ "Stream LLM tokens": the node's durable_chat_model streams its reply; the chunks
    are AIMessageChunks with LangGraph's metadata; the step records what invoke does."""
    chunks = durable_stream("lgs.chat", stream_mode="messages")
    assert all(isinstance(m, AIMessageChunk) for m, _ in chunks)
    text = "".join(m.content for m, _ in chunks)
    assert text == "a joke about ice cream"
    assert {meta["langgraph_node"] for _, meta in chunks} == {"call_model"}
    assert {m.id for m, _ in chunks} and len({m.id for m, _ in chunks}) == 1
    assert chunks[-1][0].chunk_position == "last"
    assert chunks[-1][0].usage_metadata == {
        "input_tokens": 3,
        "output_tokens": 4,
        "total_tokens": 7,
    }
    meta = chunks[0][1]
    assert meta["langgraph_step"] == 1 and meta["langgraph_triggers"] == ("branch:to:call_model",)
    assert meta["ls_model_type"] == "chat"
    # as LangGraph gives the same model's tokens, called directly in the node
    direct = langgraph(
        lambda: lgs_workflows.llm_joke_graph(lgs_workflows.ScriptedChat()), stream_mode="messages"
    )
    assert "".join(m.content for m, _ in direct) == text
    assert {k for k in direct[0][1] if k.startswith("langgraph_")} == {
        k for k in meta if k.startswith("langgraph_")
    }
    # asked once, streamed; the step's record is invoke's (the message whole)
    assert [c[1] for c in lgs_workflows.CALLS if c[0] == "joker"] == ["stream"]
    run_id = StreamEvent.objects.order_by("-id").first().run_id
    step = Step.objects.get(run_id=run_id, step_id="call_model.llm")
    record = step.output_value()
    assert record["content"] == text and record["message"]["type"] == "ai"
    assert record["usage"]["total_tokens"] == 7 and record["finish_reason"] == "stop"
    # the whole reply the node returned is not sent again as a message
    assert "graph_messages" not in kinds(run_id)


def test_a_streamed_chat_step_records_what_the_unstreamed_one_records(lgs_workflows):
    """The same graph, with and without ``messages``: the same record but the ids."""
    streamed = stream("lgs.chat", TOPIC, stream_mode="messages")
    plain = stream("lgs.chat", TOPIC, stream_mode="updates")
    records = []
    for run_id in (streamed.run_id, plain.run_id):
        assert drive(run_id).status == RunStatus.SUCCEEDED
        record = Step.objects.get(run_id=run_id, step_id="call_model.llm").output_value()
        record["message"]["data"].pop("id")
        records.append(record)
    assert [c[1] for c in lgs_workflows.CALLS] == ["stream", "invoke"]
    streamed_msg, plain_msg = (r.pop("message") for r in records)
    assert records[0] == records[1]
    for key in ("content", "tool_calls", "usage_metadata", "type"):
        assert streamed_msg["data"][key] == plain_msg["data"][key], key


def test_a_chat_models_tool_call_streams_as_tool_call_chunks(lgs_workflows):
    chunks = durable_stream("lgs.chat_tools", stream_mode="messages")
    total = None
    for message, _ in chunks:
        total = message if total is None else total + message
    assert total.content == "a joke about ice cream"
    assert total.tool_calls == [
        {"name": "search", "args": {"q": "ice cream"}, "id": "call_1", "type": "tool_call"}
    ]
    run_id = StreamEvent.objects.order_by("-id").first().run_id
    assert {"tool_call_started", "tool_call_delta", "tool_call_ended"} <= set(kinds(run_id))


def test_a_chat_model_langgraph_streams_in_a_node(lgs_workflows):
    """A chat model called directly in a node (not a Durable step): LangGraph streams
    its tokens in the super-step; they are the run's graph_messages events."""
    expected = langgraph(
        lambda: lgs_workflows.llm_joke_graph(lgs_workflows.DIRECT), stream_mode="messages"
    )
    chunks = durable_stream("lgs.direct", stream_mode="messages")
    assert [m.content for m, _ in chunks] == [m.content for m, _ in expected]
    assert [type(m) for m, _ in chunks] == [type(m) for m, _ in expected]
    drop = ("langgraph_checkpoint_ns", "checkpoint_ns", "thread_id")
    assert [{k: v for k, v in meta.items() if k not in drop} for _, meta in chunks] == [
        {k: v for k, v in meta.items() if k not in drop} for _, meta in expected
    ]


def test_subgraphs_stream_with_their_namespace(lgs_workflows):
    """ "Stream subgraph outputs": (ns, chunk) with subgraphs=True, the parent's only
    without."""
    input = {"foo": "foo"}
    expected = langgraph(lgs_workflows.subgraph_graph, input, stream_mode="updates", subgraphs=True)
    got = durable_stream("lgs.subgraph", input, stream_mode="updates", subgraphs=True)

    def names(chunks):
        return [(tuple(n.split(":")[0] for n in ns), chunk) for ns, chunk in chunks]

    assert names(got) == names(expected)
    assert ("node_2",) in {ns for ns, _ in names(got)}
    parent = durable_stream("lgs.subgraph", input, stream_mode="updates")
    assert parent == langgraph(lgs_workflows.subgraph_graph, input, stream_mode="updates")


# --- interrupts, Durable steps, replays -----------------------------------------------


def test_durable_steps_are_not_interrupts_a_question_is_and_a_replay_streams_nothing(
    lgs_workflows,
):
    """fetch writes custom data and calls a Durable tool (an interrupt under the hood,
    not streamed; the node runs again and writes its custom data again); confirm asks a
    person: the stream ends at LangGraph's ``__interrupt__``, as graph.stream does.
    After the answer the run is replayed: its recorded steps write nothing more."""
    chunks = stream("lgs.tools", TOPIC, stream_mode=["updates", "custom"])
    run = drive(chunks.run_id)
    assert run.status == RunStatus.WAITING
    first = list(chunks)
    assert first[:3] == [
        ("custom", {"progress": "fetching"}),
        ("custom", {"progress": "fetching"}),  # the node ran again with the tool's answer
        ("updates", {"fetch": {"topic": "ice cream (looked up)"}}),
    ]
    mode, last = first[-1]
    assert mode == "updates" and list(last) == ["__interrupt__"]
    (question,) = last["__interrupt__"]
    assert question.value == {"question": "tell a joke about ice cream (looked up)?"}
    assert len(first) == 4
    before = list(
        StreamEvent.objects.filter(run_id=run.id)
        .order_by("seq")
        .values_list("seq", "step_id", "kind")
    )

    user = User.objects.create_user("alice", password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    request = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=request.pk, user=user, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    after = list(
        StreamEvent.objects.filter(run_id=run.id)
        .order_by("seq")
        .values_list("seq", "step_id", "kind")
    )
    assert after[: len(before)] == before
    new_steps = {step for _, step, _ in after[len(before) :]}
    assert new_steps and not new_steps & {step for _, step, _ in before}
    rest = list(stream(run.id, stream_mode="updates", after=before[-1][0]))
    assert rest == [{"confirm": {"joke": "yes"}}]


def test_a_failed_super_step_says_so_and_does_not_repeat_the_saved_updates(lgs_workflows):
    """b fails once; the super-step is retried: a's writes were saved, so a's update is
    not streamed again if the failed try streamed it (LangGraph repeats it as ``cached``;
    a try that failed before LangGraph emitted it leaves it to the retry, cached); b's
    custom write is streamed twice (b ran twice)."""
    lgs_workflows.FAIL_ONCE.add("b")
    run = drive(durable.start("lgs.fan", {"log": []}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    events = list(StreamEvent.objects.filter(run_id=run.id).order_by("seq"))
    first = [e for e in events if e.step_id == "superstep-1"]
    cut = [i for i, e in enumerate(first) if e.kind == "interrupted"]
    assert len(cut) == 1 and first[cut[0]].data["reason"] == "failed"
    assert (
        first[cut[0] - 1].kind == "step_ended"
        and "b failed once" in first[cut[0] - 1].data["error"]
    )
    chunks = list(stream(run.id, stream_mode=["updates", "custom"]))
    updates = [c for m, c in chunks if m == "updates"]
    for update in updates:
        update.pop("__metadata__", None)
    assert updates == [{"a": {"log": ["a"]}}, {"b": {"log": ["b"]}}, {"c": {"log": ["c"]}}]
    customs = [c["ran"] for m, c in chunks if m == "custom"]
    assert sorted(customs) == ["a", "b", "b", "c"]  # b ran twice


def test_a_late_reader_resumes_after_a_seq(lgs_workflows):
    chunks = stream("lgs.joke", TOPIC, stream_mode=["updates"])
    drive(chunks.run_id)
    whole = list(chunks)
    seqs = list(
        StreamEvent.objects.filter(run_id=chunks.run_id)
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert list(stream(chunks.run_id, stream_mode=["updates"], after=seqs[0])) == whole[1:]
    assert chunks.last_seq == seqs[-1]


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("debug", "stream_mode 'debug' is not supported by a graph run"),
        ("checkpoints", "stream_mode 'checkpoints' is not supported"),
        (["updates", "tasks"], "stream_mode 'tasks' is not supported"),
        ("message", "unknown stream_mode 'message'; the modes are values, updates"),
        ([], "stream_mode names no mode"),
        (7, "stream_mode is a mode or a list of modes"),
    ],
)
def test_an_unknown_or_unsupported_mode_is_a_clear_error(lgs_workflows, mode, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        stream("lgs.joke", TOPIC, stream_mode=mode)
    assert not durable.models.Run.objects.exists()


def test_reading_a_mode_the_run_does_not_write_is_a_clear_error(lgs_workflows):
    run = drive(durable.start("lgs.joke_updates", TOPIC).id)
    assert len(list(stream(run.id, stream_mode="updates"))) == 2  # it writes updates
    with pytest.raises(ValueError, match=r"does not write stream_mode 'values' \(it writes"):
        stream(run.id, stream_mode="values")
    plain = durable.start("lgs.joke", TOPIC)
    with pytest.raises(ValueError, match="it writes none"):
        stream(plain.id)


def test_other_bad_arguments_are_clear_errors(lgs_workflows):
    from durable.contrib.langgraph import graph_workflow, start_graph
    from durable.exceptions import DurableConfigurationError

    with pytest.raises(ValueError, match="'lgs.joke' is a graph workflow: pass input"):
        stream("lgs.joke")
    with pytest.raises(durable.RunNotFound):
        stream("no-such-run")
    from tests import stream_workflows  # noqa: F401  (registers stream.chat)

    with pytest.raises(ValueError, match="workflow 'stream.chat' is not a graph workflow"):
        stream("stream.chat", {"message": "hi"})
    with pytest.raises(ValueError, match="version='v2'"):
        stream("lgs.joke", TOPIC, version="v2")
    with pytest.raises(ValueError, match=r"start_graph\('lgs.joke'\): unknown stream_mode"):
        start_graph("lgs.joke", TOPIC, stream_mode="value")
    with pytest.raises(DurableConfigurationError, match=r"graph_workflow\('x'\).*'debug'"):
        graph_workflow("x", "1", lgs_workflows.joke_graph, stream_mode="debug")


def test_a_run_that_streams_nothing_writes_nothing(lgs_workflows):
    run = drive(durable.start("lgs.chat", TOPIC).id)
    assert run.status == RunStatus.SUCCEEDED
    assert not StreamEvent.objects.filter(run_id=run.id).exists()
    assert [c[1] for c in lgs_workflows.CALLS] == ["invoke"]


# --- the mapping, unit by unit ----------------------------------------------------------


def test_chunks_round_trip_through_json_with_their_messages_and_interrupts():
    import json

    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.types import Interrupt

    from durable.contrib.langgraph.streaming import decode, encode

    chunk = {
        "messages": [HumanMessage("hi", id="1"), AIMessage("yo", id="2")],
        "tool": ToolMessage("42", tool_call_id="c1"),
        "__interrupt__": (Interrupt(value={"q": 1}, id="i1"),),
        "lc": 1,
        "nested": {"t": (1, 2)},
    }
    data = json.loads(json.dumps(encode(chunk)))
    assert decode(data) == {
        **chunk,
        "__interrupt__": [chunk["__interrupt__"][0]],
        "nested": {"t": [1, 2]},
    }
    assert encode(object()).startswith("<object object")


def test_a_chat_models_chunks_map_to_the_run_streams_kinds():
    """openai_delta + Assembly: text deltas are ``token``; a tool call's fragments are
    ``tool_call_started``, ``tool_call_delta`` and, at its end, ``tool_call_ended``;
    the chunks added up are the AIMessage invoke returns."""
    from durable.contrib.langgraph.streaming import streamed_reply
    from tests.contrib.lg_stream_workflows import ScriptedChat

    model = ScriptedChat(label="unit", tool="search")
    events = []
    message = streamed_reply(model, [("user", "otters")], {}, lambda k, d: events.append((k, d)))
    assert [k for k, _ in events] == [
        "token",
        "token",
        "token",
        "token",
        "tool_call_started",
        "tool_call_delta",
        "tool_call_delta",
        "tool_call_ended",
    ]
    assert "".join(d["delta"] for k, d in events if k == "token") == "a joke about otters"
    assert events[4][1] == {"index": 0, "id": "call_1", "name": "search"}
    assert events[-1][1]["arguments"] == '{"q": "otters"}'
    invoked = model.invoke([("user", "otters")])
    assert type(message) is type(invoked)
    assert (message.content, message.tool_calls, message.usage_metadata) == (
        invoked.content,
        invoked.tool_calls,
        invoked.usage_metadata,
    )


def test_the_sse_schema_names_the_graph_kinds():
    from api.streams import SSE_EVENT

    kinds = SSE_EVENT["properties"]["event"]["enum"]
    assert {"graph_values", "graph_updates", "graph_custom", "graph_messages"} <= set(kinds)


def test_the_replay_check_passes_over_streamed_graph_runs_and_writes_nothing(lgs_workflows):
    """A waiting run that streamed (a chat step's tokens, super-steps' updates) and a
    finished one: the dry replay completes them and the stream is left as it was."""
    import json
    from io import StringIO

    from django.core.management import call_command

    waiting = stream("lgs.tools", TOPIC, stream_mode=["updates", "custom"])
    assert drive(waiting.run_id).status == RunStatus.WAITING
    done = stream("lgs.chat_tools", TOPIC, stream_mode=["messages", "values"])
    assert drive(done.run_id).status == RunStatus.SUCCEEDED
    before = StreamEvent.objects.count()
    out = StringIO()
    call_command(
        "durable", "replay-check", "--json", "--status", "all", stdout=out, stderr=StringIO()
    )
    report = json.loads(out.getvalue())
    assert report["checked"] == 2 and report["compatible"] and report["diverged"] == 0
    outcomes = sorted(next(iter(g["outcomes"])) for g in report["groups"])
    assert outcomes == ["completes", "continues"], report  # done; waiting at its question
    assert StreamEvent.objects.count() == before
