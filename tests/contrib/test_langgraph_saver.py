"""DurableSaver used the way a graph uses it (sync), its secrets and its errors."""

from __future__ import annotations

import operator
import uuid
from typing import Annotated, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from durable.contrib.langgraph import DurableSaver
from durable.contrib.langgraph.models import LangGraphBlob, LangGraphCheckpoint, LangGraphWrite
from durable.contrib.langgraph.serde import CIPHER, DurableSerializer

# a sync graph puts its checkpoints from LangGraph's background threads, on their own
# connections: the test transaction cannot hold them, so these tests commit and flush
pytestmark = pytest.mark.django_db(transaction=True)


class State(TypedDict):
    items: Annotated[list[str], operator.add]
    config: dict


def _graph(saver):
    builder = StateGraph(State)
    builder.add_node("a", lambda s: {"items": ["a"]})
    builder.add_node("b", lambda s: {"items": ["b"]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    return builder.compile(checkpointer=saver)


def test_a_graph_runs_on_the_saver_and_its_state_reads_back():
    saver = DurableSaver()
    graph = _graph(saver)
    config = {"configurable": {"thread_id": f"t-{uuid.uuid4()}"}}
    out = graph.invoke({"items": ["start"], "config": {}}, config)
    assert out["items"] == ["start", "a", "b"]
    state = graph.get_state(config)
    assert state.values["items"] == ["start", "a", "b"]
    history = list(graph.get_state_history(config))
    assert len(history) == 4  # input, a, b and the end
    # a second invocation on the same thread continues its state
    out = graph.invoke({"items": ["again"]}, config)
    assert out["items"] == ["start", "a", "b", "again", "a", "b"]


def test_a_secret_in_the_state_is_stored_encrypted_and_reads_back():
    saver = DurableSaver()
    graph = _graph(saver)
    thread = f"t-{uuid.uuid4()}"
    config = {"configurable": {"thread_id": thread}}
    secret = "sk-" + "Z" * 40
    graph.invoke({"items": ["x"], "config": {"api_key": secret}}, config)
    assert graph.get_state(config).values["config"] == {"api_key": secret}
    blobs = LangGraphBlob.objects.filter(thread_id=thread, channel="config")
    assert blobs and all(b.type.endswith("+" + CIPHER) for b in blobs)
    stored = [bytes(b.blob) for b in LangGraphBlob.objects.filter(thread_id=thread)]
    stored += [bytes(w.blob) for w in LangGraphWrite.objects.filter(thread_id=thread)]
    stored += [bytes(c.checkpoint) for c in LangGraphCheckpoint.objects.filter(thread_id=thread)]
    assert stored and not any(secret.encode() in data for data in stored)
    # a value without secrets stays clear (readable by LangGraph's own tools)
    items = LangGraphBlob.objects.filter(thread_id=thread, channel="items").first()
    assert items is not None and not items.type.endswith(CIPHER)


def test_a_token_anywhere_in_a_value_is_encrypted():
    serde = DurableSerializer()
    typ, data = serde.dumps_typed({"note": "use Bearer abcdefghijklmnop1234 please"})
    assert typ.endswith("+" + CIPHER) and b"abcdefghijklmnop" not in data
    assert serde.loads_typed((typ, data)) == {"note": "use Bearer abcdefghijklmnop1234 please"}
    assert serde.dumps_typed({"note": "hello"})[0] == "msgpack"


def test_bad_ids_get_a_clear_error_and_write_nothing():
    saver = DurableSaver()
    with pytest.raises(ValueError, match="thread_id is missing"):
        saver.get_tuple({"configurable": {}})
    with pytest.raises(ValueError, match="thread_id 'a\\\\x00b' contains a NUL"):
        _graph(saver).invoke({"items": []}, {"configurable": {"thread_id": "a\x00b"}})
    assert not LangGraphCheckpoint.objects.filter(thread_id__startswith="a").exists()
    with pytest.raises(ValueError, match="unknown strategy 'newest'"):
        saver.prune(["t"], strategy="newest")
    with pytest.raises(ValueError, match="encrypt must be"):
        DurableSaver(encrypt="some")  # type: ignore[arg-type]
