"""A graph run's stream modes read live while a real worker runs it, and a worker
SIGKILLed mid-stream (docs/langgraph.md#streaming).

The graph's node asks a ``durable_chat_model`` over the scripted model
(examples/fake_llm.py, in a thread of this process), which holds its first stream after
three words (``[fault:stream_hold=3]``): the reader, ``durable.contrib.langgraph.stream``,
has them as ``messages`` chunks while the model still holds the rest.
"""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")

from durable.contrib.langgraph import stream
from durable.models import RunStatus, Step, StreamEvent
from tests.contrib import lg_stream_workflows
from tests.harness import wait_for_run

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.contrib.lg_stream_workflows"}
TOPIC = {"topic": "[fault:stream_hold=3] tell me about otters"}
MODES = ["updates", "messages"]


def take(chunks, until):
    """Read ``chunks`` (an iterator) until ``until(read)`` holds; returns what was read."""
    read = []
    for chunk in chunks:
        read.append(chunk)
        if until(read):
            return read
    raise AssertionError(f"the stream ended before the condition: {read}")


def text(read, message_id=None) -> str:
    """The text of the ``messages`` chunks read (of one message)."""
    messages = [chunk[0] for mode, chunk in read if mode == "messages"]
    return "".join(m.content for m in messages if message_id in (None, m.id))


def test_a_reader_gets_the_graphs_chunks_live_while_the_worker_runs_it(
    workers, proc_env, streaming_llm
):
    workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    chunks = stream("lgs.openai", TOPIC, stream_mode=MODES, timeout=60)
    live = iter(chunks)
    read = take(live, lambda r: text(r) == "(scripted model, no")
    # the model holds the rest: the run is still running, nothing is recorded yet
    assert not Step.objects.filter(run_id=chunks.run_id, step_id="call_model.llm").exists()
    message, metadata = read[-1][1]
    assert metadata["langgraph_node"] == "call_model" and message.id.startswith("lc_run--")
    streaming_llm.release.set()
    read += list(live)
    run = wait_for_run(chunks.run_id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    reply = Step.objects.get(run=run, step_id="call_model.llm").output_value()
    assert text(read) == reply["content"] and "otters" in reply["content"]
    assert read[-1] == ("updates", {"call_model": {"joke": reply["content"]}})
    assert len(streaming_llm.received) == 1
    # a late reader gets the same, from the history
    assert list(stream(run.id, stream_mode=MODES)) == read


def test_a_worker_killed_mid_stream_the_reader_sees_the_cut_and_the_new_try(
    workers, proc_env, streaming_llm
):
    """The model call is recorded once; the reader, reading across the kill, has the
    three words of the cut-off try, then the whole reply under another message id with
    ``durable_interrupted`` in its metadata, then the node's update, once."""
    first = workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    chunks = stream("lgs.openai", TOPIC, stream_mode=MODES, timeout=90)
    live = iter(chunks)
    read = take(live, lambda r: text(r) == "(scripted model, no")
    workers.kill(first)  # mid-stream: the model has more to say, nothing is recorded
    assert not Step.objects.filter(run_id=chunks.run_id, step_id="call_model.llm").exists()
    workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    # sweep as beat would until the run is taken over and done (the reader does not
    # sweep: without it the takeover waits for a sweep nobody sends), then the same
    # reader goes on from where it stopped before the kill
    run = wait_for_run(chunks.run_id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    read += list(live)

    (step,) = Step.objects.filter(run=run, step_id="call_model.llm")  # recorded once
    reply = step.output_value()
    assert len(streaming_llm.received) == 2  # asked again once, after the lost worker
    messages = [chunk for mode, chunk in read if mode == "messages"]
    ids = list(dict.fromkeys(m.id for m, _ in messages))
    assert len(ids) == 2
    assert text(read, ids[0]) == "(scripted model, no"
    assert text(read, ids[1]) == reply["content"]
    cut = next(meta for m, meta in messages if m.id == ids[1])
    assert cut["durable_interrupted"]["reason"] == "worker_lost"
    assert "durable_interrupted" not in messages[0][1]
    updates = [chunk for mode, chunk in read if mode == "updates"]
    assert updates == [{"call_model": {"joke": reply["content"]}}]
    kinds = [e.kind for e in StreamEvent.objects.filter(run_id=run.id).order_by("seq")]
    assert kinds.count("interrupted") == 1 and kinds.count("graph_updates") == 1
    calls = lg_stream_workflows.calls()
    assert [c[:2] for c in calls] == [["openai", "stream"], ["openai", "stream"]]


def test_a_worker_killed_mid_super_step_the_reader_sees_each_update_once(workers, proc_env):
    """a and b run in one super-step; b kills its worker once a's update is in the
    run's stream. The super-step runs again on another worker after ``interrupted``:
    a's writes were saved (not run again, its update not repeated), b runs again (its
    custom write twice, as it ran twice); the reader reads across the kill."""
    env = {**WORKER_ENV, "LGS_CRASH_AT": "b"}
    first = workers.start(wait=True, **env)
    chunks = stream("lgs.fan", {"log": []}, stream_mode=["updates", "custom"], timeout=90)
    live = iter(chunks)
    read = take(live, lambda r: ("updates", {"a": {"log": ["a"]}}) in r)
    first.wait_exit(30)  # b killed it (SIGKILL)
    workers.start(wait=True, **env)
    run = wait_for_run(chunks.run_id, timeout=60)  # sweeps as beat would (see above)
    assert run.status == RunStatus.SUCCEEDED, run.error
    read += list(live)
    assert run.output_value()["log"] == ["a", "b", "c"]
    updates = [chunk for mode, chunk in read if mode == "updates"]
    assert updates == [{"a": {"log": ["a"]}}, {"b": {"log": ["b"]}}, {"c": {"log": ["c"]}}]
    ran = [chunk["ran"] for mode, chunk in read if mode == "custom"]
    assert sorted(ran) == ["a", "b", "b", "c"]
    events = list(StreamEvent.objects.filter(run_id=run.id).order_by("seq"))
    cut = [e for e in events if e.kind == "interrupted"]
    assert [(e.step_id, e.data["reason"]) for e in cut] == [("superstep-1", "worker_lost")]
