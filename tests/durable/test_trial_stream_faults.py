"""Trial of the stream writer's ride-out of database faults (docs/streaming.md,
durable/runtime/stream_writer.py), from public reports of the same fault in tools that
do the same job. Each test names its report. The faults are injected in the writer's
thread only (its ``_write``, or its connection's ``commit`` for a commit that happened
but whose answer was lost); the step's checkpoint is left alone."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connections

import durable
from durable.models import Run, RunStatus, StreamEvent
from durable.runtime import stream_writer
from durable.testing import drive
from durable.values.redaction import secrets_scope
from tests import stream_workflows  # noqa: F401  (registers the workflows)
from tests.harness import wait_until

# transactional: the stream's writer commits from a thread of its own, as in a worker
pytestmark = pytest.mark.django_db(transaction=True)


def _stream_written_in_part(streaming_llm, monkeypatch, run_id: str) -> dict:
    """Drive ``run_id`` (its first call held after three words) on a thread: the three
    words are written, then every write fails until the writer gives the stream up."""
    failing = [False]
    state = _writes(monkeypatch, lambda n: failing[0])
    state["failing"] = failing
    driver = threading.Thread(target=drive_here, args=(run_id,))
    driver.start()
    try:
        wait_until(
            lambda: text_of(stream_of(run_id)) == "(scripted model, no",
            10,
            what="the first three words to be written",
            sweep=False,
            interval=0.02,
        )
        failing[0] = True  # the database goes away for longer than the writer waits
    finally:
        streaming_llm.release.set()
        driver.join(30)
    assert state["failed"] == 5  # the first try and its four retries, then dropped
    return state


def stream_of(run_id: str, step_id: str | None = None) -> list[StreamEvent]:
    events = StreamEvent.objects.filter(run_id=run_id).order_by("seq")
    return list(events if step_id is None else events.filter(step_id=step_id))


def text_of(events) -> str:
    return "".join(e.data["delta"] for e in events if e.kind == "token")


def drive_here(run_id: str) -> None:
    try:
        drive(run_id)
    finally:
        connections.close_all()


def _no_backoff(monkeypatch) -> None:
    monkeypatch.setattr(stream_writer, "RETRY_DELAYS", (0.0, 0.0, 0.0, 0.0))


def _writes(monkeypatch, fails) -> dict:
    """The writer's ``_write`` raises a restart's error, before writing anything, on
    the tries ``fails(n)`` says (n counts the tries from 1)."""
    real = stream_writer.StreamWriter._write
    state = {"tries": 0, "failed": 0}

    def write(self, batch):
        state["tries"] += 1
        if fails(state["tries"]):
            state["failed"] += 1
            raise OperationalError("terminating connection due to administrator command (inj)")
        return real(self, batch)

    monkeypatch.setattr(stream_writer.StreamWriter, "_write", write)
    _no_backoff(monkeypatch)
    return state


def _commits_lost(monkeypatch, lost) -> dict:
    """The stream thread's commits ``lost(n)`` says happen on the server, but their
    answer is lost: the client sees the connection drop (n counts its commits from 1)."""
    cls = type(connections["default"])
    real = cls.commit
    state = {"commits": 0, "lost": 0}

    def commit(self):
        real(self)
        if threading.current_thread().name == "durable-stream":
            state["commits"] += 1
            if lost(state["commits"]):
                state["lost"] += 1
                raise OperationalError("server closed the connection unexpectedly (inj)")

    monkeypatch.setattr(cls, "commit", commit)
    _no_backoff(monkeypatch)
    return state


def test_a_commit_whose_answer_was_lost_is_not_written_twice(streaming_llm, monkeypatch):
    """get-convex/convex-backend#559 "Retry committer writes on a lost DB connection
    (Postgres + MySQL)": a retry can follow a COMMIT that succeeded on the server while
    the client lost the answer. Here the writer's second commit is such a one: the
    events it wrote are not written again (before the fix: its token text twice, the
    retried row holding the text of both), and ``seq`` stays contiguous."""
    state = _commits_lost(monkeypatch, lambda n: n == 2)
    message = " ".join(f"word{i}" for i in range(60))
    run = drive(durable.start("stream.chat", {"message": message}).id)
    assert state["lost"] == 1
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(streaming_llm.log) == 1
    events = stream_of(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.kind for e in events].count("step_started") == 1
    assert events[-1].kind == "step_ended"
    assert text_of(events) == run.output_value()["content"]


def test_faults_in_the_middle_of_a_long_stream_keep_every_event_once_and_in_order(
    monkeypatch,
):
    """vercel/workflow#1002 "Fix racing conditions in Postgres streamer": chunks of a
    DurableAgent's stream arrived out of order and were dropped. Here 300 events are
    written while two writes fail before writing (the next events arriving meanwhile)
    and, later, two commits' answers are lost: every event is there once, in the order
    emitted, ``seq`` 1..300."""
    real = stream_writer.StreamWriter._write
    tries = {"n": 0}

    def write(self, batch):
        tries["n"] += 1
        if tries["n"] in (3, 4):
            # the next events arrive while this write fails: they follow its batch
            wait_until(lambda: len(self.pending) >= 5, 10, what="more events", sweep=False)
            raise OperationalError("the database system is shutting down (inj)")
        return real(self, batch)

    monkeypatch.setattr(stream_writer.StreamWriter, "_write", write)
    lost = _commits_lost(monkeypatch, lambda n: n in (5, 9))
    run = durable.start("stream.chat", {"message": "hi"})  # not driven: a run to write to
    writer = stream_writer.StreamWriter(run.id, "llm", max_pending=4)
    for i in range(300):
        writer.emit("tool_call_started", {"index": i, "name": f"t{i}"})
        if i % 10 == 9:  # thirty rounds at least: the faults fall among them
            wait_until(lambda: not writer.pending, 10, what="a round written", sweep=False)
    writer.close()
    assert tries["n"] >= 32 and lost["lost"] == 2
    events = stream_of(run.id)
    assert [e.data["name"] for e in events] == [f"t{i}" for i in range(300)]
    assert [e.seq for e in events] == list(range(1, 301))


def test_a_secret_in_a_retried_batch_of_token_deltas_is_redacted(monkeypatch):
    """managoat/fountain#2359 "Redaction misses a registered value split across
    streamed model-output chunks" (and OpenHands/OpenHands#15720): a secret the model
    relays in its streamed reply, in two deltas merged before a write that failed, and
    whole in a delta that came during the fault, is stored redacted after the retry --
    once, the ``[REDACTED]`` marks not garbled by the second redaction."""
    secret = "trialpass-7f3k9q2m5x"
    state = _writes(monkeypatch, lambda n: n == 1)
    run = durable.start("stream.chat", {"message": "hi"})
    with secrets_scope([secret]):
        writer = stream_writer.StreamWriter(run.id, "llm")
    with writer.cond:  # both halves wait together: they are merged into one row
        writer.emit("token", {"delta": f"my password is {secret[:9]}"})
        writer.emit("token", {"delta": f"{secret[9:]}, keep it"})
    wait_until(lambda: state["failed"] == 1, 10, what="the failed write", sweep=False)
    writer.emit("token", {"delta": f" -- again: {secret}."})
    writer.close()
    assert state["tries"] >= 2
    text = text_of(stream_of(run.id))
    assert secret not in text and secret[:9] not in text and secret[9:] not in text
    assert text == "my password is [REDACTED], keep it -- again: [REDACTED]."


def test_a_streamed_pydantic_ai_request_whose_stream_writes_fail_is_asked_once(
    monkeypatch,
):
    """pydantic/pydantic-ai#2804 "Temporal event_stream_handler is called from outside
    activity": the streamed events of a durable model request are a side channel of
    the recorded request. Here the stream writes of a DurableAgent's streamed requests
    fail twice: each request is still asked once, the run succeeds without a
    ``db_fault``, and the second request's stream holds the answer, once."""
    from tests.contrib import pai_stream_agents as sa
    from tests.contrib.test_pydantic_ai_streaming import ANSWER, PROMPT

    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    sa.MODEL_CALLS.clear()
    sa.output_messages.clear()
    state = _writes(monkeypatch, lambda n: n <= 2)
    run = drive(sa.durable_weather.start(PROMPT).id)
    assert state["failed"] == 2
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sa.MODEL_CALLS == ["weather", "weather"]
    assert sa.durable_weather.decode(run.output_value()).output == ANSWER
    assert not run.events.filter(kind="db_fault").exists()
    events = stream_of(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert text_of(stream_of(run.id, "model#2")) == ANSWER
    assert [e.kind for e in events].count("interrupted") == 0


def test_the_lease_lost_while_the_writer_waits_to_retry_writes_nothing_more(monkeypatch):
    """anthony-chaudhary/fak#5974 "a displaced lease holder still writes its results":
    a worker that lost its lease must not publish what it still holds. Here the lease
    is lost while the writer waits out a fault: neither the kept batch nor the later
    events are written, and the writer does not try the database again."""
    alive = [True]

    def fails(n):
        alive[0] = False  # the lease is taken over during the fault
        return True

    state = _writes(monkeypatch, fails)
    run = durable.start("stream.chat", {"message": "hi"})
    writer = stream_writer.StreamWriter(run.id, "llm", live=lambda: alive[0])
    writer.emit("step_started", {"model": "m"})
    wait_until(lambda: state["failed"] >= 1, 10, what="the failed write", sweep=False)
    for i in range(10):
        writer.emit("token", {"delta": f"w{i} "})
    writer.close()
    assert state["tries"] == 1
    assert stream_of(run.id) == []


def test_a_stream_dropped_mid_call_then_a_replay_neither_restreams_nor_says_interrupted(
    streaming_llm, monkeypatch
):
    """langchain-ai/langgraph#3716 "langgraph-checkpoint-postgres
    (psycopg.OperationalError: sending query and params failed: SSL error: bad length)":
    a single database connection dropped in the middle of a run. Here the first call's
    stream is
    written in part, then the database refuses it until the writer gives up; the reply
    is recorded, the run waits for a signal and is executed again: the first call is
    replayed (not asked, not streamed, no ``interrupted`` invented for it), the second
    streams on after the last written ``seq``."""
    data = {"message": "[fault:stream_hold=3] first question", "second": "second one"}
    run = durable.start("stream.twice", data)
    state = _stream_written_in_part(streaming_llm, monkeypatch, run.id)
    run = Run.objects.get(pk=run.id)
    assert run.status == RunStatus.WAITING, run.error
    before = stream_of(run.id)
    assert before[-1].kind == "token"  # the call's end was never written
    state["failing"][0] = False
    durable.signal(run.id, "go")
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(streaming_llm.log) == 2  # each call asked once
    events = stream_of(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.pk for e in events[: len(before)]] == [e.pk for e in before]
    after = events[len(before) :]
    assert {e.step_id for e in after} == {"llm#2"}
    assert [e.kind for e in after][0] == "step_started" and after[-1].kind == "step_ended"
    assert "interrupted" not in [e.kind for e in events]
    assert text_of(after) == run.output_value()[1]


def test_a_stream_dropped_mid_call_still_ends_for_its_server_sent_events_reader(
    streaming_llm, monkeypatch
):
    """earendil-works/pi#8996 "streamProxy hangs forever when the proxy stream ends
    without a terminal event": a stream cut before its end must still end for its
    reader. Here the call's ``step_ended`` is never written (the database refused the
    rest of the stream); the run succeeds, and ``GET /api/v1/runs/{id}/stream`` answers
    with what was written, ids contiguous, then ``end`` with the run's status; a reader
    resuming after the last id gets ``end`` alone."""
    from api.models import token_create
    from tests.api.conftest import Api, make_user
    from tests.api.test_stream_api import body_of, sse

    run = durable.start("stream.chat", {"message": "[fault:stream_hold=3] tell me more"})
    _stream_written_in_part(streaming_llm, monkeypatch, run.id)
    run = Run.objects.get(pk=run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(streaming_llm.log) == 1
    written = stream_of(run.id)
    assert written[-1].kind == "token"
    user = make_user("vera", "viewer")
    _, text = token_create(user=user, name="reader", scopes=["runs:read"])
    response = Api(text).get(f"/runs/{run.id}/stream")
    assert response.status_code == 200
    events = sse(body_of(response))
    assert [e.get("id") for e in events] == [str(e.seq) for e in written] + [None]
    assert events[-1]["event"] == "end" and events[-1]["data"] == {"status": "succeeded"}
    last = written[-1].seq
    resumed = sse(
        body_of(Api(text).get(f"/runs/{run.id}/stream", headers={"Last-Event-ID": str(last)}))
    )
    assert [(e.get("id"), e["event"]) for e in resumed] == [(None, "end")]
