"""An idempotent write whose try failed after it may have taken effect (a reset
connection, a read timeout, a 5xx) has an unknown outcome, not a failed one: cancelled
before its retry and compensated, the run reconciles the write and undoes it.

Found by the chaos audit (``manage.py durable_chaos``): a bill whose connection the
payments service reset after committing was recorded ``failed``; the cascade was
cancelled before the retry, and its compensation skipped the invoice as "did not
happen" -- an effect never undone.
"""

from __future__ import annotations

import pytest

import durable
from durable.models import Operation, OperationStatus, RunStatus
from durable.retry import may_have_happened
from durable.testing import drive
from tests.durable.runtime import compensation_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    cw.reset()
    yield
    cw.reset()


def test_a_reset_after_commit_leaves_the_write_started_and_compensation_undoes_it():
    cw.PROVIDER["reset_after_commit"] = True
    run = drive(durable.start("comp.charge_once", {}).id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING, run.error
    op = Operation.objects.get(run=run)
    assert op.status == OperationStatus.STARTED  # unknown: it may have happened
    assert op.error["type"] == "ConnectionResetError"

    durable.cancel(run.id, reason="before the retry")
    durable.compensate(run.id, reason="undo")
    run = drive(run.id)

    assert run.status == RunStatus.COMPENSATED, run.error
    op.refresh_from_db()
    assert (op.status, op.resolution) == (OperationStatus.SUCCEEDED, "reconciled: happened")
    [refund] = cw.PROVIDER["refunds"].values()
    assert cw.PROVIDER["voids"] == [
        {"refund": refund["id"], "key": f"{run.id}:compensate:comp.charge"}
    ]


def test_a_request_never_sent_is_failed_and_there_is_nothing_to_undo():
    cw.PROVIDER["refused"] = True
    run = drive(durable.start("comp.charge_once", {}).id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING, run.error
    assert Operation.objects.get(run=run).status == OperationStatus.FAILED

    durable.cancel(run.id)
    durable.compensate(run.id)
    run = drive(run.id)

    assert run.status == RunStatus.COMPENSATED, run.error
    assert cw.PROVIDER["refunds"] == {} and cw.PROVIDER["voids"] == []


class _Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.response = type("R", (), {"status_code": status, "headers": {}})()


@pytest.mark.parametrize(
    ("exc", "maybe"),
    [
        (ConnectionResetError(104, "reset"), True),
        (TimeoutError("read timed out"), True),
        (_Status(503), True),
        (_Status(409), True),  # in progress: the other request may still commit
        (_Status(429), False),
        (_Status(400), False),
        (ConnectionRefusedError(111, "refused"), False),
    ],
)
def test_which_failures_may_have_happened(exc, maybe):
    assert may_have_happened(exc) is maybe
