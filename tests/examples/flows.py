"""Helpers of the reference-agent tests: inputs, approvals and what the services saw."""

from __future__ import annotations

from typing import Any

import httpx

import durable
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from examples.procs import ServiceSet, admin

#: who the reference-agent runs are started by: a known requester, not the approving
#: operator (their approvals are four-eyes; an unknown starter would need two approvers)
REQUESTER = "os:test-requester"


def start_example(workflow: str, data: Any = None, **options: Any) -> Any:
    """``durable.start`` with a known requester (``REQUESTER``) unless one is given."""
    options.setdefault("started_by", REQUESTER)
    return durable.start(workflow, data, **options)


def support_input(n: int = 1, *, faults: str = "", charge: bool = True) -> dict[str, Any]:
    text = (
        f"Hello, I was charged twice for order #{1000 + n}. Please refund the duplicate "
        f"charge ch_test{n:04d} of $42.50."
        if charge
        else f"Hello, where is my order #{1000 + n}? It has not arrived."
    )
    return {
        "customer": f"Ann Lee {n}",
        "email": f"ann{n}@example.com",
        "message": f"{text} {faults}".strip(),
    }


def invoice_input(n: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "customer": f"ACME {n}",
        "email": f"billing{n}@acme.example",
        "currency": "usd",
        "lines": [
            {"description": "Consulting", "amount_cents": 120000},
            {"description": "Travel", "amount_cents": 8050},
        ],
        **extra,
    }


def procurement_input(n: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "requester": f"Bob {n}",
        "item": "Laptop",
        "quantity": 2,
        "amount_cents": 250000,
        "vendor": "Computers Inc",
        **extra,
    }


def pending_approval(run_id: str) -> ApprovalRequest | None:
    return ApprovalRequest.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).first()


def decide(run_id: str, user: Any, approve: bool = True, comment: str = "") -> ApprovalRequest:
    req = pending_approval(run_id)
    assert req is not None, f"run {run_id} has no pending approval"
    return approval_decide(request_id=req.pk, user=user, approve=approve, comment=comment)


def objects(services: ServiceSet, kind: str, run_id: str | None = None) -> list[dict]:
    data = admin(services.payments_url, "GET", f"/_admin/objects?kind={kind}")["data"]
    return [o for o in data if run_id is None or o["run_id"] == run_id]


def emails(services: ServiceSet, run_id: str | None = None) -> list[dict]:
    data = httpx.get(f"{services.sink_url}/messages", timeout=10).json()["data"]
    return [m for m in data if run_id is None or m["run_id"] == run_id]


def llm_requests(services: ServiceSet, run_id: str) -> list[dict]:
    return admin(services.llm_url, "GET", f"/_admin/requests?run={run_id}")["data"]
