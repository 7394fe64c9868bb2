"""A child's parent-close policy (``ctx.start_child(..., parent_close_policy=)``, after
Temporal's ParentClosePolicy) is applied when the parent succeeds, fails or is cancelled."""

from __future__ import annotations

import pytest

import durable
from durable.models import Run, RunStatus
from durable.testing import drive
from tests.durable.runtime import child_workflows as cwf

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

WAITING_LEAF = {"n": 1, "wait_signal": True}


@pytest.fixture(autouse=True)
def _reset():
    cwf.reset()
    yield
    cwf.reset()


def started(policy: str | None, *, fail: bool = False) -> tuple[Run, str]:
    """A starts_and_fails parent driven once (it starts its child, then ends or waits),
    and its child's id."""
    data = {"leaf": WAITING_LEAF, "fail": fail, **({"policy": policy} if policy else {})}
    run = durable.start("tests.children.starts_and_fails", data)
    return drive(run.id), f"{run.id}.c"


@pytest.mark.parametrize("fail", [False, True], ids=["succeeds", "fails"])
def test_by_default_a_parent_that_ends_cancels_its_unfinished_child(fail):
    parent, child_id = started(None, fail=fail)
    assert parent.status == (RunStatus.FAILED if fail else RunStatus.SUCCEEDED)
    child = Run.objects.get(pk=child_id)
    assert child.parent_close_policy == "cancel"
    assert child.status == RunStatus.CANCELLED
    verb = "failed" if fail else "succeeded"
    assert (
        f"its parent run {parent.id} {verb} (parent close policy: cancel)"
        in (child.error["message"])
    )


def test_an_abandoned_child_runs_on_after_its_parent_fails_or_is_cancelled():
    parent, child_id = started("abandon", fail=True)
    assert parent.status == RunStatus.FAILED
    assert Run.objects.get(pk=child_id).status == RunStatus.PENDING
    assert drive(child_id).status == RunStatus.WAITING
    durable.signal(child_id, "go", {})
    assert drive(child_id).status == RunStatus.SUCCEEDED

    run = durable.start(
        "tests.children.parent", {"items": [{"n": 1, "id": "x", "wait_signal": True}]}
    )
    assert drive(run.id).status == RunStatus.WAITING
    Run.objects.filter(pk=f"{run.id}.x").update(parent_close_policy="abandon")
    assert drive(f"{run.id}.x").status == RunStatus.WAITING
    durable.cancel(run.id)
    assert Run.objects.get(pk=f"{run.id}.x").status == RunStatus.WAITING


def test_wait_makes_the_parent_wait_for_its_child_before_it_succeeds():
    parent, child_id = started("wait")
    assert parent.status == RunStatus.WAITING
    assert drive(child_id).status == RunStatus.WAITING
    assert drive(parent.id).status == RunStatus.WAITING  # still the child's
    durable.signal(child_id, "go", {})
    assert drive(child_id).status == RunStatus.SUCCEEDED
    done = drive(parent.id)
    assert done.status == RunStatus.SUCCEEDED
    assert done.output_value() == "done"
    assert cwf.EFFECTS["leaf:1"] == 1


def test_a_failing_parent_cancels_a_child_it_would_have_waited_for():
    parent, child_id = started("wait", fail=True)
    assert parent.status == RunStatus.FAILED
    assert Run.objects.get(pk=child_id).status == RunStatus.CANCELLED


def test_an_unknown_policy_fails_the_parent_naming_the_choices():
    run = durable.start(
        "tests.children.starts_and_fails", {"leaf": {"n": 1}, "policy": "terminate"}
    )
    parent = drive(run.id)
    assert parent.status == RunStatus.FAILED
    assert (
        "parent_close_policy 'terminate' is not one of cancel, abandon, wait"
        in (parent.error["message"])
    )
    assert not Run.objects.filter(parent_run=run).exists()


def test_an_operator_aborting_the_parent_at_an_unknown_outcome_cancels_its_child():
    from durable.models import Operation
    from durable.services.reconcile import operation_reconcile
    from tests.durable import cli_workflows as cw

    cw.reset()
    cw.FAILURES["cli_charge"] = 1
    try:
        run = durable.start("tests.children.starts_then_charges", {})
        assert drive(run.id).status == RunStatus.WAITING  # on the unknown outcome
        child_id = f"{run.id}.c"
        assert drive(child_id).status == RunStatus.WAITING
        op = Operation.objects.get(run_id=run.id)
        operation_reconcile(operation_id=op.pk, outcome="abort", by="otto")
    finally:
        cw.reset()
    assert Run.objects.get(pk=run.id).status == RunStatus.FAILED
    child = Run.objects.get(pk=child_id)
    assert child.status == RunStatus.CANCELLED
    assert (
        f"its parent run {run.id} failed (parent close policy: cancel)" in (child.error["message"])
    )
