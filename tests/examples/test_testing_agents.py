"""The tutorial of docs/testing-agents.md, run: the support agent (``examples.support``)
tested with Durable's pytest plugin. The page shows this file's code, and
``tests/test_docs.py`` fails when the two part ways."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

import durable
from durable.models import RunStatus
from durable.services.export import export_run
from durable.testing import replay


class FakePayments:
    """The payments service, in memory. Like a real one it does not deduplicate by
    itself: a refund sent twice is two refunds."""

    def __init__(self):
        self.refunds = []

    def refund(self, charge_id, amount_cents, reason="", currency="usd", *, idempotency_key):
        refund = {
            "id": f"re_{len(self.refunds) + 1}",
            "charge_id": charge_id,
            "amount_cents": amount_cents,
            "key": idempotency_key,
        }
        self.refunds.append(refund)
        return refund

    def find_refund(self, params, *, idempotency_key):
        """The tool's reconcile: the refund this key made, if any."""
        found = [r for r in self.refunds if r["key"] == idempotency_key]
        return found[0] if found else durable.NOT_FOUND


@pytest.fixture
def payments(durable_env):
    fake = FakePayments()
    durable_env.stub_tool("examples.payments.refund", fake.refund, reconcile=fake.find_refund)
    durable_env.stub_tool(
        "examples.tickets.create",
        lambda customer, subject, *, idempotency_key, **rest: {"id": "tk_1"},
    )
    durable_env.stub_tool(
        "examples.email.send",
        lambda to, subject, body, *, idempotency_key: {"message_id": "<m1@test>"},
    )
    return fake


MESSAGE = {
    "customer": "Ann Lee",
    "email": "ann@example.com",
    "message": "I was charged twice for order #1001: please refund ch_1 ($42.50).",
}


def plan(durable_llm):
    """What the model answers: first a plan of four tool calls, then a summary."""
    durable_llm.reply(
        tool_calls=[
            {"name": "kb_search", "arguments": {"query": "duplicate charge"}},
            {
                "name": "tickets_create",
                "arguments": {"customer": "Ann Lee", "subject": "Charged twice"},
            },
            {"name": "payments_refund", "arguments": {"charge_id": "ch_1", "amount_cents": 4250}},
            {
                "name": "email_send",
                "arguments": {
                    "to": "ann@example.com",
                    "subject": "Your refund",
                    "body": "Refunded.",
                },
            },
        ]
    )
    durable_llm.reply("Refunded $42.50 on ch_1 and emailed Ann.")


def test_a_refund_is_approved_and_made_once(durable_env, durable_llm, durable_approvals, payments):
    plan(durable_llm)
    run = durable_env.start("examples.support", MESSAGE)

    run = durable_env.run(run)  # plans, searches, opens the ticket, then waits
    assert run.status == RunStatus.WAITING
    assert payments.refunds == []  # nothing leaves before a support lead says yes

    durable_approvals.approve(run, comment="duplicate charge confirmed")
    run = durable_env.run(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["summary"] == "Refunded $42.50 on ch_1 and emailed Ann."
    [refund] = durable_env.tool_calls("examples.payments.refund")
    assert refund.params == {"charge_id": "ch_1", "amount_cents": 4250}
    assert refund.idempotency_key == f"{run.id}:examples.payments.refund"
    assert len(durable_llm.requests) == 2  # the plan and the summary, each asked once


def test_a_refund_nobody_approves_is_rejected_after_three_days(
    durable_env, durable_llm, durable_approvals, payments
):
    plan(durable_llm)
    run = durable_env.run(durable_env.start("examples.support", MESSAGE))
    assert run.status == RunStatus.WAITING

    durable_env.advance(timedelta(days=2))  # two days pass: still waiting
    assert durable_env.run(run).status == RunStatus.WAITING

    durable_env.advance(timedelta(days=1))  # the third day: the deadline rejects it
    run = durable_env.run(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert payments.refunds == []
    assert durable_env.tool_calls("examples.email.send") == []  # skipped after the rejection
    turn = durable_llm.requests[-1].messages  # what the model was told
    rejected = [json.loads(m["content"]) for m in turn if m["role"] == "tool"]
    assert any(r.get("error", {}).get("type") == "ApprovalRejected" for r in rejected)
    with pytest.raises(LookupError):
        durable_approvals.approve(run)  # nothing is pending any more


def test_a_crash_after_the_refund_is_made_does_not_refund_twice(
    durable_env, durable_llm, durable_approvals, payments
):
    plan(durable_llm)
    run = durable_env.run(durable_env.start("examples.support", MESSAGE))
    durable_approvals.approve(run)

    # the worker dies after the payments service refunded, before Durable recorded it
    durable_env.crash_at("examples.payments.refund", "after_effect")
    run = durable_env.run(run)  # the lease runs out; a fresh worker resumes the run

    assert [c.point for c in durable_env.crashes] == ["after_effect"]
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(payments.refunds) == 1  # found by its key (reconcile), not sent again
    assert durable_env.idempotency_keys("examples.payments.refund") == [
        f"{run.id}:examples.payments.refund"
    ]


def support_v2(ctx, data):
    """A change that would break runs in flight: a fraud check before the plan."""
    request = ctx.step("read_message", lambda d: d, data)
    ctx.step("check_fraud", lambda r: "ok", request)
    return ctx.llm([{"role": "user", "content": request["message"]}], step_id="plan")


def test_the_new_code_would_not_resume_a_waiting_refund(
    durable_env, durable_llm, durable_approvals, payments
):
    plan(durable_llm)
    run = durable_env.run(durable_env.start("examples.support", MESSAGE))
    export = export_run(run.id)  # what `manage.py durable export RUN_ID` writes

    assert replay(export).compatible  # the code installed now resumes it
    report = replay(export, workflow=support_v2)
    assert not report.compatible
    assert report.divergence.got["step_id"] == "check_fraud"
