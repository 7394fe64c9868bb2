"""The live demo of ``make up``: ``durable_demo --seed`` brings the reference agents to
the states an operator should find, and the operator's actions finish them."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command

import durable
from approvals.models import ApprovalRequest, ApprovalStatus
from durable.models import Operation, OperationStatus, Run, RunStatus
from durable.services.runs import operation_reconcile
from examples.demo import FRAMEWORK_LABELS
from tests.examples.flows import emails, objects
from tests.harness import wait_for_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.processes,
]


def test_seeded_demo_shows_every_state_and_an_operator_can_finish_it(agent_env, operator, workers):
    workers.start(wait=True, DURABLE_AUTODISCOVER="true")  # the framework agents too
    out = StringIO()
    call_command("durable_demo", "--seed", "--url", "http://127.0.0.1:8766/", stdout=out)
    text = out.getvalue()
    assert "the demo is ready" in text, text
    assert "http://127.0.0.1:8766/ -- log in as admin / admin" in text
    ids = dict(re.findall(r"^  (\S+)\s+http://127\.0\.0\.1:8766/runs/(\S+)/$", text, re.MULTILINE))
    status = dict(Run.objects.values_list("id", "status"))

    pending = set(
        ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).values_list(
            "run_id", flat=True
        )
    )
    assert pending == {
        ids["refund-approval"],
        ids["invoice-approval"],
        ids["purchase-approval"],
        ids["graph-refund-approval"],  # the LangGraph agent's refund (examples.refund_graph)
        # the PydanticAI and OpenAI Agents SDK reference agents, when their extras are in
        *(ids[label] for label in FRAMEWORK_LABELS),
    }
    assert status[ids["purchase-goods"]] == RunStatus.WAITING
    assert status[ids["support-done"]] == RunStatus.SUCCEEDED
    assert "scripted-llm" in Run.objects.get(pk=ids["support-done"]).tags
    assert status[ids["invoice-failed"]] == RunStatus.FAILED
    unknown = Operation.objects.get(run_id=ids["refund-unknown"], status=OperationStatus.UNKNOWN)

    # the operator compensates the failed invoice: voided, and a correction emailed
    durable.compensate(ids["invoice-failed"], by=operator, reason="demo")
    assert wait_for_run(ids["invoice-failed"], 60).status == RunStatus.COMPENSATED
    (inv,) = objects(agent_env, "invoice", ids["invoice-failed"])
    assert inv["status"] == "void"
    assert len(emails(agent_env, ids["invoice-failed"])) == 2

    # ... and decides the unknown refund: it did happen (the service has it)
    (refund,) = objects(agent_env, "refund", ids["refund-unknown"])
    operation_reconcile(
        operation_id=unknown.pk,
        outcome="happened",
        result=refund,
        external_id=refund["id"],
        by=operator,
        reason="found in payments",
    )
    done = wait_for_run(ids["refund-unknown"], 60)
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert len(objects(agent_env, "refund", ids["refund-unknown"])) == 1

    # running the seeder again the same day finds the same runs
    call_command("durable_demo", "--seed", stdout=StringIO())
    assert Run.objects.filter(id__startswith="demo-").count() == len(ids)
