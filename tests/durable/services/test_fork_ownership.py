"""A fork owns the writes it reuses (S23): compensation undoes each write once,
by the run that answers for it."""

from __future__ import annotations

import pytest

import durable
from durable.models import Operation, RunStatus, TraceEvent
from durable.testing import drive
from tests.durable.runtime import compensation_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    cw.reset()
    yield
    cw.reset()


def failed_at_email(charge: str):
    cw.PROVIDER["smtp_550"] = True
    run = drive(durable.start("comp.s23", {"charge": charge}).id)
    assert run.status == RunStatus.FAILED and "550" in run.error["message"]
    return run


def fork_from_email(run_id: str, *, smtp_ok: bool):
    cw.PROVIDER["smtp_550"] = not smtp_ok
    return drive(durable.fork(run_id, from_step="email").id)


def refund_op(run_id: str) -> Operation:
    return Operation.objects.get(run_id=run_id, step_id="refund")


def test_s23_compensating_the_source_leaves_the_refund_a_succeeded_fork_adopted():
    a = failed_at_email("ch_1")
    b = fork_from_email(a.id, smtp_ok=True)
    assert b.status == RunStatus.SUCCEEDED, b.error
    op = refund_op(a.id)
    assert op.owner_id == b.id  # the ledger says who answers for it now
    assert [h["run"] for h in op.owners] == [b.id] and op.owners[0]["from"] == a.id
    assert TraceEvent.objects.filter(run=b, kind="operation_adopted").exists()
    assert TraceEvent.objects.filter(run=a, kind="operation_handed_over").exists()

    durable.compensate(a.id)
    a = drive(a.id)
    assert a.status == RunStatus.COMPENSATED, a.error
    assert cw.PROVIDER["voids"] == []  # B's refund is not voided
    assert a.output_value()["owned_by"] == [{"step_id": "refund", "owner": b.id}]
    assert a.output_value()["compensated"] == []


def test_s23_compensating_a_failed_fork_voids_the_refund_it_adopted():
    a = failed_at_email("ch_2")
    c = fork_from_email(a.id, smtp_ok=False)
    assert c.status == RunStatus.FAILED
    assert refund_op(a.id).owner_id == c.id

    durable.compensate(c.id)
    c = drive(c.id)
    assert c.status == RunStatus.COMPENSATED, c.error
    assert [v["refund"] for v in cw.PROVIDER["voids"]] == ["re_1"]
    assert c.output_value()["compensated"] == ["refund"]

    # the source lists it as the fork's, and voids nothing twice
    durable.compensate(a.id)
    a = drive(a.id)
    assert a.status == RunStatus.COMPENSATED
    assert a.output_value()["owned_by"] == [{"step_id": "refund", "owner": c.id}]
    assert len(cw.PROVIDER["voids"]) == 1


def test_of_two_forks_the_succeeded_one_keeps_the_write():
    """Ownership passes only from a run that gave its result up (failed, cancelled,
    failed to compensate): a later fork reuses a write a succeeded fork owns, without
    owning it."""
    a = failed_at_email("ch_3")
    b = fork_from_email(a.id, smtp_ok=True)
    c = fork_from_email(a.id, smtp_ok=False)
    assert (b.status, c.status) == (RunStatus.SUCCEEDED, RunStatus.FAILED)
    assert refund_op(a.id).owner_id == b.id
    assert TraceEvent.objects.filter(run=c, kind="operation_reused").exists()

    durable.compensate(c.id)
    c = drive(c.id)
    assert c.status == RunStatus.COMPENSATED, c.error
    assert cw.PROVIDER["voids"] == []
    assert c.output_value()["owned_by"] == [{"step_id": "refund", "owner": b.id}]


def test_a_fork_of_a_failed_fork_takes_the_write_over():
    a = failed_at_email("ch_4")
    c = fork_from_email(a.id, smtp_ok=False)
    d = fork_from_email(c.id, smtp_ok=True)
    assert d.status == RunStatus.SUCCEEDED
    op = refund_op(a.id)
    assert op.owner_id == d.id
    assert [(h["from"], h["run"]) for h in op.owners] == [(a.id, c.id), (c.id, d.id)]
    durable.compensate(c.id)
    assert drive(c.id).status == RunStatus.COMPENSATED
    assert cw.PROVIDER["voids"] == []


def test_a_compensated_write_cannot_be_reused_by_a_fork():
    """A compensated run's writes were undone: a fork may start at the first undone
    write (which it makes again) or before, never after it, and never at a
    compensation step. The dashboard's fork form offers the same points."""
    from durable.models import Step
    from durable.services.forks import fork_points
    from durable.services.runs import run_fork

    a = failed_at_email("ch_7")
    durable.compensate(a.id)
    a = drive(a.id)
    assert a.status == RunStatus.COMPENSATED, a.error
    steps = list(Step.objects.filter(run=a).order_by("position"))
    assert [s.step_id for s in steps] == ["refund", "email", "compensate:refund"]
    assert fork_points(steps) == ["refund"]

    with pytest.raises(ValueError, match="'refund' was compensated .* can start from: refund"):
        run_fork(run_id=a.id, from_step="email")
    with pytest.raises(ValueError, match="is a compensation step"):
        run_fork(run_id=a.id, from_step="compensate:refund")

    cw.PROVIDER["smtp_550"] = False
    b = drive(run_fork(run_id=a.id, from_step="refund").id)
    assert b.status == RunStatus.SUCCEEDED, b.error
    assert b.output_value()["refund"] != a.id  # a new refund, not the voided one
    assert Operation.objects.filter(run_id=b.id, step_id="refund").exists()
    assert len(cw.PROVIDER["refunds"]) == 2
