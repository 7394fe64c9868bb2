"""An outside tester's trial of the batched hot path after the per-step speed-ups (the
class log context of a try, ``telemetry.attempt`` without a generator, the inlined
``storable_json`` of a dict, ``rows.values`` / ``rows.unsaved`` shortcuts, the batch's
``finished_at`` taken from the checkpoint) and of the length-free casts of the
one-statement inserts. Each case comes from a public bug report of a tool that does the
same job or uses the same mechanism (named in its docstring)."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import threading

import pytest
from django.db import DataError, connection
from django.db.models.signals import post_init

import durable
from durable.models import Run, RunStatus, Step, StepStatus, TraceEvent
from durable.observability import logcontext, telemetry
from durable.postgres import rows
from durable.runtime import replay as replay_module
from durable.testing import drive, make_due
from durable.waits.closing import wake_due
from durable.worker.engine import execute
from tests import otel_support
from tests.durable.runtime.test_batching import _written
from tests.durable.trial_engine import trial_engine_workflows as tw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    tw.reset()
    yield
    tw.reset()


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(logcontext.ContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def capture():
    handler = Capture()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def _bound(records, message: str) -> list[tuple[object, object, object]]:
    return [(r.run_id, r.step_id, r.attempt) for r in records if r.getMessage() == message]


# ------------------------------------------------------------------ the log context


@pytest.mark.parametrize("recording", [False, True], ids=["untraced", "traced"])
def test_log_records_carry_the_step_and_attempt_only_inside_the_step(
    batched, capture, monkeypatch, recording
):
    """taskiq #482 "Sync tasks loose contextvars"
    (https://github.com/taskiq-python/taskiq/issues/482) and structlog #491
    "structlog.contextvars with non-async FastAPI dependencies"
    (https://github.com/hynek/structlog/issues/491): a context bound through a
    ContextVar is lost in (or leaks out of) work run on another thread. Here a batched
    step logs on the workflow's thread, on its timeout thread, in a parallel group's
    pool and on the retry after a failed try; workflow code logs between the steps.
    Each record inside a step carries that step's id and try; none outside does; and
    nothing stays bound in the caller after the execution (both ``telemetry.attempt``
    paths: the class context manager alone and the traced generator)."""
    tw.FAIL_ONCE.add("c")
    before = logcontext.current()
    with otel_support.tracing() if recording else contextlib.nullcontext():
        assert telemetry._recording() is recording
        run = drive(durable.start("trial_engine.logs", {}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == ["a", "b", "c"]
    records = capture.records
    rid = run.id
    assert _bound(records, "inside a try 1") == [(rid, "a", 1)]
    assert _bound(records, "inside b try 1") == [(rid, "b", 1)]
    assert tw.THREADS["b"] != threading.main_thread().name  # the timeout ran it on a thread
    assert _bound(records, "inside c try 1") == [(rid, "c", 1)]
    assert _bound(records, "inside c try 2") == [(rid, "c", 2)]
    # workflow code between steps: the run is bound, no step (the last try's exit reset it)
    for message in ("between a and b", "after c"):
        assert _bound(records, message) == [(rid, "-", "-")], message
    assert logcontext.current() == before == {}
    assert Step.objects.filter(run_id=rid, status=StepStatus.SUCCEEDED).count() == 3


@pytest.mark.parametrize("recording", [False, True], ids=["untraced", "traced"])
def test_log_records_in_a_parallel_group_carry_their_call_and_try(
    batched, capture, monkeypatch, recording
):
    """open-telemetry/opentelemetry-python-contrib #1009 "Context not propagated when
    running in ThreadPoolExecutor"
    (https://github.com/open-telemetry/opentelemetry-python-contrib/issues/1009) and
    structlog #425 (https://github.com/hynek/structlog/issues/425): a context bound on
    one thread is missing in a pool's thread unless it is copied at the right moment.
    docs/observability.md#logs: every line made during a step's try carries its
    ``step_id`` and ``attempt``. A group's two pooled calls (p0 failing its first try)
    log from the pool: each line must name its call and try; the workflow's lines
    around the group name none."""
    tw.FAIL_ONCE.add("p0")
    with otel_support.tracing() if recording else contextlib.nullcontext():
        run = drive(durable.start("trial_engine.group", {}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == ["p0", "p1"]
    rid, records = run.id, capture.records
    for message in ("before the group", "after the group"):
        assert _bound(records, message) == [(rid, "-", "-")], message
    assert logcontext.current() == {}
    got = {m: _bound(records, m) for m in ("inside p0 try 1", "inside p0 try 2", "inside p1 try 1")}
    assert got == {
        "inside p0 try 1": [(rid, "p0", 1)],
        "inside p0 try 2": [(rid, "p0", 2)],
        "inside p1 try 1": [(rid, "p1", 1)],
    }


def test_the_log_context_of_a_try_is_restored_after_an_exception_and_in_threads():
    """structlog #425 "Example of passing context variables to worker threads"
    (https://github.com/hynek/structlog/issues/425): a thread started with
    ``copy_context().run`` sees the bound fields, and what it binds stays in it. With
    the class ``bound``: an exception leaving the block restores the outer fields, a
    nested block overrides and then gives the outer back, and a block that binds in a
    copied context on another thread leaves this thread's fields alone."""
    seen: dict[str, dict] = {}
    with logcontext.bound(run_id="r1"):
        with pytest.raises(ZeroDivisionError), logcontext.bound(step_id="s", attempt=1):
            seen["inside"] = logcontext.current()
            1 / 0  # noqa: B018 - the step's failure
        seen["after"] = logcontext.current()
        with logcontext.bound(step_id="outer", attempt=1):
            with logcontext.bound(step_id="inner", attempt=None):
                seen["nested"] = logcontext.current()
            seen["unnested"] = logcontext.current()

            def body() -> None:
                seen["thread"] = logcontext.current()
                with logcontext.bound(step_id="thread-step", attempt=7):
                    seen["thread-bound"] = logcontext.current()

            context = contextvars.copy_context()
            t = threading.Thread(target=context.run, args=(body,))
            t.start()
            t.join()
            seen["back"] = logcontext.current()
    assert seen["inside"] == {"run_id": "r1", "step_id": "s", "attempt": 1}
    assert seen["after"] == {"run_id": "r1"}
    assert seen["nested"] == {"run_id": "r1", "step_id": "inner", "attempt": 1}
    assert seen["unnested"] == {"run_id": "r1", "step_id": "outer", "attempt": 1}
    assert seen["thread"] == seen["unnested"]
    assert seen["thread-bound"] == {"run_id": "r1", "step_id": "thread-step", "attempt": 7}
    assert seen["back"] == seen["unnested"]
    assert logcontext.current() == {}


# ----------------------------------------------------------- awkward stored values


def _stored(run_id: str, step_id: str) -> Step:
    return Step.objects.get(run_id=run_id, step_id=step_id)


def test_a_batched_step_stores_and_replays_awkward_values_as_a_sync_step(batched):
    """R2R #1264 "Postgres issues with unsupported Unicode escape sequence"
    (https://github.com/SciPhi-AI/R2R/issues/1264) and kestra #10653 (a task output
    with \\u0000 refused by jsonb, https://github.com/kestra-io/kestra/pull/10653): a
    step's output with NUL, a lone surrogate, integers past 64 bits, NaN and
    infinities, an enum member, non-str and NUL keys. The batched step (written by the
    batch flush) stores exactly what the sync step (the checkpoint's own write)
    stores, and the execution that resumes after the timer replays both to the same
    value."""
    run_id = durable.start("trial_engine.values", {}).id
    first = drive(run_id)
    assert first.status == RunStatus.WAITING, first.error
    b, s = _stored(run_id, "batched"), _stored(run_id, "sync")
    assert b.durability == "batched" and s.durability == "sync"
    assert b.output == s.output and b.output
    assert "\x00" not in b.output
    b.output.encode("utf-8")  # no lone surrogate left: storable on any database
    assert b.error is None and s.error is None
    ev = {e.step_id: e.data for e in TraceEvent.objects.filter(run_id=run_id, kind="step_executed")}
    assert ev["batched"].get("batched") is True
    make_due(run_id)
    wake_due()
    run = drive(run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    dump = lambda v: json.dumps(v, default=repr)  # noqa: E731 - NaN != NaN
    # both replayed exactly what the step returned (NUL, surrogates, big ints, NaN...)
    assert dump(out["batched"]) == dump(out["sync"]) == dump(tw.awkward_value())
    assert out["batched"]["big"] == 2**80 and out["batched"][1] == "int key"
    assert run.steps_replayed >= 2  # both came back from their records
    # what the replayed steps' rows hold did not change
    assert _stored(run_id, "batched").output == _stored(run_id, "sync").output == b.output


# ----------------------------------------------------------- times and event order


def test_batched_steps_times_and_events_are_in_order(batched):
    """nextflow #7351 "Fix negative duration error on short run"
    (https://github.com/nextflow-io/nextflow/pull/7351) and dolphinscheduler #9894 "the
    end time of a process Instance is earlier than start time"
    (https://github.com/apache/dolphinscheduler/issues/9894). A batched step's
    finished_at is now the checkpoint's time (not read again at the batch): every step
    finishes at or after it started and before the next one started, its event's
    ``seconds`` is exactly finished_at - started_at, and the events come in position
    order, across two flushes (BATCH_MAX_STEPS 4, six steps)."""
    run = drive(durable.start("trial_engine.chain", {"n": 6}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [0, 10, 20, 30, 40, 50]
    steps = list(Step.objects.filter(run_id=run.id).order_by("position"))
    assert [s.step_id for s in steps] == [f"s{i}" for i in range(6)]
    assert all(s.durability == "batched" for s in steps)
    for s in steps:
        assert s.finished_at is not None and s.started_at <= s.finished_at, s.step_id
    for prev, nxt in zip(steps, steps[1:], strict=False):
        assert prev.finished_at <= nxt.started_at, (prev.step_id, nxt.step_id)
    events = list(TraceEvent.objects.filter(run_id=run.id, kind="step_executed").order_by("id"))
    assert [e.step_id for e in events] == [s.step_id for s in steps]
    for e, s in zip(events, steps, strict=True):
        assert e.data["seconds"] == round((s.finished_at - s.started_at).total_seconds(), 6)
        assert e.data["seconds"] >= 0
    assert Run.objects.get(pk=run.id).steps_executed == 6


# ------------------------------------------------------------------ too-long texts


def test_a_too_long_step_id_is_refused_and_never_stored_cut(batched):
    """LinuxForHealth/FHIR #1638 "VALUES (CAST(foo AS VARCHAR(1024))) silently truncates
    string to 1024 characters" (https://github.com/LinuxForHealth/FHIR/issues/1638). A
    300-character step id of a batched step fails the run on both databases, naming the
    limit, and no row holds a cut id."""
    run = drive(durable.start("trial_engine.long_id", {"n": 300}).id)
    assert run.status == RunStatus.FAILED
    assert "255" in json.dumps(run.error)
    assert not Step.objects.filter(run_id=run.id, step_id__startswith="xxx").exists()


def test_past_the_engine_check_the_batch_flush_never_cuts_a_step_id(batched, monkeypatch):
    """LinuxForHealth/FHIR #1638 again, one level down: with the engine's own length
    check lifted, the batch flush is the only guard. PostgreSQL must refuse the
    256-character id (the old ``varchar(255)`` cast cut it to 255 silently); SQLite,
    whose varchar has no length, stores it whole. Never a cut id."""
    monkeypatch.setattr(replay_module, "STEP_ID_MAX_LENGTH", 10_000)
    run_id = durable.start("trial_engine.long_id", {"n": 256}).id
    if connection.vendor == "postgresql":
        with pytest.raises(DataError, match="too long"):
            execute(run_id, worker_id="w-long")
    else:
        execute(run_id, worker_id="w-long")
    ids = list(Step.objects.filter(run_id=run_id).values_list("step_id", flat=True))
    assert all(len(i) == 256 for i in ids), [len(i) for i in ids]
    if connection.vendor == "postgresql":
        assert ids == []
        assert Run.objects.get(pk=run_id).status != RunStatus.SUCCEEDED
    else:
        assert ids == ["x" * 256]


# --------------------------------------------- instances built without __init__


def test_init_receivers_see_the_batched_rows_and_change_nothing_stored(batched):
    """django/django #11576 "Clarified database state of instances in signals.pre_init
    docs" (ticket #30083, https://github.com/django/django/pull/11576): code relies on
    ``post_init`` being sent for every instance. ``rows.unsaved`` skips
    ``Model.__init__`` when no init receiver exists for the model; with a receiver for
    Step it must send the signal for each batched step's instance, with a receiver for
    another model only it must not, and the rows written are the same in the three
    cases."""
    seen: list[str] = []

    def on_step(sender, instance, **kwargs):
        if instance.pk is None:  # an unsaved instance (a row loaded from the database has one)
            seen.append(instance.step_id)

    def on_run(sender, instance, **kwargs):
        pass

    plain = _written(drive(durable.start("trial_engine.chain", {"n": 5}).id).id)
    post_init.connect(on_run, sender=Run)
    try:
        other = _written(drive(durable.start("trial_engine.chain", {"n": 5}).id).id)
        assert seen == []
        post_init.connect(on_step, sender=Step)
        try:
            withr = _written(drive(durable.start("trial_engine.chain", {"n": 5}).id).id)
        finally:
            post_init.disconnect(on_step, sender=Step)
    finally:
        post_init.disconnect(on_run, sender=Run)
    assert plain == other == withr
    assert set(seen) == {f"s{i}" for i in range(5)}  # each batched step's instance, at least


def test_values_of_an_instance_with_deferred_fields_equal_the_full_ones(batched):
    """django/django #6118 "New implementation for deferred fields"
    (https://github.com/django/django/pull/6118): a deferred field is missing from the
    instance's ``__dict__`` and loaded by its descriptor. ``rows.values`` now reads the
    instance dict first: for a Step loaded with ``defer()`` it must still give the
    values of the fully loaded row (the descriptor loads what is missing)."""
    run = drive(durable.start("trial_engine.chain", {"n": 2}).id)
    full = Step.objects.get(run_id=run.id, step_id="s1")
    part = Step.objects.defer("input", "output", "error", "started_at").get(pk=full.pk)
    assert "output" not in part.__dict__
    assert rows.values(part) == rows.values(full)
    # an unsaved copy built by rows.unsaved gives the same values too
    fields = {f.attname: getattr(full, f.attname) for f in rows.insert_fields(Step)}
    assert rows.values(rows.unsaved(Step, **fields)) == rows.values(full)
    assert rows.values(Step(**fields)) == rows.values(full)


# ------------------------------------------------------------ a real killed process

_CHILD = """
import sys
import django
django.setup()
import tests.durable.trial_engine.trial_engine_workflows  # noqa: F401
from durable.worker.engine import execute
execute(sys.argv[1], worker_id="doomed")
"""


def test_a_batched_run_killed_mid_batch_replays_exactly_and_records_each_step_once(
    batched, tmp_path, monkeypatch
):
    """dbos-inc/dbos-docs #190 (DBOS's guarantee, https://github.com/dbos-inc/dbos-docs/pull/190:
    "steps are tried at least once but are never re-executed after they successfully
    complete") and workflow-core #560 "How is Workflow restart handled?"
    (https://github.com/danielgerlag/workflow-core/issues/560: an unpersisted step runs
    again after a crash). A process executing seven batched steps (BATCH_MAX_STEPS 3)
    is SIGKILLed inside s5: s0..s2 are committed (one flush), s3 and s4 were pending.
    The next execution runs exactly s3, s4, s5 again, s6 once, and every step ends with
    one row and one ``step_executed`` event, in position order, with
    finished_at >= started_at."""
    import os
    import signal
    import subprocess
    import sys

    from tests.durable.engine_workflows import expire_lease
    from tests.harness import database_url

    calls, flag = tmp_path / "calls.txt", tmp_path / "kill"
    flag.write_text("1")
    monkeypatch.setenv("TRIAL_CALL_LOG", str(calls))
    run_id = durable.start("trial_engine.killable", {"n": 7}).id
    repo = str(settings_repo())
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONPATH": repo,
        "PYTHONDONTWRITEBYTECODE": "1",
        "DATABASE_URL": database_url(),
        "DURABLE_BATCH_MAX_STEPS": "3",
        "DURABLE_BATCH_MAX_DELAY_MS": "600000",
        "DURABLE_DISPATCH": "manual",
        "DURABLE_AUTODISCOVER": "false",
        "TRIAL_KILL_AT": "s5",
        "TRIAL_KILL_FILE": str(flag),
    }
    env.pop("PYTEST_CURRENT_TEST", None)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, run_id],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert not flag.exists()
    assert calls.read_text().split() == ["s0", "s1", "s2", "s3", "s4", "s5"]
    committed = list(
        Step.objects.filter(run_id=run_id).order_by("position").values_list("step_id", flat=True)
    )
    assert committed == ["s0", "s1", "s2"]  # the flush at three; s3, s4 were pending
    assert Run.objects.get(pk=run_id).status == RunStatus.RUNNING  # held by the dead process

    expire_lease(run_id)
    run = drive(run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [i * 10 for i in range(7)]
    ran = calls.read_text().split()
    assert ran == ["s0", "s1", "s2", "s3", "s4", "s5", "s3", "s4", "s5", "s6"]
    steps = list(Step.objects.filter(run_id=run_id).order_by("position"))
    assert [(s.position, s.step_id, s.status) for s in steps] == [
        (i, f"s{i}", StepStatus.SUCCEEDED) for i in range(7)
    ]
    assert all(s.started_at <= s.finished_at for s in steps)
    events = list(
        TraceEvent.objects.filter(run_id=run_id, kind="step_executed")
        .order_by("id")
        .values_list("step_id", flat=True)
    )
    assert events == [f"s{i}" for i in range(7)]  # once each, in order
    assert Run.objects.get(pk=run_id).steps_executed == 7


def settings_repo():
    from pathlib import Path

    import tests

    return Path(tests.__file__).resolve().parent.parent
