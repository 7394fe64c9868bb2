"""``manage.py durable replay-check``: recorded runs against the code installed now,
dry (nothing runs, nothing is written), with the first divergence of each run."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

import durable
from durable.models import Operation, Run, RunStatus, Step, StepAttempt, TraceEvent, Wait
from durable.testing import drive
from durable.waits.closing import close_wait_txn
from tests.durable import replay_workflows as rw

pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOWS_FILE = rw.__file__


@pytest.fixture(autouse=True)
def _reset():
    rw.reset()
    yield
    rw.reset()


def waiting_run(message: str = "charged twice") -> Run:
    """A replay.support v1 run parked on its approval (plan and lookup recorded)."""
    run = drive(durable.start("replay.support", {"message": message}, version="1").id)
    assert run.status == RunStatus.WAITING, run.error
    return run


def approve(run: Run) -> None:
    """Resolve the run's pending approval as approved (the engine's own closing)."""
    with transaction.atomic():
        wait = Wait.objects.select_for_update().get(run=run, status="pending")
        close_wait_txn(
            wait,
            status="resolved",
            result={"approved": True, "decided_by": ["tester"]},
            by="tester",
        )


def check(*args: str) -> tuple[dict, int]:
    """The JSON report and the exit code of ``replay-check --json ARGS``."""
    out = StringIO()
    code = 0
    try:
        call_command("durable", "replay-check", "--json", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        code = exc.returncode
    return json.loads(out.getvalue()), code


def diverged_runs(report: dict) -> dict[str, dict]:
    return {r["run_id"]: r for g in report["groups"] for r in g["runs"]}


def row_counts() -> dict[str, int]:
    return {
        m.__name__: m.objects.count() for m in (Run, Step, StepAttempt, Wait, Operation, TraceEvent)
    }


def test_a_call_added_before_a_wait_is_reported_naming_the_run_and_the_step():
    run = waiting_run()
    rw.CALLS.clear()
    rw.EDIT["support"] = "call_before_wait"
    report, code = check("--workflow", "replay.support")
    assert code == 1
    assert report["compatible"] is False
    assert report["checked"] == 1 and report["diverged"] == 1
    d = diverged_runs(report)[run.id]["divergence"]
    assert d["reason"] == "different_call"
    assert d["position"] == 2
    assert d["expected"] == {"step_id": "approval:refund", "kind": "wait", "tool": ""}
    assert d["got"] == {"step_id": "check_fraud", "kind": "step", "tool": ""}
    assert d["file"] == WORKFLOWS_FILE
    with open(WORKFLOWS_FILE) as fh:
        assert "check_fraud" in fh.read().splitlines()[d["line"] - 1]
    assert rw.CALLS == []  # nothing ran: plan and lookup came back recorded


def test_the_text_report_names_the_run_the_expected_step_and_the_code_line():
    run = waiting_run()
    rw.EDIT["support"] = "call_before_wait"
    out = StringIO()
    with pytest.raises(CommandError) as info:
        call_command("durable", "replay-check", stdout=out, stderr=StringIO())
    assert info.value.returncode == 1
    text = out.getvalue()
    assert "replay.support version 1: 1 checked, 1 diverged" in text
    assert f"run {run.id} (waiting)" in text
    assert "history expects: approval:refund (wait)" in text
    assert "code calls:      check_fraud (step)" in text
    assert f"at {WORKFLOWS_FILE}:" in text


@pytest.mark.parametrize("edit", [None, "step_after_wait"])
def test_unchanged_code_and_a_step_added_after_a_pending_wait_pass(edit):
    run = waiting_run()
    rw.CALLS.clear()
    rw.EDIT["support"] = edit
    report, code = check()
    assert code == 0 and report["compatible"] is True and report["diverged"] == 0
    (group,) = report["groups"]
    assert (group["workflow"], group["version"], group["checked"]) == ("replay.support", "1", 1)
    assert group["outcomes"] == {"continues": 1}
    assert group["runs"] == []
    assert rw.CALLS == []
    assert run.id


def test_a_finished_run_is_checked_with_status_all_and_an_edit_after_its_last_call_passes():
    run = waiting_run()
    approve(run)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    report, code = check()
    assert report["checked"] == 0 and code == 0  # open runs only by default
    report, code = check("--status", "all")
    assert code == 0 and report["groups"][0]["outcomes"] == {"completes": 1}
    rw.EDIT["support"] = "call_before_wait"
    report, code = check("--status", "all")
    assert code == 1
    assert diverged_runs(report)[run.id]["divergence"]["expected"]["step_id"] == "approval:refund"


@pytest.mark.parametrize(
    ("edit", "reason", "expected", "got"),
    [
        (
            "tool_removed",
            "different_call",
            {"step_id": "replay.lookup", "kind": "tool", "tool": "replay.lookup"},
            {"step_id": "approval:refund", "kind": "wait", "tool": ""},
        ),
        (
            "tool_renamed",
            "tool_changed",
            {"step_id": "replay.lookup", "kind": "tool", "tool": "replay.lookup"},
            {"step_id": "replay.lookup", "kind": "tool", "tool": "replay.lookup_v2"},
        ),
    ],
)
def test_a_removed_or_renamed_tool_call_diverges(edit, reason, expected, got):
    run = waiting_run()
    rw.EDIT["support"] = edit
    report, code = check()
    assert code == 1
    d = diverged_runs(report)[run.id]["divergence"]
    assert (d["reason"], d["position"], d["expected"], d["got"]) == (reason, 1, expected, got)
    assert d["file"] == WORKFLOWS_FILE


def test_code_that_raises_on_replay_diverges_with_its_line():
    run = waiting_run()
    rw.EDIT["support"] = "raises"
    report, code = check()
    assert code == 1
    d = diverged_runs(report)[run.id]["divergence"]
    assert d["reason"] == "raised" and "KeyError" in d["message"]
    assert d["file"] == WORKFLOWS_FILE
    with open(WORKFLOWS_FILE) as fh:
        assert "raise KeyError" in fh.read().splitlines()[d["line"] - 1]


def test_a_version_that_is_not_registered_is_reported():
    run = waiting_run()
    Run.objects.filter(pk=run.pk).update(workflow_version="0-retired")
    ok = waiting_run("another")
    report, code = check()
    assert code == 1
    groups = {(g["workflow"], g["version"]): g for g in report["groups"]}
    retired = groups[("replay.support", "0-retired")]
    assert retired["registered"] is False and retired["diverged"] == 1
    assert retired["runs"][0]["run_id"] == run.id
    assert retired["runs"][0]["divergence"]["reason"] == "not_registered"
    assert groups[("replay.support", "1")]["compatible"] == 1
    assert ok.id not in diverged_runs(report)


def test_selection_by_workflow_version_since_and_sample():
    runs = [waiting_run(f"m{i}") for i in range(3)]
    v2 = drive(durable.start("replay.support", {"message": "v2"}).id)
    assert v2.workflow_version == "2"
    rw.EDIT["support"] = "call_before_wait"  # v1 only
    report, code = check("--version", "2")
    assert (report["checked"], code) == (0, 0)  # v2 succeeded: not open
    report, _ = check("--status", "all", "--version", "2")
    assert report["checked"] == 1 and report["diverged"] == 0
    report, code = check("--workflow", "replay.support", "--sample", "2", "--seed", "7")
    assert report["checked"] == 2 and code == 1
    assert set(diverged_runs(report)) <= {r.id for r in runs}
    report, _ = check("--since", "1h")
    assert report["checked"] == 3
    report, _ = check("--since", "2999-01-01")
    assert report["checked"] == 0
    assert report["selection"] == {
        "workflow": None,
        "version": None,
        "status": "open",
        "sample": None,
        "since": report["selection"]["since"],
    }


def test_the_json_report_has_its_documented_shape():
    run = waiting_run()
    rw.EDIT["support"] = "call_before_wait"
    report, _ = check()
    assert set(report) == {
        "format", "compatible", "checked", "diverged", "seconds", "selection", "groups"
    }  # fmt: skip
    assert report["format"] == "durable.replay-check/1"
    (group,) = report["groups"]
    assert set(group) == {
        "workflow", "version", "registered", "checked", "compatible", "diverged", "outcomes",
        "runs",
    }  # fmt: skip
    (entry,) = group["runs"]
    assert set(entry) == {
        "run_id", "workflow", "version", "status", "compatible", "outcome", "replayed",
        "continues_at", "divergence",
    }  # fmt: skip
    assert entry["run_id"] == run.id and entry["outcome"] == "diverged"
    assert entry["replayed"] == 2
    assert set(entry["divergence"]) == {
        "reason", "message", "position", "expected", "got", "file", "line"
    }  # fmt: skip


def test_nothing_is_written():
    waiting_run()
    rw.EDIT["support"] = "call_before_wait"
    before = row_counts()
    check("--status", "all")
    rw.EDIT["support"] = None
    check("--status", "all")
    assert row_counts() == before


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL roles")
def test_it_runs_under_a_role_that_may_only_select():
    waiting_run()
    rw.EDIT["support"] = "call_before_wait"
    with connection.cursor() as cur:
        cur.execute("DROP ROLE IF EXISTS durable_replay_reader")
        cur.execute("CREATE ROLE durable_replay_reader NOLOGIN")
        cur.execute("GRANT USAGE ON SCHEMA public TO durable_replay_reader")
        cur.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO durable_replay_reader")
        cur.execute("SET ROLE durable_replay_reader")
    try:
        # the role really cannot write
        with connection.cursor() as cur, pytest.raises(Exception, match="permission denied"):
            cur.execute("UPDATE durable_run SET tags = tags")
        report, code = check("--status", "all")
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET ROLE")
            cur.execute("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM durable_replay_reader")
            cur.execute("REVOKE USAGE ON SCHEMA public FROM durable_replay_reader")
            cur.execute("DROP ROLE durable_replay_reader")
    assert code == 1 and report["diverged"] == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL sessions")
def test_it_runs_in_a_read_only_session():
    waiting_run()
    with connection.cursor() as cur:
        cur.execute("SET SESSION default_transaction_read_only = on")
    try:
        report, code = check("--status", "all")
    finally:
        with connection.cursor() as cur:
            cur.execute("SET SESSION default_transaction_read_only = off")
    assert code == 0 and report["checked"] == 1


def test_parallel_groups_tool_turns_timers_children_and_signals_replay_without_a_false_alarm():
    parent = drive(durable.start("replay.mixed", {}).id)
    assert parent.status == RunStatus.WAITING, parent.error  # on the child
    child = drive(f"{parent.id}.leaf")
    assert child.status == RunStatus.SUCCEEDED, child.error
    parent = drive(parent.id)
    assert parent.status == RunStatus.WAITING, parent.error  # on the signal
    report, code = check("--status", "all")
    assert code == 0, report
    outcomes = {g["workflow"]: g["outcomes"] for g in report["groups"]}
    assert outcomes == {"replay.mixed": {"continues": 1}, "replay.leaf": {"completes": 1}}
    rw.EDIT["mixed"] = "after_signal"  # a step after the pending signal wait
    assert check()[1] == 0
    durable.signal(parent.id, "go", {"ok": True})
    parent = drive(parent.id)
    assert parent.status == RunStatus.SUCCEEDED, parent.error
    report, code = check("--status", "all", "--workflow", "replay.mixed")
    assert code == 0 and report["groups"][0]["outcomes"] == {"completes": 1}
    rw.EDIT.clear()  # the run recorded "after": code without it returns before it
    report, code = check("--status", "all", "--workflow", "replay.mixed")
    d = diverged_runs(report)[parent.id]["divergence"]
    assert (code, d["reason"], d["expected"]["step_id"]) == (1, "returned_early", "after")


def test_a_write_of_the_workflow_code_itself_is_refused_and_reported():
    """The check's connection is read-only (a READ ONLY transaction on PostgreSQL,
    query_only on SQLite): code that writes outside a step fails there, and the run
    is reported as diverged; the other runs are still checked."""
    run = waiting_run()
    other = waiting_run("another")
    rw.EDIT["support"] = "writes"
    before = row_counts()
    report, code = check()
    assert code == 1 and report["checked"] == 2 and report["diverged"] == 2
    d = diverged_runs(report)[run.id]["divergence"]
    assert d["reason"] == "raised"
    assert "read-only" in d["message"] or "readonly" in d["message"], d["message"]
    assert row_counts() == before
    assert Run.objects.get(pk=run.pk).tags == Run.objects.get(pk=other.pk).tags == []
