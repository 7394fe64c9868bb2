"""Each reference agent end to end on real worker processes, and with a worker SIGKILLed
in the middle of its riskiest write (tests/harness.py: ``celery worker --pool=solo``, a
2 s lease, the sweeper run by the test process).

The kill lands while the write is in flight: the service holds the request (an injected
``slow`` fault) and commits it after the worker died, so the outcome is unknown to the
engine. The next worker must settle it by reconciling -- never by writing again -- and
the services must end with exactly one refund, one ticket, one email each.
"""

from __future__ import annotations

import pytest

import durable
from durable.models import AttemptOutcome, Operation, RunStatus, StepAttempt
from examples.procs import admin
from tests.examples.flows import (
    decide,
    emails,
    invoice_input,
    llm_requests,
    objects,
    pending_approval,
    procurement_input,
    start_example,
    support_input,
)
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.processes,
]


def requests_seen(services, path: str) -> int:
    counters = admin(services.payments_url, "GET", "/_admin/stats")["counters"]
    return counters.get(f"requests POST {path}", 0)


def approve_when_asked(run_id: str, user, timeout: float = 60.0) -> None:
    wait_until(lambda: pending_approval(run_id), timeout, what=f"the approval of {run_id}")
    decide(run_id, user)


def worker_lost(run_id: str, tool: str) -> bool:
    return StepAttempt.objects.filter(
        run_id=run_id, step__step_id=tool, outcome=AttemptOutcome.WORKER_LOST
    ).exists()


def assert_succeeded(run) -> None:
    assert run.status == RunStatus.SUCCEEDED, f"run {run.id} is {run.status}: {run.error}"


# ------------------------------------------------------------------------ support


def test_support_agent_on_a_worker(agent_env, operator, workers):
    workers.start(wait=True)
    run = start_example("examples.support", support_input(1), max_tokens=50_000)
    approve_when_asked(run.id, operator)
    done = wait_for_run(run.id, 60)
    assert_succeeded(done)
    assert len(objects(agent_env, "refund", run.id)) == 1
    assert len(objects(agent_env, "ticket", run.id)) == 1
    assert len(emails(agent_env, run.id)) == 1
    assert [r["turn"] for r in llm_requests(agent_env, run.id)] == [0, 1]


def test_support_agent_survives_a_sigkill_during_the_refund(agent_env, operator, workers):
    admin(
        agent_env.payments_url,
        "POST",
        "/_admin/faults",
        {"fault": "slow", "seconds": 3, "path": "^/v1/refunds$", "method": "POST"},
    )
    first = workers.start(wait=True)
    run = start_example("examples.support", support_input(2), max_tokens=50_000)
    approve_when_asked(run.id, operator)
    wait_until(
        lambda: requests_seen(agent_env, "/v1/refunds"),
        60,
        what="the refund request to reach the payments service",
    )
    workers.kill(first)  # the refund commits on the service after its caller died
    workers.start()
    done = wait_for_run(run.id, 90)
    assert_succeeded(done)
    (refund,) = objects(agent_env, "refund", run.id)
    op = Operation.objects.get(run_id=run.id, tool_name="examples.payments.refund")
    assert op.external_id == refund["id"]
    assert worker_lost(run.id, "examples.payments.refund")
    assert len(objects(agent_env, "ticket", run.id)) == 1
    assert len(emails(agent_env, run.id)) == 1
    # the plan was recorded once and read back on resume, never asked for again
    assert [r["turn"] for r in llm_requests(agent_env, run.id)].count(0) == 1


# ------------------------------------------------------------------------ invoice


def test_invoice_on_a_worker(agent_env, operator, workers):
    workers.start(wait=True)
    run = start_example("examples.invoice", invoice_input(1))
    approve_when_asked(run.id, operator)
    assert_succeeded(wait_for_run(run.id, 60))
    (inv,) = objects(agent_env, "invoice", run.id)
    assert inv["status"] == "completed"
    assert len(emails(agent_env, run.id)) == 1


def test_invoice_survives_a_sigkill_while_its_email_is_sent(agent_env, operator, workers):
    admin(
        agent_env.sink_url,
        "POST",
        "/_admin/faults",
        {"fault": "slow", "stage": "data", "match": "billing2@", "seconds": 3},
    )
    first = workers.start(wait=True)
    run = start_example("examples.invoice", invoice_input(2))
    approve_when_asked(run.id, operator)
    wait_until(
        lambda: admin(agent_env.sink_url, "GET", "/_admin/stats")["faults_injected"].get("slow"),
        60,
        what="the invoice email to reach the sink",
    )
    workers.kill(first)  # the sink records the message after the sender died
    workers.start()
    assert_succeeded(wait_for_run(run.id, 90))
    assert len(emails(agent_env, run.id)) == 1
    (inv,) = objects(agent_env, "invoice", run.id)
    assert inv["status"] == "completed"
    assert worker_lost(run.id, "examples.invoices.send")


# -------------------------------------------------------------------- procurement


def test_procurement_escalates_and_closes_on_goods_received(agent_env, operator, workers):
    workers.start(wait=True)
    run = start_example("examples.procurement", procurement_input(1, approval_timeout_seconds=2))
    wait_until(
        lambda: (pending_approval(run.id) or None) and pending_approval(run.id).escalated_at,
        60,
        what="the approval to escalate to finance",
    )
    assert pending_approval(run.id).approver_group.name == "finance"
    decide(run.id, operator)
    wait_until(lambda: objects(agent_env, "order", run.id), 60, what="the order")
    durable.signal(run.id, "goods_received", {"note": "DN-1"})
    done = wait_for_run(run.id, 60)
    assert_succeeded(done)
    assert done.output_value()["status"] == "received"
    (pr,) = objects(agent_env, "purchase_request", run.id)
    assert pr["status"] == "closed"


def test_procurement_survives_a_sigkill_while_ordering(agent_env, operator, workers):
    admin(
        agent_env.payments_url,
        "POST",
        "/_admin/faults",
        {"fault": "slow", "seconds": 3, "path": "^/v1/orders$", "method": "POST"},
    )
    first = workers.start(wait=True)
    run = start_example("examples.procurement", procurement_input(2))
    durable.signal(run.id, "goods_received", {"note": "early"})  # kept in the mailbox
    approve_when_asked(run.id, operator)
    wait_until(lambda: requests_seen(agent_env, "/v1/orders"), 60, what="the order request")
    workers.kill(first)
    workers.start()
    done = wait_for_run(run.id, 90)
    assert_succeeded(done)
    assert len(objects(agent_env, "order", run.id)) == 1
    assert worker_lost(run.id, "examples.orders.place")
    assert done.output_value()["goods"] == {"note": "early"}
