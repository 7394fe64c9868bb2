"""How the reference agents meet bad input and failing services (in-process runs).

The LLM path: 429 is transient and its Retry-After honoured, malformed tool-call JSON is
fed back to the model (bounded by the token budget), 401 is permanent. The services:
an SMTP server that refuses, a payments service that commits and drops the response,
rate limits, and a failed invoice compensated by voiding it and emailing a correction.
"""

from __future__ import annotations

import pytest

import durable
from durable.models import Operation, OperationStatus, RunStatus, Step, StepAttempt
from durable.testing import drive
from examples.mail import message_id_for
from examples.procs import admin
from tests.examples.flows import (
    decide,
    emails,
    invoice_input,
    llm_requests,
    objects,
    start_example,
    support_input,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def attempts(run_id: str, step_id: str) -> list[StepAttempt]:
    return list(
        StepAttempt.objects.filter(run_id=run_id, step__step_id=step_id).order_by("attempt")
    )


def step(run_id: str, step_id: str) -> Step:
    return Step.objects.get(run_id=run_id, step_id=step_id)


# ------------------------------------------------------------------------ the LLM


def test_llm_429_is_retried_after_its_retry_after(agent_env):
    data = support_input(1, charge=False, faults="[fault:429x2] [fault:retry_after=1.5]")
    run = drive(start_example("examples.support", data).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    failed = attempts(run.id, "plan")
    assert [(a.classification, a.outcome) for a in failed] == [("transient", "failed")] * 2
    assert all(a.retry_delay >= 1.5 for a in failed)  # never earlier than Retry-After
    assert "429" in failed[0].message
    assert [r["status"] for r in llm_requests(agent_env, run.id)] == [429, 429, 200, 200]
    assert step(run.id, "plan").attempts == 3


def test_malformed_tool_call_json_is_fed_back_to_the_model(agent_env):
    data = support_input(2, charge=False, faults="[fault:malformed_json]")
    run = drive(start_example("examples.support", data).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    first = step(run.id, "plan")
    assert first.error["classification"] == "model_recoverable"
    assert "not valid JSON" in first.error["message"]
    assert step(run.id, "plan#2").error is None
    asked = llm_requests(agent_env, run.id)
    assert [(r["turn"], r["feedbacks"]) for r in asked] == [(0, 0), (0, 1), (1, 1)]
    assert len(emails(agent_env, run.id)) == 1


def test_a_model_that_never_fixes_its_json_is_stopped_by_the_token_budget(agent_env):
    data = support_input(3, charge=False, faults="[fault:malformed_json_always]")
    run = drive(start_example("examples.support", data, max_tokens=1500).id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "BudgetExceeded"
    assert run.tokens_used >= 1500
    plans = Step.objects.filter(run_id=run.id, step_id__startswith="plan").count()
    assert 2 <= plans < 8  # the budget, not the loop's own limit, ended it
    assert objects(agent_env, "ticket", run.id) == []


def test_a_provider_down_for_a_while_releases_the_run_and_keeps_its_place(agent_env):
    data = support_input(14, charge=False, faults="[fault:503] [fault:retry_after=6]")
    run = drive(start_example("examples.support", data).id, wait_for_retries=False)
    # a Retry-After beyond the in-process limit: the worker is freed, the run waits
    assert run.status == RunStatus.RETRYING and run.wake_at is not None
    assert step(run.id, "plan").status == "retrying"
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    (failed,) = attempts(run.id, "plan")
    assert failed.classification == "transient" and failed.retry_delay >= 6


def test_llm_401_is_permanent_and_fails_the_run(agent_env):
    run = drive(start_example("examples.support", support_input(4, faults="[fault:401]")).id)
    assert run.status == RunStatus.FAILED
    (only,) = attempts(run.id, "plan")
    assert only.classification == "permanent"
    assert "401" in only.message
    assert len(llm_requests(agent_env, run.id)) == 1  # never retried


def test_unknown_tool_and_wrong_arguments_are_corrected_by_the_model(agent_env, operator):
    # arguments that do not fit the tool go back to the model before a person is asked:
    # the refund with wrong arguments is corrected first, then approved once
    for n, fault, approvals in ((5, "[fault:unknown_tool]", 1), (6, "[fault:wrong_args]", 1)):
        run = start_example("examples.support", support_input(n, faults=fault))
        done = drive(run.id)
        for _ in range(approvals):
            assert done.status == RunStatus.WAITING
            decide(run.id, operator)
            done = drive(run.id)
        assert done.status == RunStatus.SUCCEEDED, done.error
        refused = Step.objects.filter(run_id=run.id, error__classification="model_recoverable")
        assert refused.count() == 1
        assert len(objects(agent_env, "refund", run.id)) == 1
        from approvals.models import ApprovalRequest

        assert ApprovalRequest.objects.filter(run_id=run.id).count() == approvals


def test_a_malformed_customer_message_fails_with_a_clear_error(agent_env):
    run = drive(start_example("examples.support", {"customer": "X", "message": 42}).id)
    assert run.status == RunStatus.FAILED
    assert "'message' must be text" in run.error["message"]
    assert step(run.id, "read_message").error["classification"] == "permanent"


def test_a_rejected_refund_reaches_the_model_and_nothing_is_paid(agent_env, operator):
    run = start_example("examples.support", support_input(7))
    drive(run.id)
    decide(run.id, operator, approve=False, comment="not a duplicate")
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert objects(agent_env, "refund", run.id) == []
    assert "not a duplicate" in done.output_value()["summary"]


# ----------------------------------------------------------------------- the SMTP


def test_an_smtp_server_that_refuses_is_permanent_and_visible(agent_env):
    admin(
        agent_env.sink_url,
        "POST",
        "/_admin/faults",
        {"fault": "refuse", "stage": "rcpt", "match": "ann8@", "times": -1},
    )
    run = drive(start_example("examples.support", support_input(8, charge=False)).id)
    assert run.status == RunStatus.FAILED
    failed = step(run.id, "examples.email.send")
    assert failed.error["classification"] == "permanent"
    assert "550" in failed.error["message"]
    assert run.events.filter(kind="failed", message__contains="550").exists()
    op = Operation.objects.get(run_id=run.id, tool_name="examples.email.send")
    assert op.status == OperationStatus.FAILED  # known not to have happened
    assert emails(agent_env, run.id) == []


def test_an_smtp_tempfail_is_retried(agent_env):
    admin(
        agent_env.sink_url,
        "POST",
        "/_admin/faults",
        {"fault": "tempfail", "stage": "data", "match": "ann9@", "times": 1},
    )
    run = drive(start_example("examples.support", support_input(9, charge=False)).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [a.classification for a in attempts(run.id, "examples.email.send")] == ["transient"]
    assert len(emails(agent_env, run.id)) == 1


def test_a_dropped_smtp_reply_is_reconciled_by_message_id(agent_env):
    admin(
        agent_env.sink_url,
        "POST",
        "/_admin/faults",
        {"fault": "drop", "stage": "data", "match": "ann10@", "times": 1},
    )
    run = drive(start_example("examples.support", support_input(10, charge=False)).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    (sent,) = emails(agent_env, run.id)
    assert sent["message_id"] == message_id_for(f"{run.id}:examples.email.send")
    op = Operation.objects.get(run_id=run.id, tool_name="examples.email.send")
    assert op.resolution == "reconciled: happened"


# -------------------------------------------------------------- the payments service


def test_a_refund_committed_then_dropped_is_reconciled_not_repeated(agent_env, operator):
    admin(
        agent_env.payments_url,
        "POST",
        "/_admin/faults",
        {"fault": "drop", "path": "^/v1/refunds$", "method": "POST", "times": 1},
    )
    run = start_example("examples.support", support_input(11))
    drive(run.id)
    decide(run.id, operator)
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    (refund,) = objects(agent_env, "refund", run.id)
    op = Operation.objects.get(run_id=run.id, tool_name="examples.payments.refund")
    assert op.resolution == "reconciled: happened" and op.external_id == refund["id"]
    assert done.output_value()["refund"] == refund["id"]


def test_service_rate_limits_are_retried_and_401_is_permanent(agent_env):
    admin(
        agent_env.payments_url,
        "POST",
        "/_admin/faults",
        {"fault": "429", "path": "^/v1/tickets$", "times": 2, "retry_after": 1},
    )
    run = drive(start_example("examples.support", support_input(12, charge=False)).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    tries = attempts(run.id, "examples.tickets.create")
    assert [a.classification for a in tries] == ["transient", "transient"]
    assert all(a.retry_delay >= 1 for a in tries)
    assert len(objects(agent_env, "ticket", run.id)) == 1

    admin(
        agent_env.payments_url,
        "POST",
        "/_admin/faults",
        {"fault": "401", "path": "^/v1/tickets$", "times": -1},
    )
    run = drive(start_example("examples.support", support_input(13, charge=False)).id)
    assert run.status == RunStatus.FAILED
    assert [a.classification for a in attempts(run.id, "examples.tickets.create")] == ["permanent"]


# ------------------------------------------------------------------------ invoice


def test_a_failed_invoice_is_compensated_by_voiding_and_a_correction(agent_env, operator):
    admin(
        agent_env.payments_url,
        "POST",
        "/_admin/faults",
        {"fault": "401", "path": "/complete$", "times": -1},
    )
    run = start_example("examples.invoice", invoice_input(2))
    drive(run.id)
    decide(run.id, operator)
    failed = drive(run.id)
    assert failed.status == RunStatus.FAILED
    (inv,) = objects(agent_env, "invoice", run.id)
    assert inv["status"] == "open"
    durable.compensate(run.id, by=operator, reason="the invoice could not be completed")
    done = drive(run.id)
    assert done.status == RunStatus.COMPENSATED, done.error
    (inv,) = objects(agent_env, "invoice", run.id)
    assert inv["status"] == "void"
    subjects = sorted(m["subject"] for m in emails(agent_env, run.id))
    assert subjects == [f"Correction: invoice {inv['number']} is void", f"Invoice {inv['number']}"]
    # compensating again does nothing twice
    assert drive(run.id).status == RunStatus.COMPENSATED
    assert len(emails(agent_env, run.id)) == 2


def test_a_rejected_invoice_is_voided_and_never_sent(agent_env, operator):
    run = start_example("examples.invoice", invoice_input(3))
    drive(run.id)
    decide(run.id, operator, approve=False, comment="wrong amount")
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED
    assert done.output_value()["status"] == "voided"
    (inv,) = objects(agent_env, "invoice", run.id)
    assert inv["status"] == "void"
    assert emails(agent_env, run.id) == []
