"""The run page and the CLI for compensation: who owns each write (S23), and "it
happened" recorded for a compensating or cancelled run (S22)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

import durable
from durable.models import Operation, OperationStatus, RunStatus
from durable.testing import drive
from tests.dashboard.conftest import HTMX
from tests.durable.runtime import compensation_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    cw.reset()
    yield
    cw.reset()


def unknown_refund_b() -> tuple[str, Operation]:
    """A run waiting for a decision on refund_b (committed, then the connection reset)."""
    cw.PROVIDER["slow"]["ch_b"] = {"commit_after": 0.0, "answer_after": 0.0, "reset": True}
    run = drive(durable.start("comp.s22", {}).id)
    assert run.status == RunStatus.WAITING, run.error
    return run.id, Operation.objects.get(run_id=run.id, step_id="refund_b")


def test_the_run_page_shows_who_owns_each_write(viewer_client):
    cw.PROVIDER["smtp_550"] = True
    a = drive(durable.start("comp.s23", {"charge": "ch_1"}).id)
    cw.PROVIDER["smtp_550"] = False
    b = drive(durable.fork(a.id, from_step="email").id)
    assert b.status == RunStatus.SUCCEEDED, b.error

    page_a = viewer_client.get(f"/runs/{a.id}/").content.decode()
    assert f'owner: fork <a class="mono" href="/runs/{b.id}/">' in page_a
    assert "compensating this run leaves it" in page_a
    page_b = viewer_client.get(f"/runs/{b.id}/").content.decode()
    assert f"{a.id}:refund" in page_b  # the reused write is shown on the fork's page
    assert "owner: this run, adopted from" in page_b


def test_it_happened_from_the_run_page_of_a_compensating_run(operator_client):
    run_id, op = unknown_refund_b()
    durable.cancel(run_id)
    durable.compensate(run_id)
    run = drive(run_id)
    assert run.status == RunStatus.COMPENSATING and cw.PROVIDER["voids"] == []

    page = operator_client.get(f"/runs/{run_id}/").content.decode()
    assert "Waiting for your decision" in page and "It happened</button>" in page
    response = operator_client.post(
        f"/operations/{op.pk}/reconcile/",
        {"outcome": "happened", "result": json.dumps({"id": "re_2"}), "return_to": "detail"},
        **HTMX,
    )
    assert response.status_code == 200, response.content.decode()[:500]
    assert "the compensation of run" in response.content.decode()
    assert drive(run_id).status == RunStatus.COMPENSATED
    assert [v["refund"] for v in cw.PROVIDER["voids"]] == ["re_2", "re_1"]


def test_it_happened_for_a_cancelled_run_from_the_page_and_the_cli(operator_client):
    run_id, op = unknown_refund_b()
    durable.cancel(run_id)
    page = operator_client.get(f"/runs/{run_id}/").content.decode()
    assert "It happened</button>" in page and "Abort the run</button>" not in page

    out = StringIO()
    call_command(
        "durable",
        "reconcile",
        str(op.pk),
        "--happened",
        "--result",
        json.dumps({"id": "re_2"}),
        stdout=out,
    )
    assert f"run {run_id} stays cancelled" in out.getvalue()
    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED
    assert durable.get_run(run_id).status == RunStatus.CANCELLED
