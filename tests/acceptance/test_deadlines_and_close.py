"""Capabilities 4, 5 and 7: a run's deadline holds in every state
(docs/architecture.md "Budgets and deadlines"), the children's parent-close policy
applies when the sweeper ends a parent (docs/children.md "When the parent ends"), and
the deadline's failure says which rule made it final on every surface
(docs/architecture.md "Failures and retries"). Sweeps get a clock past the deadline."""

from __future__ import annotations

import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

import durable
from approvals.models import ApprovalRequest, ApprovalStatus
from durable.client import RunFailed
from durable.limits import Limits
from durable.models import Run, RunStatus, TraceEvent, Wait, WaitKind, WaitStatus
from durable.runtime import limit_store
from durable.testing import drive
from durable.worker.sweeper import sweep
from tests import waits_workflows  # noqa: F401  (tests.approval)
from tests.api.conftest import api_for
from tests.dashboard.conftest import make_user
from tests.durable.runtime import child_workflows  # noqa: F401  (tests.children.*)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def past_deadline(run_id: str) -> dict:
    deadline = Run.objects.get(pk=run_id).deadline_at
    assert deadline is not None
    return sweep(now=deadline + timedelta(seconds=1))


def assert_failed_by_deadline(run_id: str) -> Run:
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.FAILED, (run.status, run.error)
    assert run.error_type == "BudgetExceeded", run.error
    assert not Wait.objects.filter(run_id=run_id, status=WaitStatus.PENDING).exists()
    return run


def test_a_run_waiting_on_an_approval_ends_at_its_deadline_and_its_request_is_cancelled():
    """Netflix Conductor "Timeout of WAIT task doesn't cause workflow to fail"
    (https://github.com/Netflix/conductor/issues/1268) and "WAIT for a signal task does
    not timeout" (https://github.com/conductor-oss/conductor/issues/1146). A run waits
    for a person's approval past its deadline: the sweeper fails it, and the approval
    request is cancelled with its wait, so no approver sees it as open."""
    run = durable.start("tests.approval", {"amount": 5}, deadline_seconds=30)
    assert drive(run.id).status == RunStatus.WAITING
    request = ApprovalRequest.objects.get(run_id=run.id)
    assert request.status == ApprovalStatus.PENDING
    assert past_deadline(run.id)["deadlines"] == 1
    assert_failed_by_deadline(run.id)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.CANCELLED, request.status
    assert not ApprovalRequest.objects.pending().filter(run_id=run.id).exists()


def test_a_run_parked_on_max_concurrent_runs_ends_at_its_deadline():
    """Kestra "concurrency slot never released, executions queue indefinitely"
    (https://github.com/kestra-io/kestra/pull/14355): a run queued behind a workflow's
    concurrency limit must still end at its own deadline. The one slot of
    ``acceptance.exclusive`` (max_concurrent_runs=1) is held by another execution; the new run
    parks on ``limit:run``; past its deadline the sweeper fails it."""
    holder = Run.objects.create(
        id=f"holder-{uuid.uuid4().hex[:8]}",
        workflow_name="acceptance.exclusive",
        workflow_version="1",
        status=RunStatus.RUNNING,
        input="{}",
        input_hash="h",
        lease_owner="elsewhere",
        lease_token=uuid.uuid4().hex,
        lease_expires_at=timezone.now() + timedelta(minutes=10),
    )
    verdict, _slot = limit_store.acquire(
        Limits("workflow:acceptance.exclusive", None, 1), run_id=holder.id, token=holder.lease_token
    )
    assert verdict.admitted
    run = durable.start("acceptance.exclusive", {}, deadline_seconds=60)
    assert drive(run.id).status == RunStatus.WAITING
    wait = Wait.objects.get(run_id=run.id, kind=WaitKind.LIMIT)
    assert wait.wait_id == "limit:run"
    assert past_deadline(run.id)["deadlines"] == 1
    assert_failed_by_deadline(run.id)
    assert Wait.objects.get(pk=wait.pk).status == WaitStatus.CANCELLED


def test_a_pending_run_nobody_claimed_ends_at_its_deadline():
    """DBOS/Temporal users: a workflow that sat in the queue past its timeout
    (https://github.com/discovery-ukraine/saga-lara-flow/issues/17: "a step whose
    deadline passed while its job sat in the queue"). Never claimed (no worker), the
    run is failed by the sweeper at its deadline and is not dispatched."""
    run = durable.start("acceptance.echo", {}, deadline_seconds=5)
    report = past_deadline(run.id)
    assert report["deadlines"] == 1 and run.id not in report["run_ids"]
    assert_failed_by_deadline(run.id)


def test_a_parent_waiting_at_its_close_for_a_wait_child_ends_at_its_deadline_cancelling_it():
    """Temporal's ParentClosePolicy (https://github.com/temporalio/documentation/pull/3324,
    "TERMINATE is the default") adapted: a parent whose child has policy ``wait`` has
    returned and waits (WAITING) for the child's end; past its deadline the parent
    fails, and a failing parent cancels a ``wait`` child (docs/children.md table)."""
    run = durable.start(
        "tests.children.starts_and_fails",
        {"leaf": {"n": 1, "wait_signal": True}, "policy": "wait"},
        deadline_seconds=30,
    )
    assert drive(run.id).status == RunStatus.WAITING
    child_id = f"{run.id}.c"
    assert drive(child_id).status == RunStatus.WAITING
    assert past_deadline(run.id)["deadlines"] == 1
    assert_failed_by_deadline(run.id)
    child = Run.objects.get(pk=child_id)
    assert child.status == RunStatus.CANCELLED, child.status
    assert "parent close policy: wait" in child.error["message"], child.error


def test_a_parent_past_its_deadline_leaves_an_abandoned_child_running():
    """autokitteh "parent close policy to abandon"
    (https://github.com/autokitteh/autokitteh/pull/1224: children must not be
    terminated with the parent). A parent waits on an ``abandon`` child and passes its
    deadline: the parent fails; the child runs on and can still finish."""
    run = durable.start(
        "acceptance.parent_waits_on_child", {"policy": "abandon"}, deadline_seconds=30
    )
    assert drive(run.id).status == RunStatus.WAITING
    child_id = f"{run.id}.kid"
    assert drive(child_id).status == RunStatus.WAITING
    assert past_deadline(run.id)["deadlines"] == 1
    assert_failed_by_deadline(run.id)
    assert Run.objects.get(pk=child_id).status == RunStatus.WAITING
    durable.signal(child_id, "go", {"late": True})
    assert drive(child_id).status == RunStatus.SUCCEEDED


def test_the_deadline_failure_says_its_rule_on_every_surface():
    """ "A declared retry block silently never fires ... neither check nor the run card
    says why" (https://github.com/supernovae-st/nika/issues/1603) and "If we run out of
    retries, tell the end user the full reason"
    (https://github.com/GameAnalytics/current/pull/20). A run failed by the sweeper at
    its deadline must carry the rule on the stored error (``reason``), ``durable
    show``, ``RunFailed`` (``.reason``), the API's ``error.reason`` and the
    ``budget_exceeded`` event the webhooks carry (docs: "BudgetExceeded: a budget of
    the run ran out")."""
    run = durable.start("acceptance.signal", {}, deadline_seconds=30)
    assert drive(run.id).status == RunStatus.WAITING
    past_deadline(run.id)
    run = assert_failed_by_deadline(run.id)
    seen: dict[str, object] = {"stored error reason": (run.error or {}).get("reason")}
    out = StringIO()
    call_command("durable", "show", run.id, stdout=out, stderr=StringIO())
    header = out.getvalue().split("\n\n")[0].splitlines()
    seen["durable show reason"] = next(
        (ln.partition(":")[2].strip() for ln in header if ln.partition(":")[0].strip() == "reason"),
        None,
    )
    with pytest.raises(RunFailed) as caught:
        durable.result(run.id, timeout=1)
    seen["RunFailed.reason"] = caught.value.reason
    api = api_for(make_user("acc-vera", "viewer"))
    seen["API error.reason"] = (api.get(f"/runs/{run.id}").json()["error"] or {}).get("reason")
    event = TraceEvent.objects.get(run_id=run.id, kind="budget_exceeded")
    from api.webhooks_out import event_of

    webhook = event_of(event)
    assert webhook is not None and webhook["type"] == "run.failed"
    seen["event / webhook error"] = webhook["data"]["error"]
    rule = "BudgetExceeded: a budget of the run ran out"
    missing = {k: v for k, v in seen.items() if not (isinstance(v, str) and v.startswith(rule))}
    assert not missing, f"surfaces without the rule {rule!r}: {missing}"
