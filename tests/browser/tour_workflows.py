"""Agents of a small web shop, for the dashboard tour (``test_tour.py``) and its pictures.

They read like the runs an operator meets (a refund agent waiting for approval, a triage
agent whose model provider rate-limited it, a ledger write whose outcome is unknown),
and run in the test process only (:func:`durable.testing.drive`). ``KNOBS`` make steps
fail a given number of times; :func:`reset` clears them.
"""

from __future__ import annotations

import durable
from durable import AmbiguousOutcomeError, PermanentError, RetryPolicy, TransientError

KNOBS: dict[str, int] = {"rate_limited": 0, "ledger_timeout": 0}

FAST_RETRY = RetryPolicy(max_attempts=5, initial_interval=0.01, jitter=False)


def reset() -> None:
    for name in KNOBS:
        KNOBS[name] = 0


# --- tools -----------------------------------------------------------------------------


@durable.tool(name="shop.crm.lookup", safety="read_only")
def crm_lookup(email: str) -> dict:
    """Find a customer by email."""
    return {"customer": "cus_8f2k", "email": email, "orders": 3, "lifetime_value": 412.50}


@durable.tool(
    name="shop.payments.refund",
    safety="unsafe_write",
    requires_approval=True,
    allow_edit=True,
    reconcile=lambda params, *, idempotency_key: durable.NOT_FOUND,
)
def refund(charge: str, amount: float, *, idempotency_key: str) -> dict:
    """Refund part of a card charge."""
    return {"refund": f"re_{charge[-4:]}", "amount": amount}


@durable.tool(
    name="shop.invoices.create",
    safety="idempotent_write",
    compensate=lambda params, result, *, idempotency_key: {"voided": result["id"]},
)
def create_invoice(customer: str, total: float, *, idempotency_key: str) -> dict:
    """Create an invoice (voided when compensated)."""
    return {"id": "in_1Q2w3E", "customer": customer, "total": total}


@durable.tool(
    name="shop.email.send",
    safety="idempotent_write",
    compensate=lambda params, result, *, idempotency_key: {"correction": result["id"]},
)
def send_email(to: str, subject: str, *, idempotency_key: str) -> dict:
    """Send an email (a correction follows when compensated)."""
    return {"id": f"<{idempotency_key[:8]}@shop.example>", "to": to}


@durable.tool(name="shop.ledger.post", safety="unsafe_write")
def ledger_post(account: str, amount: float, *, idempotency_key: str = "") -> dict:
    """Post an entry to the accounting ledger (no lookup: an operator reconciles)."""
    if KNOBS["ledger_timeout"] > 0:
        KNOBS["ledger_timeout"] -= 1
        raise AmbiguousOutcomeError("read timed out after 30 s; the entry may have been posted")
    return {"entry": "le_5521", "account": account, "amount": amount}


# --- steps -----------------------------------------------------------------------------


def _plan(message: str) -> dict:
    return {
        "intent": "refund",
        "charge": "ch_3PzK9aL",
        "amount": 24.90,
        "reason": f"customer says: {message}",
    }


def _classify(subject: str) -> dict:
    if KNOBS["rate_limited"] > 0:
        KNOBS["rate_limited"] -= 1
        raise TransientError(
            "429 Too Many Requests from the model provider <html>rate limit exceeded</html>"
        )
    return {"queue": "billing", "priority": "high", "subject": subject}


def _mark_complete(invoice: str) -> None:
    raise PermanentError(f"accounting API refused {invoice}: period 2024-12 is closed")


def _render(size: int) -> str:
    return "Weekly digest. " + "All quiet. " * (size // 11) + "<script>alert(1)</script> END"


# --- workflows -------------------------------------------------------------------------


@durable.workflow(name="shop.refund_agent", version="3")
def refund_agent(ctx, ticket):
    plan = ctx.step("plan", _plan, ticket["message"])
    ctx.call_tool("shop.crm.lookup", {"email": ticket["email"]})
    refunded = ctx.call_tool(
        "shop.payments.refund", {"charge": plan["charge"], "amount": plan["amount"]}
    )
    return {"refund": refunded}


@durable.workflow(name="shop.triage_agent", version="1")
def triage_agent(ctx, ticket):
    return ctx.step("classify", _classify, ticket["subject"], retry=FAST_RETRY)


@durable.workflow(name="shop.invoice_agent", version="2")
def invoice_agent(ctx, order):
    invoice = ctx.call_tool(
        "shop.invoices.create", {"customer": order["customer"], "total": order["total"]}
    )
    ctx.call_tool("shop.email.send", {"to": order["email"], "subject": "Your invoice"})
    ctx.step("mark_complete", _mark_complete, invoice["id"], retry=RetryPolicy(max_attempts=1))
    return invoice


@durable.workflow(name="shop.ledger_sync", version="1")
def ledger_sync(ctx, entry):
    return ctx.call_tool(
        "shop.ledger.post", {"account": entry["account"], "amount": entry["amount"]}
    )


@durable.workflow(name="shop.purchase_request", version="1")
def purchase_request(ctx, request):
    decision = ctx.wait_for_approval("purchase", title=f"Buy {request['item']}?", payload=request)
    return {"approved": decision.approved}


@durable.workflow(name="shop.restock_watch", version="1")
def restock_watch(ctx, data):
    return ctx.wait_for_signal("goods_received", timeout=7 * 86400, default=None)


@durable.workflow(name="shop.weekly_digest", version="1")
def weekly_digest(ctx, data):
    return ctx.step("render", _render, data["size"])


def _fetch_prices() -> dict:
    raise TransientError("503 Service Unavailable from the supplier's price feed")


@durable.workflow(name="shop.price_sync", version="1")
def price_sync(ctx, data):
    return ctx.step(
        "fetch_prices",
        _fetch_prices,
        retry=RetryPolicy(max_attempts=6, initial_interval=1800, jitter=False, max_interval=3600),
    )
