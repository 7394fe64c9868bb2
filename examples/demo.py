"""Seeding the live demo of ``make up`` (``manage.py durable_demo --seed``).

Once the example services answer, it starts a handful of reference-agent runs with
stable ids (one set per day, so running it again finds the same runs) and brings them
to the states an operator should see at once on the dashboard:

- a support run whose refund waits for approval (approve it as admin, within three days);
- an invoice waiting for approval before it is sent;
- a procurement request waiting for approval (it escalates to finance after 3 days),
  and one that was approved and waits for its "goods received" signal;
- an invoice that FAILED when it was marked complete (the billing service refused it):
  compensate it to void the invoice and email the customer a correction;
- a support run whose refund was committed by the payments service but whose answer
  was lost while the service's lookup is down: an unknown outcome to reconcile;
- a support run that finished, labelled as having used the scripted LLM;
- with the agent-framework extras, a PydanticAI agent and an OpenAI Agents SDK agent
  (``examples/framework_agents.py``), each waiting for approval of its refund.

Faults are injected per run through the services' admin APIs; the approvals that lead
to the failed and the unknown-outcome runs are decided by a ``demo-operator`` user, so
the ones left pending are the admin's to decide.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Callable
from typing import Any

import httpx
from django.utils import timezone

import durable

from . import clients
from .chaos import APPROVER_GROUPS
from .workflows import FRAMEWORK_AGENTS

DEMO_OPERATOR = "demo-operator"
#: who the demo runs are started by: a known requester other than the approving operator
DEMO_REQUESTER = "os:demo-requester"
READY_TIMEOUT = 60.0
#: whether the LangGraph reference agent (durable[langgraph]) is there to seed
GRAPH_AGENT = importlib.util.find_spec("langgraph") is not None
SEED_TIMEOUT = 180.0
#: the demo runs of the agent-framework reference agents (when their extras are installed)
FRAMEWORK_LABELS = ("pydantic-ai-approval", "openai-agents-approval") if FRAMEWORK_AGENTS else ()


def _support(n: int, charge: bool = True, extra: str = "") -> dict[str, Any]:
    names = {1: "Ann Lee", 2: "Carlos Ruiz", 3: "Mei Chen", 4: "Omar Haddad"}
    name = names.get(n, f"Customer {n}")
    email = name.lower().replace(" ", ".") + "@example.com"
    text = (
        f"Hi, I was charged twice for my order #{4810 + n}. Could you refund the "
        f"duplicate charge ch_demo{n:03d} of $49.90? Thanks."
        if charge
        else f"Hello, my parcel for order #{4810 + n} has not arrived yet. Any news?"
    )
    return {"customer": name, "email": email, "message": f"{text} {extra}".strip()}


def _invoice(customer: str, email: str, amount: int) -> dict[str, Any]:
    return {
        "customer": customer,
        "email": email,
        "currency": "usd",
        "lines": [
            {"description": "Annual subscription", "amount_cents": amount},
            {"description": "Onboarding", "amount_cents": 25000},
        ],
    }


def _purchase(item: str, quantity: int, amount: int) -> dict[str, Any]:
    return {
        "requester": "Dana Scully",
        "item": item,
        "quantity": quantity,
        "amount_cents": amount,
        "vendor": "Acme Office Supply",
    }


def wait_for_services(log: Callable[[str], None], timeout: float = READY_TIMEOUT) -> None:
    """Block until the scripted LLM (if local), payments service and SMTP sink answer."""
    import os

    urls = [f"{clients.payments_url()}/health", f"{clients.sink_url()}/health"]
    base = os.environ.get("OPENAI_BASE_URL") or ""
    if base.startswith(("http://127.0.0.1", "http://localhost")):
        urls.append(base.rstrip("/").removesuffix("/v1") + "/health")
    deadline = time.monotonic() + timeout
    for url in urls:
        while True:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{url} did not answer within {timeout:g} s; are the "
                    "example services running (see the Procfile)?"
                )
            time.sleep(0.5)
    log("example services are up")


def _operator() -> Any:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    User = get_user_model()
    user, _ = User.objects.get_or_create(
        username=DEMO_OPERATOR, defaults={"email": "demo-operator@example.com"}
    )
    user.user_permissions.add(
        Permission.objects.get(codename="decide_approval", content_type__app_label="approvals")
    )
    for name in APPROVER_GROUPS:
        group, _ = Group.objects.get_or_create(name=name)
        user.groups.add(group)
    return User.objects.get(pk=user.pk)


def _fault(service_url: str, rule: dict[str, Any]) -> None:
    httpx.post(f"{service_url}/_admin/faults", json=rule, timeout=5).raise_for_status()


def seed(log: Callable[[str], None] = print, timeout: float = SEED_TIMEOUT) -> dict[str, str]:
    """Start the demo runs and bring them to their states; returns ``{label: run id}``."""
    from approvals.models import ApprovalRequest, ApprovalStatus
    from approvals.services import approval_decide
    from durable.models import TERMINAL, Run, RunStatus

    wait_for_services(log)
    day = f"{timezone.now():%Y%m%d}"
    ids = {
        label: f"demo-{label}-{day}"
        for label in (
            "refund-approval",
            "invoice-approval",
            "purchase-approval",
            "purchase-goods",
            "invoice-failed",
            "refund-unknown",
            "support-done",
            *FRAMEWORK_LABELS,
        )
    }
    if GRAPH_AGENT:
        ids["graph-refund-approval"] = f"demo-graph-refund-approval-{day}"
    payments = clients.payments_url()
    # faults first, so they are in place before a worker reaches them
    _fault(
        payments,
        {
            "fault": "401",
            "path": "/complete$",
            "method": "POST",
            "match": ids["invoice-failed"],
            "times": -1,
        },
    )
    _fault(
        payments,
        {
            "fault": "drop",
            "path": "^/v1/refunds$",
            "method": "POST",
            "match": ids["refund-unknown"],
            "times": 1,
        },
    )
    _fault(
        payments,
        {
            "fault": "503",
            "path": "^/v1/refunds$",
            "method": "GET",
            "match": ids["refund-unknown"],
            "times": -1,
            "retry_after": 30,
        },
    )
    starts = {
        "refund-approval": ("examples.support", _support(1)),
        "invoice-approval": (
            "examples.invoice",
            _invoice("Globex Corporation", "ap@globex.example", 480000),
        ),
        "purchase-approval": ("examples.procurement", _purchase("Standing desks", 6, 389400)),
        "purchase-goods": ("examples.procurement", _purchase("Laptops", 3, 567000)),
        "invoice-failed": (
            "examples.invoice",
            _invoice("Initech", "billing@initech.example", 120000),
        ),
        "refund-unknown": ("examples.support", _support(2)),
        "support-done": ("examples.support", _support(3, charge=False)),
    }
    if GRAPH_AGENT:  # the LangGraph reference agent, waiting for its refund's approval
        starts["graph-refund-approval"] = ("examples.refund_graph", _support(4))
    if FRAMEWORK_AGENTS:  # one waiting approval per agent framework
        starts["pydantic-ai-approval"] = (
            "examples.pydantic-refund",
            {"prompt": "Please refund order A-1", "message_history": None},
        )
        starts["openai-agents-approval"] = ("examples.openai-refund", "Please refund order B-7")
    for label, (workflow, data) in starts.items():
        try:
            durable.start(
                workflow,
                data,
                run_id=ids[label],
                tags=["demo"],
                max_tokens=50_000,
                started_by=DEMO_REQUESTER,
            )
        except durable.RunInputConflict as exc:
            log(f"skipping {label}: {exc}")
    log(f"started the demo runs: {', '.join(ids.values())}")

    operator = _operator()
    to_approve = {ids["purchase-goods"], ids["invoice-failed"], ids["refund-unknown"]}
    wanted = {
        "invoice-failed": {RunStatus.FAILED, RunStatus.COMPENSATING, RunStatus.COMPENSATED},
        "refund-unknown": {RunStatus.WAITING},
        "purchase-goods": {RunStatus.WAITING},
    }
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for req in ApprovalRequest.objects.filter(
            run_id__in=to_approve, status=ApprovalStatus.PENDING
        ):
            with contextlib.suppress(durable.DurableError):
                approval_decide(
                    request_id=req.pk,
                    user=operator,
                    approve=True,
                    comment="approved by the demo seeder",
                )
        decided = not ApprovalRequest.objects.filter(
            run_id__in=to_approve, status=ApprovalStatus.PENDING
        ).exists()
        states = dict(Run.objects.filter(pk__in=ids.values()).values_list("id", "status"))
        # reached, or already moved on (an operator acted on an earlier seeding)
        settled = decided and all(
            states.get(ids[label]) in statuses | set(TERMINAL) for label, statuses in wanted.items()
        )
        asked = [
            ids[label]
            for label in (
                "refund-approval",
                "invoice-approval",
                "purchase-approval",
                "graph-refund-approval",
                *FRAMEWORK_LABELS,
            )
            if label in ids
        ]
        waiting = all(
            ApprovalRequest.objects.filter(run_id=run_id).exists() or states.get(run_id) in TERMINAL
            for run_id in asked
        )
        if settled and waiting and states.get(ids["support-done"]) in TERMINAL:
            log("the demo is ready")
            return ids
        time.sleep(1)
    log(
        f"the demo runs did not all reach their states within {timeout:g} s (is the worker "
        "running?); they go on in the background"
    )
    return ids
