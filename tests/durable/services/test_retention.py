"""Retention (durable/services/retention.py): finished runs past their retention are deleted with
every row of theirs, in batches; a run something may still act on is never deleted."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

import durable
from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.services import approval_decide
from durable.checks import check_durable
from durable.exceptions import RunNotFound, RunNotPrunable
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Signal,
    Step,
    StepAttempt,
    TraceEvent,
    Wait,
)
from durable.services import retention
from durable.services import runs as services
from durable.testing import drive
from tests import waits_workflows as ww
from tests.durable import cli_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86_400.0


@pytest.fixture(autouse=True)
def _reset():
    cw.reset()
    ww.EFFECTS.clear()
    yield
    cw.reset()
    ww.EFFECTS.clear()


@pytest.fixture
def retain(settings):
    """Set retention settings: ``retain(RETENTION_SECONDS=..., ...)``."""

    def apply(**values):
        settings.DURABLE = {**settings.DURABLE, "PRUNE_PAUSE_SECONDS": 0, **values}

    apply()
    return apply


def age(run: Run, days: float) -> Run:
    """Pretend the run finished ``days`` ago."""
    when = timezone.now() - timedelta(days=days)
    Run.objects.filter(pk=run.pk).update(finished_at=when, updated_at=when)
    run.refresh_from_db()
    return run


def rows_of(run_id: str) -> dict[str, int]:
    return {
        "steps": Step.objects.filter(run_id=run_id).count(),
        "attempts": StepAttempt.objects.filter(run_id=run_id).count(),
        "events": TraceEvent.objects.filter(run_id=run_id).count(),
        "operations": Operation.objects.filter(run_id=run_id).count(),
        "waits": Wait.objects.filter(run_id=run_id).count(),
        "signals": Signal.objects.filter(run_id=run_id).count(),
    }


def finished(workflow: str = "cli.echo", data=None, days: float = 40) -> Run:
    run = drive(durable.start(workflow, {"x": 1} if data is None else data).id)
    assert run.status in retention.PRUNABLE_STATUSES, (run.status, run.error)
    return age(run, days)


def unknown_outcome_run() -> Run:
    """A cli.charge run WAITING on the unknown outcome of its unsafe write."""
    cw.FAILURES["cli_charge"] = 1
    run = drive(durable.start("cli.charge", {"amount": 5}).id)
    assert run.status == RunStatus.WAITING, run.error
    return run


# --- what is deleted -------------------------------------------------------------------


def test_prune_deletes_an_old_finished_run_with_every_row_and_keeps_young_ones(retain):
    retain(RETENTION_SECONDS=30 * DAY)
    cw.FAILURES["cli_lookup"] = 1  # one failed attempt recorded
    old = finished("cli.lookup", {"query": "a"})
    charged = finished("cli.charge", {"amount": 3})
    young = finished("cli.echo", days=10)
    assert rows_of(old.pk)["attempts"] == 1
    assert rows_of(charged.pk)["operations"] == 1

    report = retention.prune()

    assert report["runs"] == 2
    assert set(Run.objects.values_list("pk", flat=True)) == {young.pk}
    for run in (old, charged):
        assert set(rows_of(run.pk).values()) == {0}
    assert rows_of(young.pk)["steps"] == 1
    assert report["rows"]["run"] == 2
    assert report["rows"]["stepattempt"] == 1
    assert report["rows"]["operation"] == 1


def test_prune_deletes_approval_requests_and_decisions_with_the_run(retain):
    retain(RETENTION_SECONDS=DAY)
    user = get_user_model().objects.create_user("boss", password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    run = drive(durable.start("tests.approval", {"n": 1}).id)
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=req.pk, user=user, approve=False, comment="no")
    run = drive(run.pk)
    assert run.status == RunStatus.SUCCEEDED, run.error
    age(run, 2)

    assert retention.prune()["runs"] == 1
    assert not ApprovalRequest.objects.filter(run_id=run.pk).exists()
    assert not ApprovalDecision.objects.exists()
    assert get_user_model().objects.filter(username="boss").exists()


def test_nothing_is_pruned_without_retention_configured(retain):
    retain()
    old = finished(days=5000)
    assert retention.prune()["runs"] == 0
    assert Run.objects.filter(pk=old.pk).exists()
    out = StringIO()
    call_command("durable", "prune", stdout=out)
    assert "retention is not configured" in out.getvalue()
    assert Run.objects.filter(pk=old.pk).exists()


def test_per_workflow_retention_overrides_the_global_one(retain):
    retain(
        RETENTION_SECONDS=30 * DAY,
        RETENTION_SECONDS_BY_WORKFLOW={"cli.lookup": 7 * DAY, "cli.charge": None},
    )
    echo_old = finished("cli.echo", days=40)
    echo_young = finished("cli.echo", {"x": 2}, days=10)
    lookup = finished("cli.lookup", {"query": "q"}, days=10)
    charge = finished("cli.charge", {"amount": 1}, days=5000)

    assert retention.retention_for("cli.lookup") == 7 * DAY
    assert retention.retention_for("cli.charge") is None
    assert retention.retention_for("cli.echo") == 30 * DAY
    retention.prune()

    left = set(Run.objects.values_list("pk", flat=True))
    assert left == {echo_young.pk, charge.pk}
    assert echo_old.pk not in left and lookup.pk not in left


def test_prune_works_in_batches_and_honours_limit_and_dry_run(retain):
    retain(RETENTION_SECONDS=DAY)
    runs = [finished("cli.echo", {"x": i}) for i in range(5)]

    assert retention.prune(dry_run=True)["runs"] == 5
    assert Run.objects.count() == 5
    report = retention.prune(batch_runs=2, limit=3)
    assert (report["runs"], report["batches"]) == (3, 2)
    report = retention.prune(batch_runs=2)
    assert (report["runs"], report["batches"]) == (2, 1)
    assert not Run.objects.filter(pk__in=[r.pk for r in runs]).exists()


# --- what is never deleted -------------------------------------------------------------


def test_unfinished_runs_are_never_pruned(retain):
    retain(RETENTION_SECONDS=0)
    waiting = unknown_outcome_run()
    pending = durable.start("cli.echo", {"x": "later"})
    age(waiting, 100)
    age(Run.objects.get(pk=pending.id), 100)

    assert retention.prune(older_than=0)["runs"] == 0
    assert Run.objects.count() == 2
    with pytest.raises(RunNotPrunable, match="is waiting, not finished"):
        retention.prune_run(waiting.pk)


def test_a_finished_run_with_a_write_of_unknown_outcome_is_never_pruned(retain):
    retain(RETENTION_SECONDS=0)
    run = unknown_outcome_run()
    services.run_cancel(run_id=run.pk, by="ops", reason="give up")
    run = age(Run.objects.get(pk=run.pk), 100)
    assert run.status == RunStatus.CANCELLED
    op = Operation.objects.get(run=run)
    assert op.status in (OperationStatus.UNKNOWN, OperationStatus.STARTED)

    assert retention.prune(older_than=0)["runs"] == 0
    assert Run.objects.filter(pk=run.pk).exists()
    with pytest.raises(RunNotPrunable, match="reconcile it first") as info:
        retention.prune_run(run.pk)
    assert op.idempotency_key in str(info.value)
    assert rows_of(run.pk)["operations"] == 1


def test_a_finished_run_with_a_started_write_is_never_pruned(retain):
    """A write ``started`` by a worker that died before the run was failed by hand."""
    retain(RETENTION_SECONDS=0)
    run = finished("cli.charge", {"amount": 9}, days=100)
    Operation.objects.filter(run=run).update(status=OperationStatus.STARTED)

    assert retention.prune(older_than=0)["runs"] == 0
    with pytest.raises(RunNotPrunable, match="is started"):
        retention.prune_run(run.pk)


def test_a_run_whose_compensation_failed_or_runs_is_never_pruned(retain):
    retain(RETENTION_SECONDS=0)
    failed = drive(durable.start("tests.charge_then_fail", {}).id)
    assert failed.status == RunStatus.FAILED
    compensating = drive(durable.start("tests.charge_then_fail", {"n": 2}).id)
    services.run_compensate(run_id=compensating.pk, by="ops")
    Run.objects.filter(pk=failed.pk).update(status=RunStatus.COMPENSATION_FAILED)
    for run in (failed, compensating):
        age(run, 100)
    assert Run.objects.get(pk=compensating.pk).status == RunStatus.COMPENSATING

    assert retention.prune(older_than=0)["runs"] == 0
    assert Run.objects.count() == 2
    with pytest.raises(RunNotPrunable, match="compensation failed and is still owed"):
        retention.prune_run(failed.pk)
    with pytest.raises(RunNotPrunable, match="is compensating, not finished"):
        retention.prune_run(compensating.pk)

    # once compensated, the run goes
    compensating = drive(compensating.pk)
    assert compensating.status == RunStatus.COMPENSATED, compensating.error
    age(compensating, 100)
    assert retention.prune(older_than=0)["runs"] == 1
    assert not Run.objects.filter(pk=compensating.pk).exists()


def test_a_run_with_a_pending_wait_is_never_pruned(retain):
    retain(RETENTION_SECONDS=0)
    run = finished("cli.echo", days=100)
    Wait.objects.create(run=run, wait_id="late", position=9, kind="signal", key="go")
    assert retention.prune(older_than=0)["runs"] == 0
    with pytest.raises(RunNotPrunable, match="pending wait"):
        retention.prune_run(run.pk)


def test_a_run_whose_write_a_fork_adopted_is_kept_while_the_fork_lives(retain):
    retain(RETENTION_SECONDS=0)
    source = finished("cli.charge", {"amount": 4}, days=100)
    fork = Run.objects.create(
        workflow_name="cli.charge", workflow_version="1", input="{}", forked_from=source
    )
    Operation.objects.filter(run=source).update(owner_run=fork)

    assert retention.prune(older_than=0)["runs"] == 0
    with pytest.raises(RunNotPrunable, match="fork"):
        retention.prune_run(source.pk)
    # the adoption alone keeps both, even once the fork finished
    Run.objects.filter(pk=fork.pk).update(
        status=RunStatus.SUCCEEDED, finished_at=timezone.now() - timedelta(days=100)
    )
    assert retention.prune(older_than=0)["runs"] == 0
    assert Run.objects.count() == 2


def test_prune_run_of_an_unknown_run_raises_run_not_found():
    with pytest.raises(RunNotFound):
        retention.prune_run("no-such-run")


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SKIP LOCKED: SQLite has one writer at a time"
)
def test_a_run_locked_by_an_operator_is_skipped_not_waited_for(retain):
    """An operator's transaction holds the run (a resume in progress): the prune skips it
    at once and deletes the others."""
    retain(RETENTION_SECONDS=DAY)
    busy = finished("cli.echo", {"x": "busy"})
    other = finished("cli.echo", {"x": "other"})
    locked, release = threading.Event(), threading.Event()

    def operator():
        with transaction.atomic():
            Run.objects.select_for_update().get(pk=busy.pk)
            locked.set()
            release.wait(30)
        connection.close()

    thread = threading.Thread(target=operator)
    thread.start()
    try:
        assert locked.wait(10)
        report = retention.prune()
    finally:
        release.set()
        thread.join()
    assert report["runs"] == 1
    assert set(Run.objects.values_list("pk", flat=True)) == {busy.pk}
    assert not Run.objects.filter(pk=other.pk).exists()


# --- the command, the beat task, the checks -------------------------------------------


def test_prune_command_reports_and_refuses_kept_runs_with_exit_2(retain):
    retain(RETENTION_SECONDS=DAY)
    old = finished("cli.echo", {"x": 1})
    out = StringIO()
    call_command("durable", "prune", "--dry-run", stdout=out)
    assert "would prune 1 runs" in out.getvalue()
    out = StringIO()
    call_command("durable", "prune", "--json", stdout=out)
    assert '"runs": 1' in out.getvalue()
    assert not Run.objects.filter(pk=old.pk).exists()

    waiting = unknown_outcome_run()
    young = finished("cli.echo", {"x": 2}, days=0)
    out = StringIO()
    with pytest.raises(CommandError) as info:
        call_command("durable", "prune", "--run", young.pk, "--run", waiting.pk, stdout=out)
    assert info.value.returncode == 2
    assert f"run {waiting.pk} is kept: it is waiting" in str(info.value)
    assert f"pruned run {young.pk}" in out.getvalue()
    assert Run.objects.filter(pk=waiting.pk).exists()


def test_prune_run_with_dry_run_deletes_nothing_and_says_what_it_would_do():
    done = finished("cli.echo", {"x": 3}, days=0)
    waiting = unknown_outcome_run()
    out = StringIO()
    with pytest.raises(CommandError) as info:
        call_command(
            "durable", "prune", "--run", done.pk, "--run", waiting.pk, "--dry-run", stdout=out
        )
    assert info.value.returncode == 2 and f"run {waiting.pk} is kept" in str(info.value)
    assert f"would prune run {done.pk}" in out.getvalue()
    assert "pruned run" not in out.getvalue()
    assert Run.objects.filter(pk=done.pk).exists()  # a dry run deletes nothing
    out = StringIO()
    call_command("durable", "prune", "--run", done.pk, "--dry-run", "--json", stdout=out)
    assert '"dry_run": true' in out.getvalue() and done.pk in out.getvalue()
    assert Run.objects.filter(pk=done.pk).exists()
    assert retention.prune_many([done.pk], dry_run=True)["pruned"] == [done.pk]
    assert Run.objects.filter(pk=done.pk).exists()


def test_the_beat_task_prunes_with_the_configured_retention(retain, settings):
    from durable.worker.tasks import prune

    retain(RETENTION_SECONDS=DAY)
    finished(days=2)
    assert prune() == 1
    assert "durable-prune" in settings.CELERY_BEAT_SCHEDULE
    assert settings.CELERY_BEAT_SCHEDULE["durable-prune"]["task"] == "durable.prune"


@pytest.mark.parametrize(
    "values",
    [
        {"RETENTION_SECONDS": -1},
        {"RETENTION_SECONDS": "a month"},
        {"RETENTION_SECONDS_BY_WORKFLOW": {"x": -5}},
        {"RETENTION_SECONDS_BY_WORKFLOW": ["x"]},
        {"PRUNE_BATCH_RUNS": 0},
    ],
)
def test_bad_retention_settings_fail_the_system_check(retain, values):
    retain(**values)
    assert [m for m in check_durable() if m.id == "durable.E008"]


def test_good_retention_settings_pass_the_system_check(retain):
    retain(RETENTION_SECONDS=DAY, RETENTION_SECONDS_BY_WORKFLOW={"a": None, "b": 0})
    assert not [m for m in check_durable() if m.id == "durable.E008"]
