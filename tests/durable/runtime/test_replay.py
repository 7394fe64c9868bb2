"""Replay: completed steps are memoized, step ids are stable, changed code is detected,
versions are honoured and ``durable.start`` is idempotent on the run id."""

from __future__ import annotations

import pytest

import durable
from durable.models import Run, RunStatus, Step, StepStatus, TraceEvent
from durable.testing import drive
from durable.worker.engine import execute
from tests.durable import engine_workflows as ew

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    ew.reset()
    yield
    ew.reset()


def _fresh(run_id: str) -> Run:
    return Run.objects.get(pk=run_id)


def _step_ids(run_id: str) -> list[str]:
    return list(
        Step.objects.filter(run_id=run_id).order_by("position").values_list("step_id", flat=True)
    )


# --- memoization ----------------------------------------------------------------------


def test_resume_does_not_rerun_completed_steps():
    ew.FAILS["three"] = [durable.TransientError("upstream busy")]
    run = durable.start("eng.three_steps", {"policy": "slow"})

    run = drive(run.id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING
    assert dict(ew.CALLS) == {"one": 1, "two": 1, "three": 1}

    ew.make_due(run.id)
    run = drive(run.id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [1, 2, 3]
    assert dict(ew.CALLS) == {"one": 1, "two": 1, "three": 2}
    # the second execution saw the recorded results of steps one and two
    assert ew.SEEN == [("three_steps", [1, 2, 3])]
    assert run.steps_replayed == 2
    replays = dict(Step.objects.filter(run=run).values_list("step_id", "replay_count"))
    assert replays == {"one": 1, "two": 1, "three": 0}


def test_resume_after_crash_between_steps_runs_only_the_rest():
    ew.FLAGS["crash:after_two"] = True
    run = durable.start("eng.three_steps", {"policy": "fast"})
    with pytest.raises(ew.Crash):
        drive(run.id)
    assert _fresh(run.id).status == RunStatus.RUNNING  # the dead worker still holds it
    assert dict(ew.CALLS) == {"one": 1, "two": 1}

    ew.expire_lease(run.id)
    run = drive(run.id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert dict(ew.CALLS) == {"one": 1, "two": 1, "three": 1}
    assert TraceEvent.objects.filter(run=run, kind="recovered").count() == 1


def test_crash_between_steps_does_not_use_up_the_next_steps_attempts():
    ew.FLAGS["crash:after_two"] = True
    run = durable.start("eng.three_steps", {"policy": "once"})
    with pytest.raises(ew.Crash):
        drive(run.id)
    ew.expire_lease(run.id)
    run = drive(run.id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert ew.CALLS["three"] == 1


def test_executing_a_finished_run_again_reruns_nothing():
    run = drive(durable.start("eng.three_steps", {"policy": "fast"}).id)
    assert run.status == RunStatus.SUCCEEDED
    calls = dict(ew.CALLS)

    assert execute(run.id) is None  # not claimable
    assert execute(run.id) is None
    assert dict(ew.CALLS) == calls
    assert _fresh(run.id).claims == run.claims


# --- step ids -------------------------------------------------------------------------


def test_step_ids_explicit_and_derived_with_occurrence_suffixes():
    run = drive(durable.start("eng.ids", None).id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {
        "fetched": [0, 1, 2],
        "helped": ["helped", "helped"],
        "normal": "normal",
    }
    assert _step_ids(run.id) == [
        "fetch",
        "fetch#2",
        "fetch#3",
        "derived_helper",
        "derived_helper#2",
        "Helpers.normalize",  # the qualified name, not just __name__
    ]
    positions = list(
        Step.objects.filter(run=run).order_by("position").values_list("position", flat=True)
    )
    assert positions == [0, 1, 2, 3, 4, 5]


def test_step_ids_are_the_same_on_replay():
    ew.FAILS["three"] = [durable.TransientError("later")]
    run = durable.start("eng.three_steps", {"policy": "slow"})
    drive(run.id, wait_for_retries=False)
    before = _step_ids(run.id)
    ew.make_due(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED
    assert before == _step_ids(run.id) == ["one", "two", "three"]


# --- non-determinism ------------------------------------------------------------------


def test_changed_code_path_fails_the_run_naming_both_step_ids():
    ew.FAILS["three"] = [durable.TransientError("later")]
    run = durable.start("eng.branching", None)
    run = drive(run.id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING

    ew.FLAGS["alt"] = True  # "deploy" different workflow code under the running run
    ew.make_due(run.id)
    run = drive(run.id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "NonDeterminismError"
    assert run.error["type"] == "NonDeterminismError"
    message = run.error["message"]
    assert "'two'" in message and "'two_alt'" in message
    assert "position 1" in message
    # nothing ran under the changed code: neither the new step nor the retried one
    assert ew.CALLS["two_alt"] == 0
    assert ew.CALLS["three"] == 1
    assert ew.CALLS["four"] == 0
    assert TraceEvent.objects.filter(run=run, kind="nondeterminism").count() == 1
    assert _step_ids(run.id) == ["one", "two", "three"]


def test_reordered_steps_are_detected():
    ew.FAILS["c"] = [durable.TransientError("later")]
    run = durable.start("eng.reordered", None)
    drive(run.id, wait_for_retries=False)
    ew.FLAGS["swap"] = True
    ew.make_due(run.id)
    run = drive(run.id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "NonDeterminismError"
    assert "'a'" in run.error["message"] and "'b'" in run.error["message"]
    assert dict(ew.CALLS) == {"a": 1, "b": 1, "c": 1}


def test_nondeterminism_cannot_be_swallowed_by_workflow_code():
    """The run is FAILED before the error reaches user code, which cannot undo it."""
    ew.FAILS["three"] = [durable.TransientError("later")]
    run = durable.start("eng.branching", None)
    drive(run.id, wait_for_retries=False)
    ew.FLAGS["alt"] = True
    ew.make_due(run.id)
    drive(run.id)
    # a later execution attempt does not resurrect it
    assert execute(run.id) is None
    assert _fresh(run.id).status == RunStatus.FAILED


# --- versions -------------------------------------------------------------------------


def test_run_of_unregistered_version_is_released_pending():
    run = durable.start("eng.three_steps", {"policy": "fast"})
    Run.objects.filter(pk=run.id).update(workflow_version="99")

    status = execute(run.id, worker_id="old-worker")

    assert status == RunStatus.PENDING
    run = _fresh(run.id)
    assert run.status == RunStatus.PENDING
    assert run.lease_token == "" and run.lease_expires_at is None
    event = TraceEvent.objects.get(run=run, kind="version_unavailable")
    with pytest.raises(TimeoutError, match="does not have eng.three_steps version 99"):
        durable.result(run.id, timeout=0.05)  # the caller learns why nothing happens
    assert "99" in event.message and event.actor == "old-worker"
    assert not ew.CALLS
    assert not Step.objects.filter(run=run).exists()


def test_run_keeps_the_version_it_started_with():
    latest = drive(durable.start("eng.versioned", None).id)
    pinned = drive(durable.start("eng.versioned", None, version="1").id)

    assert (latest.workflow_version, latest.output_value()) == ("2", "v2")
    assert (pinned.workflow_version, pinned.output_value()) == ("1", "v1")
    with pytest.raises(durable.WorkflowNotFound):
        durable.start("eng.versioned", None, version="7")


# --- idempotency keys -----------------------------------------------------------------


@pytest.mark.parametrize("policy", ["fast", "slow"])
def test_idempotency_key_is_run_and_step_on_every_attempt(policy):
    ew.FAILS["charge"] = [durable.TransientError("503"), durable.TransientError("503")]
    run = durable.start("eng.keyed", {"policy": policy})
    run = drive(run.id, wait_for_retries=False)
    executions = 1
    while run.status == RunStatus.RETRYING:  # released retries: a new execution each
        ew.make_due(run.id)
        execute(run.id)
        run = _fresh(run.id)
        executions += 1
        assert executions <= 3

    assert executions == (3 if policy == "slow" else 1)
    assert run.status == RunStatus.SUCCEEDED, run.error
    charge_keys = [key for label, key in ew.KEYS if label == "charge"]
    assert charge_keys == [f"{run.id}:charge"] * 3
    fetch_keys = [key for label, key in ew.KEYS if label == "fetch"]
    assert fetch_keys == [f"{run.id}:fetch", f"{run.id}:fetch#2"]
    # **kwargs receives it too; a function that does not accept it is called without it
    assert [key for label, key in ew.KEYS if label == "kw"] == [f"{run.id}:kw"]
    assert run.output_value()["kw"] == ["idempotency_key"]
    assert run.output_value()["plain"] == "plain"
    assert ew.CALLS["plain"] == 1


# --- durable.start ----------------------------------------------------------------------


def test_start_is_idempotent_on_run_id():
    first = durable.start("eng.three_steps", {"policy": "fast", "n": 1}, run_id="order-42")
    again = durable.start("eng.three_steps", {"n": 1, "policy": "fast"}, run_id="order-42")

    assert first.id == again.id == "order-42"
    assert Run.objects.count() == 1
    assert TraceEvent.objects.filter(run_id="order-42", kind="created").count() == 1

    drive(first.id)
    finished = durable.start("eng.three_steps", {"policy": "fast", "n": 1}, run_id="order-42")
    assert finished.status == RunStatus.SUCCEEDED  # the same run, not a new one
    assert Run.objects.count() == 1
    assert ew.CALLS["one"] == 1


def test_start_with_existing_run_id_and_other_input_conflicts():
    durable.start("eng.three_steps", {"policy": "fast"}, run_id="order-43")
    with pytest.raises(durable.RunInputConflict) as info:
        durable.start("eng.three_steps", {"policy": "slow"}, run_id="order-43")
    assert info.value.run_id == "order-43"
    with pytest.raises(durable.RunInputConflict):
        durable.start("eng.ids", {"policy": "fast"}, run_id="order-43")
    assert Run.objects.count() == 1
    assert _fresh("order-43").input_value() == {"policy": "fast"}


@pytest.mark.parametrize(
    "bad", ["", "has space", "-leading", ".leading", "a" * 129, "a/b", "ünï", "abc\n", "tab\there"]
)
def test_start_rejects_invalid_run_ids(bad):
    with pytest.raises(ValueError):
        durable.start("eng.three_steps", None, run_id=bad)
    assert Run.objects.count() == 0


@pytest.mark.parametrize("good", ["a", "A.b_c-1", "0" * 128])
def test_start_accepts_valid_run_ids(good):
    assert durable.start("eng.three_steps", None, run_id=good).id == good


def test_start_unknown_workflow_raises_workflow_not_found():
    with pytest.raises(durable.WorkflowNotFound) as info:
        durable.start("eng.no_such_workflow", {"x": 1})
    assert "eng.no_such_workflow" in str(info.value)
    assert Run.objects.count() == 0


def test_start_with_unstorable_input_raises_payload_error_and_writes_nothing():
    with pytest.raises(durable.PayloadError) as info:
        durable.start("eng.three_steps", {"policy": "fast", "conn": object()})
    assert "run input" in str(info.value)
    assert "conn" in str(info.value)
    assert Run.objects.count() == 0
    assert TraceEvent.objects.count() == 0


def test_replayed_steps_are_loaded_not_requeried():
    """One query loads a run's recorded steps; replay does not query per step."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ew.FAILS["three"] = [durable.TransientError("later")]
    run = durable.start("eng.three_steps", {"policy": "slow"})
    drive(run.id, wait_for_retries=False)
    ew.make_due(run.id)
    with CaptureQueriesContext(connection) as queries:
        execute(run.id)
    step_selects = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith("SELECT")
        and '"durable_step"' in q["sql"].split("WHERE")[0]
    ]
    assert len(step_selects) == 1, step_selects
    assert Step.objects.get(run=run, step_id="three").status == StepStatus.SUCCEEDED


def test_code_that_returns_before_recorded_steps_is_nondeterministic():
    ew.FAILS["three"] = [durable.TransientError("later")]
    run = drive(durable.start("eng.shortened", None).id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING
    ew.FLAGS["short"] = True
    ew.make_due(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "NonDeterminismError"
    assert "'two'" in run.error["message"] and "returned" in run.error["message"]
    assert run.output is None


def test_a_call_replaced_is_the_dataclass_replace_of_it():
    # StepCall.replaced skips dataclasses.replace's field scan: it must give the same
    # call for every field, and refuse a name that is no field as replace does
    import dataclasses

    from durable.runtime.replay import StepCall

    call = StepCall(step_id="s", position=3, recorded=None)
    changes = {
        f.name: f"changed-{f.name}" if f.type in ("str", "str | None") else 7
        for f in dataclasses.fields(StepCall)
    }
    for name, value in changes.items():
        assert call.replaced(**{name: value}) == dataclasses.replace(call, **{name: value})
    assert call.replaced(**changes) == dataclasses.replace(call, **changes)
    assert call.replaced() == call and call.replaced() is not call
    with pytest.raises(TypeError):
        call.replaced(no_such_field=1)
