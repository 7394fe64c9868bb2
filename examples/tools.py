"""The reference agents' tools: real HTTP and SMTP, each with its safety class.

Tool names carry the app's prefix (``examples.email.send``), as ``examples.hello``'s
tool does: the ``examples`` app is installed by default, and a project's own
``email.send`` must not collide with it. The LLM sees them under function names
without dots (``email_send``), as OpenAI's function-name pattern requires.

| tool | safety | how an unknown outcome is settled |
| --- | --- | --- |
| ``kb.search`` | read_only | repeated |
| ``tickets.create`` | idempotent_write | repeated with the same Idempotency-Key |
| ``payments.refund`` | unsafe_write, requires approval | looked up by its key |
| ``email.send`` | unsafe_write | looked up by its Message-ID in the mail system |
| ``invoices.create`` | idempotent_write (compensate: void) | repeated with the same key |
| ``invoices.send`` | unsafe_write (compensate: void, email a correction) | Message-ID |
| ``invoices.complete`` / ``invoices.void`` | idempotent_write | repeated |
| ``procurement.submit`` / ``procurement.close`` | idempotent_write | repeated |
| ``orders.place`` | unsafe_write | looked up by its key |

Every write sends the engine's idempotency key (``"{run_id}:{step_id}"``) as the
``Idempotency-Key`` header or derives the email's Message-ID from it.
"""

from __future__ import annotations

import re
from typing import Any

import durable

from . import clients, mail

#: retries of the service calls: transient errors (429, 503, 409, a refused connection)
#: back off from 0.5 s to 8 s; an unsafe write's ambiguous error is reconciled first
SERVICE_RETRY = durable.RetryPolicy(
    max_attempts=8, initial_interval=0.5, backoff_coefficient=2.0, max_interval=8.0
)


def _by_key(collection: str):
    def reconcile(params: dict[str, Any], *, idempotency_key: str) -> Any:
        found = clients.find_by_key(collection, idempotency_key)
        return found if found is not None else durable.NOT_FOUND

    reconcile.__name__ = f"find_{collection}_by_key"
    return reconcile


def _object_id(result: Any) -> str:
    return (
        str(result.get("id") or result.get("message_id") or "") if isinstance(result, dict) else ""
    )


# ----------------------------------------------------------------- support agent

KB = [
    {
        "id": "kb-101",
        "title": "Refunds for duplicate charges",
        "text": "When a customer was charged twice for the same order, refund the duplicate "
        "charge in full. Refunds need a support lead's approval and reach the card in "
        "5-10 business days.",
    },
    {
        "id": "kb-102",
        "title": "Delivery delays",
        "text": "Orders ship within 2 business days. Tracking links are emailed when the "
        "parcel leaves the warehouse.",
    },
    {
        "id": "kb-103",
        "title": "Changing the billing address",
        "text": "Customers can change their billing address under Account > Billing; "
        "invoices already issued keep the old address.",
    },
    {
        "id": "kb-104",
        "title": "Cancelling an order",
        "text": "An order can be cancelled until it ships; after that, use a return.",
    },
]


@durable.tool(name="examples.kb.search", safety="read_only")
def kb_search(query: str, limit: int = 3) -> dict[str, Any]:
    """Search the help-center articles (read-only)."""
    words = {w for w in re.findall(r"[a-z]{3,}", str(query).lower())}
    scored = []
    for article in KB:
        text = (article["title"] + " " + article["text"]).lower()
        score = sum(1 for w in words if w in text)
        if score:
            scored.append((score, article))
    scored.sort(key=lambda pair: -pair[0])
    return {
        "query": str(query)[:200],
        "articles": [a for _, a in scored[: max(1, min(int(limit), 10))]],
    }


@durable.tool(
    name="examples.tickets.create",
    safety="idempotent_write",
    retry=SERVICE_RETRY,
    reconcile=_by_key("tickets"),
    external_id=_object_id,
)
def tickets_create(
    customer: str,
    subject: str,
    body: str = "",
    email: str = "",
    priority: str = "normal",
    *,
    idempotency_key: str,
) -> dict[str, Any]:
    """Open a support ticket (idempotent: the same key returns the same ticket)."""
    return clients.payments(
        "POST",
        "/v1/tickets",
        idempotency_key=idempotency_key,
        json={
            "customer": customer,
            "email": email,
            "subject": subject,
            "body": body,
            "priority": priority,
        },
    )


#: how long a refund waits for a support lead before it is rejected (seconds)
REFUND_APPROVAL_TIMEOUT = 3 * 24 * 3600.0


@durable.tool(
    name="examples.payments.refund",
    safety="unsafe_write",
    requires_approval=True,
    approver_group="support-leads",
    approval_timeout=REFUND_APPROVAL_TIMEOUT,  # then rejected (approval_on_timeout)
    retry=SERVICE_RETRY,
    reconcile=_by_key("refunds"),
    external_id=_object_id,
)
def payments_refund(
    charge_id: str,
    amount_cents: int,
    reason: str = "",
    currency: str = "usd",
    *,
    idempotency_key: str,
) -> dict[str, Any]:
    """Refund (part of) a charge. Money leaves: a support lead approves it first, within
    three days, or the refund is rejected."""
    return clients.payments(
        "POST",
        "/v1/refunds",
        idempotency_key=idempotency_key,
        json={
            "charge_id": charge_id,
            "amount_cents": amount_cents,
            "currency": currency,
            "reason": reason,
        },
    )


@durable.tool(
    name="examples.email.send",
    safety="unsafe_write",
    retry=SERVICE_RETRY,
    reconcile=mail.find_sent,
    external_id=_object_id,
)
def email_send(to: str, subject: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    """Email a customer (SMTP). Reconciled by the Message-ID derived from the key."""
    return mail.send(to, subject, body, idempotency_key=idempotency_key)


# ----------------------------------------------------------------------- invoice


def _void(params: dict[str, Any], result: Any, *, idempotency_key: str) -> Any:
    """Compensation of ``invoices.create``: void the invoice (idempotent)."""
    return clients.payments(
        "POST", f"/v1/invoices/{result['id']}/void", idempotency_key=idempotency_key, json={}
    )


def _void_and_correct(params: dict[str, Any], result: Any, *, idempotency_key: str) -> Any:
    """Compensation of ``invoices.send``: void the invoice, email a correction (once)."""
    voided = clients.payments(
        "POST",
        f"/v1/invoices/{params['invoice_id']}/void",
        idempotency_key=f"{idempotency_key}:void",
        json={},
    )
    sent = mail.send_once(
        params["to"],
        f"Correction: invoice {params['number']} is void",
        f"Hello {params.get('customer') or ''},\n\ninvoice {params['number']} that we sent "
        "you has been voided; please disregard it. We will send a corrected invoice if one "
        "is due.\n\nAccounts receivable",
        idempotency_key=idempotency_key,
    )
    return {"voided": voided["id"], "status": voided["status"], "correction": sent}


@durable.tool(
    name="examples.invoices.create",
    safety="idempotent_write",
    retry=SERVICE_RETRY,
    reconcile=_by_key("invoices"),
    compensate=_void,
    external_id=_object_id,
)
def invoices_create(
    customer: str,
    email: str,
    lines: list[dict[str, Any]],
    currency: str = "usd",
    *,
    idempotency_key: str,
) -> dict[str, Any]:
    """Create an open invoice (idempotent by key)."""
    return clients.payments(
        "POST",
        "/v1/invoices",
        idempotency_key=idempotency_key,
        json={"customer": customer, "email": email, "lines": lines, "currency": currency},
    )


@durable.tool(
    name="examples.invoices.send",
    safety="unsafe_write",
    retry=SERVICE_RETRY,
    reconcile=mail.find_sent,
    compensate=_void_and_correct,
    external_id=_object_id,
)
def invoices_send(
    invoice_id: str,
    number: str,
    to: str,
    customer: str,
    total_cents: int,
    currency: str = "usd",
    *,
    idempotency_key: str,
) -> dict[str, Any]:
    """Email the invoice to the customer (reconciled by Message-ID)."""
    body = (
        f"Hello {customer},\n\nplease find invoice {number} for "
        f"{total_cents / 100:,.2f} {currency.upper()} (id {invoice_id}).\n\n"
        "Accounts receivable"
    )
    sent = mail.send(
        to,
        f"Invoice {number}",
        body,
        idempotency_key=idempotency_key,
        extra_headers={"X-Invoice": invoice_id},
    )
    return {**sent, "invoice_id": invoice_id}


@durable.tool(name="examples.invoices.complete", safety="idempotent_write", retry=SERVICE_RETRY)
def invoices_complete(invoice_id: str, *, idempotency_key: str) -> dict[str, Any]:
    """Mark the invoice complete."""
    return clients.payments(
        "POST", f"/v1/invoices/{invoice_id}/complete", idempotency_key=idempotency_key, json={}
    )


@durable.tool(name="examples.invoices.void", safety="idempotent_write", retry=SERVICE_RETRY)
def invoices_void(invoice_id: str, *, idempotency_key: str) -> dict[str, Any]:
    """Void an invoice that must not be sent."""
    return clients.payments(
        "POST", f"/v1/invoices/{invoice_id}/void", idempotency_key=idempotency_key, json={}
    )


# ------------------------------------------------------------------- procurement


@durable.tool(
    name="examples.procurement.submit",
    safety="idempotent_write",
    retry=SERVICE_RETRY,
    reconcile=_by_key("purchase_requests"),
    external_id=_object_id,
)
def procurement_submit(
    requester: str,
    item: str,
    quantity: int,
    amount_cents: int,
    vendor: str,
    *,
    idempotency_key: str,
) -> dict[str, Any]:
    """Record a purchase request."""
    return clients.payments(
        "POST",
        "/v1/purchase_requests",
        idempotency_key=idempotency_key,
        json={
            "requester": requester,
            "item": item,
            "quantity": quantity,
            "amount_cents": amount_cents,
            "vendor": vendor,
        },
    )


@durable.tool(
    name="examples.orders.place",
    safety="unsafe_write",
    retry=SERVICE_RETRY,
    reconcile=_by_key("orders"),
    external_id=_object_id,
)
def orders_place(
    purchase_request: str,
    vendor: str,
    item: str,
    quantity: int,
    amount_cents: int,
    *,
    idempotency_key: str,
) -> dict[str, Any]:
    """Place the order with the vendor (reconciled by key)."""
    return clients.payments(
        "POST",
        "/v1/orders",
        idempotency_key=idempotency_key,
        json={
            "purchase_request": purchase_request,
            "vendor": vendor,
            "item": item,
            "quantity": quantity,
            "amount_cents": amount_cents,
        },
    )


@durable.tool(name="examples.procurement.close", safety="idempotent_write", retry=SERVICE_RETRY)
def procurement_close(
    purchase_request: str, outcome: str, *, idempotency_key: str
) -> dict[str, Any]:
    """Close the purchase request with its outcome."""
    return clients.payments(
        "POST",
        f"/v1/purchase_requests/{purchase_request}/close",
        idempotency_key=idempotency_key,
        json={"outcome": outcome},
    )
