"""A run's stream (docs/streaming.md): a streamed ``ctx.llm`` call is recorded once as
the reply ``ctx.llm`` returns, its events are written as the chunks arrive, a replay
streams nothing and asks the model nothing, a reader that comes late gets the history
and then the live part, and retention deletes the stream with its run. The model is
the scripted one (examples/fake_llm.py) served from a thread (``streaming_llm``)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

import durable
from durable.models import Run, RunStatus, Step, StreamEvent
from durable.services import retention
from durable.testing import drive
from tests import stream_workflows  # noqa: F401  (registers the workflows)
from tests.harness import wait_until


def drive_here(run_id: str) -> None:
    """``drive`` on a thread of the test, which closes its connection when done."""
    try:
        drive(run_id)
    finally:
        connections.close_all()


# transactional: the stream's writer commits from a thread of its own, as in a worker
pytestmark = pytest.mark.django_db(transaction=True)


def stream_of(run_id: str) -> list[StreamEvent]:
    return list(StreamEvent.objects.filter(run_id=run_id).order_by("seq"))


def text_of(events) -> str:
    return "".join(e.data["delta"] for e in events if e.kind == "token")


def test_a_streamed_call_is_recorded_once_as_the_reply_and_its_tokens_are_streamed(
    streaming_llm,
):
    message = " ".join(f"word{i}" for i in range(60))
    run = drive(durable.start("stream.chat", {"message": message}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    (step,) = Step.objects.filter(run=run)
    reply = run.output_value()
    assert step.kind == "llm" and step.output_value() == reply
    assert reply["content"].endswith(message) and reply["finish_reason"] == "stop"
    assert reply["usage"]["total_tokens"] > 0 and run.tokens_used == reply["usage"]["total_tokens"]
    assert len(streaming_llm.log) == 1
    events = stream_of(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].kind == "step_started" and events[-1].kind == "step_ended"
    assert {e.step_id for e in events} == {"llm"}
    assert text_of(events) == reply["content"]
    assert events[-1].data["usage"] == reply["usage"]
    # the words arrive faster than a flush: adjacent deltas share rows and commits
    assert len([e for e in events if e.kind == "token"]) < 60


def test_tool_calls_are_streamed_as_they_start_and_end(streaming_llm):
    run = drive(
        durable.start(
            "stream.chat",
            {"script": "support", "message": "Customer: Ann <ann@example.com>\nMessage: hi"},
        ).id
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    calls = run.output_value()["tool_calls"]
    assert [c["name"] for c in calls] == ["kb_search", "tickets_create", "email_send"]
    events = stream_of(run.id)
    started = [e.data["name"] for e in events if e.kind == "tool_call_started"]
    ended = [e.data for e in events if e.kind == "tool_call_ended"]
    assert started == [c["name"] for c in calls]
    assert [(d["id"], d["name"]) for d in ended] == [(c["id"], c["name"]) for c in calls]


def test_a_replay_returns_the_record_and_neither_asks_the_model_nor_streams(streaming_llm):
    run = durable.start("stream.twice", {"message": "first question", "second": "second one"})
    assert drive(run.id).status == RunStatus.WAITING
    before = [(e.seq, e.kind, e.data) for e in stream_of(run.id)]
    assert len(streaming_llm.log) == 1 and before
    durable.signal(run.id, "go")
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(streaming_llm.log) == 2  # only the second call was asked
    events = stream_of(run.id)
    assert [(e.seq, e.kind, e.data) for e in events[: len(before)]] == before
    assert {e.step_id for e in events[len(before) :]} == {"llm#2"}
    assert "interrupted" not in {e.kind for e in events}
    assert text_of(events[len(before) :]) == run.output_value()[1]


def test_a_late_reader_gets_what_was_streamed_then_the_live_part(streaming_llm):
    """The model holds its stream after three words; a reader that starts then gets
    them at once, then the rest as it is streamed, and stops when the run ends."""
    run = durable.start("stream.chat", {"message": "[fault:stream_hold=3] tell me more"})
    driver = threading.Thread(target=drive_here, args=(run.id,))
    driver.start()
    try:
        wait_until(
            lambda: text_of(stream_of(run.id)) == "(scripted model, no",
            10,
            what="the first three words to be streamed",
            sweep=False,
            interval=0.02,
        )
        reader = durable.stream(run.id, poll=0.02)
        history = [next(reader) for _ in range(len(stream_of(run.id)))]
        assert text_of_dicts(history) == "(scripted model, no"
        assert Run.objects.get(pk=run.id).status == RunStatus.RUNNING  # still streaming
        streaming_llm.release.set()
        live = list(reader)
    finally:
        streaming_llm.release.set()
        driver.join(30)
    reply = Run.objects.get(pk=run.id).output_value()
    seen = history + live
    assert live and [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    assert text_of_dicts(seen) == reply["content"]
    assert seen[-1]["kind"] == "step_ended"
    assert set(seen[0]) == {"seq", "step_id", "kind", "data", "created_at"}
    # a reader that resumes after a seq gets only what came after it
    assert [e["seq"] for e in durable.stream(run.id, after=3)] == list(range(4, len(seen) + 1))


def text_of_dicts(events) -> str:
    return "".join(e["data"]["delta"] for e in events if e["kind"] == "token")


def test_a_step_that_streamed_before_without_a_record_is_said_interrupted_first(streaming_llm):
    """What a lost worker left: the step's start and a token, no record. The next
    execution says ``interrupted`` before the call is asked again."""
    run = durable.start("stream.chat", {"message": "hello"})
    for seq, kind, data in [
        (1, "step_started", {"model": "scripted"}),
        (2, "token", {"delta": "(scr"}),
    ]:
        StreamEvent.objects.create(run_id=run.id, seq=seq, step_id="llm", kind=kind, data=data)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    kinds = [e.kind for e in stream_of(run.id)]
    assert kinds[:4] == ["step_started", "token", "interrupted", "step_started"]
    interrupted = stream_of(run.id)[2]
    assert interrupted.data == {
        "reason": "worker_lost",
        "message": "the worker was lost; the call is asked again",
    }
    assert text_of(stream_of(run.id)[3:]) == run.output_value()["content"]


def test_an_unknown_run_has_no_stream():
    with pytest.raises(durable.RunNotFound):
        durable.stream("no-such-run")


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"after": -1}, "after"),
        ({"after": "3"}, "after"),
        ({"poll": 0}, "poll"),
        ({"poll": float("nan")}, "poll"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": "5"}, "timeout"),
    ],
)
def test_bad_reader_arguments_are_refused_by_name(kwargs, named):
    run = durable.start("stream.chat", {"message": "hi"})
    with pytest.raises(ValueError, match=rf"durable\.stream\({named}=\.\.\.\)"):
        durable.stream(run.id, **kwargs)


def test_a_reader_with_a_timeout_stops_on_a_run_still_streaming_and_can_go_on():
    from durable.queries.streams import follow

    run = durable.start("stream.chat", {"message": "hi"})  # pending: followed
    StreamEvent.objects.create(
        run_id=run.id, seq=1, step_id="llm", kind="step_started", data={"model": "m"}
    )
    now = [0.0]

    def sleep(seconds):  # the clock moves only when the reader waits
        now[0] += seconds

    reader = follow(run.id, poll=1.0, timeout=2.5, sleep=sleep, clock=lambda: now[0])
    assert next(reader)["seq"] == 1
    with pytest.raises(TimeoutError, match=r"still pending after 2\.5 s.*after=1"):
        next(reader)
    assert now[0] == 3.0  # it read every second until the bound, then gave up
    Run.objects.filter(pk=run.id).update(status=RunStatus.CANCELLED)
    assert list(durable.stream(run.id, after=1, timeout=0)) == []  # ended: no error


def test_retention_deletes_the_stream_with_its_run(streaming_llm):
    run = drive(durable.start("stream.chat", {"message": "hello there"}).id)
    streamed = StreamEvent.objects.filter(run_id=run.id).count()
    assert streamed >= 3
    counts = retention.prune_run(run.id)
    assert counts["streamevent"] == streamed
    assert not StreamEvent.objects.filter(run_id=run.id).exists()
    assert not Run.objects.filter(pk=run.id).exists()


def test_a_failed_try_ends_its_step_with_the_error_and_the_retry_says_interrupted(
    streaming_llm,
):
    """The model answers the first try with a 429: the stream says the try ended with
    an error, then ``interrupted`` (failed), then the retry's reply."""
    run = durable.start("stream.chat", {"message": "[fault:429] [fault:retry_after=0.1] hi"})
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    events = stream_of(run.id)
    assert [e.kind for e in events[:4]] == [
        "step_started",
        "step_ended",
        "interrupted",
        "step_started",
    ]
    assert "429" in events[1].data["error"]
    assert events[2].data["reason"] == "failed"
    assert text_of(events[4:]) == run.output_value()["content"]
    assert Step.objects.get(run=run).attempts == 2


def _writes_failing(monkeypatch, times: int) -> dict[str, int]:
    """The stream's first ``times`` writes fail as on a database restart (the writer's
    thread has a connection of its own, so the write itself is replaced)."""
    from django.db import OperationalError

    from durable.runtime import stream_writer

    real = stream_writer.StreamWriter._write
    state = {"failed": 0}

    def write(self, batch):
        if state["failed"] < times:
            state["failed"] += 1
            raise OperationalError("terminating connection due to administrator command (inj)")
        return real(self, batch)

    monkeypatch.setattr(stream_writer.StreamWriter, "_write", write)
    monkeypatch.setattr(stream_writer, "RETRY_DELAYS", (0.0, 0.0, 0.0, 0.0))
    return state


def test_a_database_fault_while_streaming_is_written_again_and_the_model_asked_once(
    streaming_llm, monkeypatch
):
    """A restart while the tokens arrive: the events are written on a new connection,
    in order, and the reply is recorded; the model is not asked again for it (the
    stream is a view, the step's record the one result)."""
    state = _writes_failing(monkeypatch, 2)
    message = " ".join(f"word{i}" for i in range(40))
    run = drive(durable.start("stream.chat", {"message": message}).id)
    assert state["failed"] == 2
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(streaming_llm.log) == 1
    assert not run.events.filter(kind="db_fault").exists()
    events = stream_of(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].kind == "step_started" and events[-1].kind == "step_ended"
    assert text_of(events) == run.output_value()["content"]


def test_a_stream_the_database_never_takes_is_dropped_and_the_reply_still_recorded(
    streaming_llm, monkeypatch
):
    state = _writes_failing(monkeypatch, 100)
    run = drive(durable.start("stream.chat", {"message": "hello there"}).id)
    assert state["failed"] >= 5  # the first try and its four retries, then given up
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(streaming_llm.log) == 1
    assert run.output_value()["content"].endswith("hello there")
    assert stream_of(run.id) == []


def test_a_faults_backoff_holds_however_many_events_wait(monkeypatch):
    """Events keep arriving while the database is away: the writer waits out each
    retry's delay instead of trying again at every full batch (which would spend its
    retries in a moment and drop the stream)."""
    import time

    from django.db import OperationalError

    from durable.runtime import stream_writer

    run = durable.start("stream.chat", {"message": "hi"})  # not driven: a run to write to
    tries: list[float] = []

    def write(self, batch):
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise OperationalError("the database system is shutting down (injected)")
        return real(self, batch)

    real = stream_writer.StreamWriter._write
    monkeypatch.setattr(stream_writer.StreamWriter, "_write", write)
    monkeypatch.setattr(stream_writer, "RETRY_DELAYS", (0.3, 0.3, 0.3, 0.3))
    writer = stream_writer.StreamWriter(run.id, "llm", max_pending=2)
    for i in range(50):
        writer.emit("tool_call_started", {"name": f"t{i}"})
        if i == 2:  # the first write failed or is failing: the rest arrive meanwhile
            wait_until(lambda: tries, 10, what="the first write")
    writer.close()
    assert len(tries) >= 2 and tries[1] - tries[0] >= 0.3, tries
    assert StreamEvent.objects.filter(run_id=run.id).count() == 50
