"""Parallel groups (``ctx.parallel``) and a model turn's tool calls (``ctx.run_tool_calls``):
results in list order, deterministic step ids, replay running only unrecorded calls,
failure semantics, the concurrency bound, writes in order through the ledger, S20."""

from __future__ import annotations

import json
import threading

import pytest
from django.contrib.auth.models import Permission, User

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.models import Operation, Run, RunStatus, Step, StepStatus, TraceEvent
from durable.testing import drive, make_due
from tests.durable.runtime import parallel_workflows as pw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    pw.reset()
    yield
    pw.reset()


def _rows(run_id: str) -> list[tuple[str, str]]:
    return list(
        Step.objects.filter(run_id=run_id).order_by("position").values_list("step_id", "status")
    )


def _run(workflow: str, data: dict) -> Run:
    return drive(durable.start(workflow, data).id)


# --- results and ids -------------------------------------------------------------------


def test_results_come_back_in_list_order_whatever_finishes_first():
    labels = ["a", "b", "c", "d"]
    seconds = {"a": 0.2, "b": 0.0, "c": 0.1, "d": 0.05}
    run = _run("par.steps", {"labels": labels, "seconds": seconds})
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [["a-done", "b-done", "c-done", "d-done"]]
    assert sorted(pw.ORDER) == labels  # each body ran once
    assert [sid for sid, _ in _rows(run.id)] == [
        "parallel[0]",
        "parallel[1]",
        "parallel[2]",
        "parallel[3]",
    ]
    # the bodies ran on the pool, not on the workflow's thread
    assert all(name.startswith("durable-group") for name in pw.THREADS.values())


def test_step_ids_name_the_group_by_its_occurrence_and_honour_explicit_ids():
    run = _run("par.steps", {"labels": ["a", "b"], "ids": {"b": "fetch"}, "groups": 2})
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [sid for sid, _ in _rows(run.id)] == [
        "parallel[0]",
        "fetch",
        "parallel#2[0]",
        "fetch#2",
    ]


def test_max_concurrency_bounds_the_bodies_running_at_once():
    labels = [f"c{i}" for i in range(6)]
    seconds = dict.fromkeys(labels, 0.15)
    run = _run("par.steps", {"labels": labels, "seconds": seconds, "max": 2})
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert pw.PEAK[0] == 2

    pw.reset()
    run = _run("par.steps", {"labels": labels, "seconds": seconds})
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert pw.PEAK[0] > 2  # unbounded: one thread per call


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_max_concurrency_fails_the_run_with_a_clear_error(bad):
    run = _run("par.bad", {"max": bad})
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "DurableConfigurationError"
    assert "max_concurrency must be None or an int >= 1" in run.error["message"]
    assert pw.CALLS == {}


def test_a_list_item_that_is_not_a_call_fails_the_run_naming_it():
    run = _run("par.bad", {"calls": ["not a call"]})
    assert run.status == RunStatus.FAILED
    assert "calls[0] is a str" in run.error["message"]


# --- replay ----------------------------------------------------------------------------


def test_a_replay_returns_recorded_calls_and_runs_only_unrecorded_ones():
    """Call c fails and its retry is far off: the run is released with a and b recorded;
    d ran but was not recorded (its turn comes after c). Resumed: a and b are replayed,
    c and d run again, exactly once more. c fails only once d has begun: otherwise a
    loaded machine may let the release cancel d before a pool thread takes it."""
    pw.FAILS["c"] = [durable.TransientError("busy")]
    pw.FLAGS["await"] = {"c": ["d"]}
    data = {"labels": ["a", "b", "c", "d"], "policy": "slow"}
    run = drive(durable.start("par.steps", data).id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING
    assert _rows(run.id) == [
        ("parallel[0]", StepStatus.SUCCEEDED),
        ("parallel[1]", StepStatus.SUCCEEDED),
        ("parallel[2]", StepStatus.RETRYING),
    ]
    make_due(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert dict(pw.CALLS) == {"a": 1, "b": 1, "c": 2, "d": 2}
    assert [s for _, s in _rows(run.id)] == [StepStatus.SUCCEEDED] * 4
    assert run.steps_replayed == 2


def test_a_group_whose_length_changed_under_a_run_is_non_determinism():
    data = {"labels": ["a", "b", "c"], "after": True, "policy": "slow"}
    pw.FAILS["after"] = [durable.TransientError("busy")]
    run = drive(durable.start("par.steps", data).id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING
    pw.FLAGS["labels"] = ["a", "b"]  # the code changed: one call fewer
    make_due(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "NonDeterminismError"
    assert TraceEvent.objects.filter(run=run, kind="nondeterminism").exists()


# --- failures --------------------------------------------------------------------------


def test_the_first_permanent_failure_in_list_order_is_raised_after_the_others_settle():
    pw.FAILS["b"] = [durable.PermanentError("b is broken")]
    pw.FAILS["d"] = [durable.PermanentError("d is broken")]
    run = _run("par.steps", {"labels": ["a", "b", "c", "d", "e"], "seconds": {"e": 0.2}})
    assert run.status == RunStatus.FAILED
    assert run.error["step_id"] == "parallel[1]"
    assert "b is broken" in run.error["message"]
    assert dict(pw.CALLS) == {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}
    rows = dict(_rows(run.id))
    assert rows["parallel[0]"] == rows["parallel[2]"] == rows["parallel[4]"] == "succeeded"
    assert rows["parallel[1]"] == StepStatus.FAILED
    assert "parallel[3]" not in rows  # unrecorded: a resume runs it again


def test_each_call_retries_under_its_own_policy_on_the_pool():
    pw.FAILS["b"] = [durable.TransientError("busy"), durable.TransientError("busy")]
    run = _run("par.steps", {"labels": ["a", "b"]})
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert dict(pw.CALLS) == {"a": 1, "b": 3}
    assert Step.objects.get(run=run, step_id="parallel[1]").attempts == 3
    assert pw.THREADS["b"].startswith("durable-group")


def test_a_model_recoverable_error_is_a_result():
    pw.FAILS["b"] = [durable.ModelRecoverableError("say it differently")]
    run = _run("par.steps", {"labels": ["a", "b"]})
    assert run.status == RunStatus.SUCCEEDED, run.error
    first, second = run.output_value()[0]
    assert first == "a-done"
    assert second["message"] == "say it differently"


def test_a_lost_lease_stops_the_group_while_it_waits_for_a_body(monkeypatch):
    """The slow first call is still running when the lease is lost: the workflow thread
    stops waiting (LeaseLost) and records nothing, the slow body's result is dropped."""
    from durable.worker import heartbeat
    from durable.worker.engine import execute

    started = heartbeat.Heartbeat.start

    def keep(self):
        pw.FLAGS.setdefault("heartbeats", []).append(self)
        return started(self)

    monkeypatch.setattr(heartbeat.Heartbeat, "start", keep)
    run = durable.start("par.interrupted", {"how": "lease"})
    execute(run.id, worker_id="test-worker")
    assert pw.CALLS["mid"] == 1
    assert not Step.objects.filter(run_id=run.id).exists()
    assert Run.objects.get(pk=run.id).status != RunStatus.SUCCEEDED


def test_a_cancel_during_a_group_is_seen_at_the_next_checkpoint():
    run = _run("par.interrupted", {"how": "cancel"})
    assert run.status == RunStatus.CANCELLED
    # cancelled while the slow first call ran: its checkpoint (the next one) records it
    # and sees the cancel; nothing after it is recorded or started
    assert [sid for sid, _ in _rows(run.id)] == ["parallel[0]"]
    assert pw.CALLS["mid"] == 1


# --- writes ----------------------------------------------------------------------------


def test_writes_run_in_list_order_on_the_workflow_thread_through_the_ledger():
    calls = [["write", "w1"], ["read", "r1"], ["step", "s1"], ["write", "w2"], ["read", "r2"]]
    run = _run("par.mixed", {"calls": calls})
    assert run.status == RunStatus.SUCCEEDED, run.error
    result = run.output_value()
    assert result[0] == {"label": "w1", "key": f"{run.id}:parallel[0]"}
    assert result[3] == {"label": "w2", "key": f"{run.id}:parallel[3]"}
    assert result[1] == "r1-done" and result[2] == "s1-done"
    writes = [label for label in pw.ORDER if label.startswith("w")]
    assert writes == ["w1", "w2"]
    main = threading.main_thread().name
    assert pw.THREADS["w1"] == pw.THREADS["w2"] == main
    assert pw.THREADS["r1"].startswith("durable-group")
    ops = Operation.objects.filter(run_id=run.id).order_by("id")
    assert [o.idempotency_key for o in ops] == [f"{run.id}:parallel[0]", f"{run.id}:parallel[3]"]
    assert all(o.status == "succeeded" for o in ops)


def test_a_batched_call_in_a_group_is_committed_with_the_flush():
    calls = [["step", "s1"], ["step", "s2"], ["write", "w1"], ["step", "s3"]]
    run = _run("par.mixed", {"calls": calls, "durability": "batched"})
    assert run.status == RunStatus.SUCCEEDED, run.error
    rows = Step.objects.filter(run=run).order_by("position")
    assert [(s.step_id, s.durability) for s in rows] == [
        ("parallel[0]", "batched"),
        ("parallel[1]", "batched"),
        ("parallel[2]", "sync"),
        ("parallel[3]", "batched"),
    ]
    assert run.cursor_position == 4 and run.steps_executed == 4


# --- a model turn ----------------------------------------------------------------------


def _openai(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _contents(messages: list[dict]) -> dict[str, dict]:
    assert all(m["role"] == "tool" for m in messages)
    return {m["tool_call_id"]: json.loads(m["content"]) for m in messages}


def test_run_tool_calls_takes_both_shapes_and_answers_in_order():
    tool_calls = [
        _openai("c1", "read", json.dumps({"label": "r1"})),
        {"id": "c2", "name": "read", "arguments": {"label": "r2"}},
        _openai("c3", "write", '{"label": "w1"}'),
    ]
    names = {"read": "par_read", "write": "par_write"}
    run = _run("par.turn", {"tool_calls": tool_calls, "names": names})
    assert run.status == RunStatus.SUCCEEDED, run.error
    messages = run.output_value()
    assert [m["tool_call_id"] for m in messages] == ["c1", "c2", "c3"]
    got = _contents(messages)
    assert got["c1"] == {"result": "r1-done"} and got["c2"] == {"result": "r2-done"}
    assert got["c3"]["result"]["label"] == "w1"
    # a tool called by the model is named as ctx.call_tool names it
    assert [sid for sid, _ in _rows(run.id)] == ["par_read", "par_read#2", "par_write"]


def test_malformed_arguments_and_unknown_tools_are_messages_to_the_model():
    tool_calls = [
        _openai("c1", "read", '{"label": '),  # cut off
        _openai("c2", "read", "[1, 2]"),  # not an object
        _openai("c3", "drop_tables", "{}"),  # not offered
        _openai("c4", "read", '{"label": "ok"}'),
    ]
    run = _run("par.turn", {"tool_calls": tool_calls, "names": {"read": "par_read"}})
    assert run.status == RunStatus.SUCCEEDED, run.error
    got = _contents(run.output_value())
    assert got["c1"]["error"]["type"] == "MalformedToolCall"
    assert "not valid JSON" in got["c1"]["error"]["message"]
    assert got["c2"]["error"]["type"] == "MalformedToolCall"
    assert got["c3"]["error"]["type"] == "ToolNotFound"
    assert "use one of read" in got["c3"]["error"]["message"]
    assert got["c4"] == {"result": "ok-done"}
    assert dict(pw.CALLS) == {"ok": 1}
    # recorded: a replay answers the same
    assert [sid for sid, _ in _rows(run.id)] == [
        "tool_calls[0]",
        "tool_calls[1]",
        "tool_calls[2]",
        "par_read",
    ]


def test_s20_a_rejected_write_skips_the_turns_later_writes_and_a_replay_says_the_same():
    approver = User.objects.create_user("approver", password="x")
    approver.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    tool_calls = [
        _openai("c1", "par_guarded_write", '{"label": "g1"}'),
        _openai("c2", "par_read", '{"label": "r1"}'),
        _openai("c3", "par_write", '{"label": "w2"}'),
        _openai("c4", "par_guarded_write", '{"label": "g2"}'),
    ]
    run = drive(
        durable.start(
            "par.turn", {"tool_calls": tool_calls, "after": True}, started_by="os:requester"
        ).id
    )
    assert run.status == RunStatus.WAITING
    request = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=request.pk, user=approver, approve=False, comment="no way")
    pw.FAILS["after"] = [durable.TransientError("busy")]  # released once more: a replay
    run = drive(run.id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING
    make_due(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error

    got = _contents(run.output_value())
    assert got["c1"]["error"]["type"] == "ApprovalRejected"
    assert "no way" in got["c1"]["error"]["message"]
    assert got["c2"] == {"result": "r1-done"}
    for skipped in ("c3", "c4"):
        assert got[skipped]["error"]["type"] == "SkippedAfterRejection"
        assert "earlier write of the same turn was rejected" in got[skipped]["error"]["message"]
    assert "g1" not in pw.CALLS and "w2" not in pw.CALLS and "g2" not in pw.CALLS
    assert not Operation.objects.filter(run_id=run.id).exists()
    assert ApprovalRequest.objects.filter(run=run).count() == 1  # g2 was never asked for
    skipped_row = Step.objects.get(run=run, step_id="par_write")
    assert skipped_row.error["type"] == "SkippedAfterRejection"


def test_a_failing_group_leaves_no_call_retrying_on_the_failed_run():
    # c fails twice in a row after b failed for good: its row was "retrying" after its
    # first try; once the group fails, it must say failed, not promise a retry
    pw.FAILS["b"] = [durable.PermanentError("b is broken")]
    pw.FAILS["c"] = [durable.TransientError("busy")] * 3
    run = _run("par.steps", {"labels": ["a", "b", "c"]})
    assert run.status == RunStatus.FAILED
    assert run.error["step_id"] == "parallel[1]"
    rows = dict(_rows(run.id))
    assert rows["parallel[2]"] == StepStatus.FAILED, rows
    step = Step.objects.get(run=run, step_id="parallel[2]")
    assert step.next_attempt_at is None and "busy" in step.error["message"]
