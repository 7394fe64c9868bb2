"""Sample workflows, discovered automatically because ``examples`` is an installed app.

``examples.support``, ``examples.invoice`` and ``examples.procurement`` are the reference
agents (below ``examples.hello``); their tools are in ``examples/tools.py``. With the
``pydantic-ai`` and ``openai-agents`` extras, ``examples/framework_agents.py`` adds
``examples.pydantic-refund`` and ``examples.openai-refund``.

``examples.hello`` is the run that ``make up`` (``manage.py durable_demo``) starts: two
memoized steps and one read-only tool call, fast and deterministic, so a fresh checkout
shows a completed run with its steps in the admin and the dashboard.
"""

from __future__ import annotations

import importlib.util
import json
import re
from typing import Any

import durable
from durable import conf as durable_conf
from durable.registry import lazy_module

from . import tools as _tools  # noqa: F401 - registers the reference agents' tools

# The framework agents cost seconds of imports (LangGraph, PydanticAI, the OpenAI Agents
# SDK): declared here, each module is imported at the first lookup of one of its names
# (a worker's first run of it) or the first listing of the registry, so neither a CLI
# command nor a worker's start pays for them (durable.registry.lazy_module). A worker
# that lists its modules instead (DURABLE_AUTODISCOVER=false) names
# examples.langgraph_agent or examples.framework_agents when it serves them.
_WITH_FRAMEWORKS = bool(durable_conf.get("AUTODISCOVER"))
if _WITH_FRAMEWORKS and importlib.util.find_spec("langgraph") is not None:  # the extra
    lazy_module("examples.langgraph_agent", workflows=["examples.refund_graph"])
# the agent-framework reference agents need the pydantic-ai and openai-agents extras
FRAMEWORK_AGENTS = all(importlib.util.find_spec(m) for m in ("pydantic_ai", "agents"))
if _WITH_FRAMEWORKS and FRAMEWORK_AGENTS:
    lazy_module(
        "examples.framework_agents",
        workflows=["examples.pydantic-refund", "examples.openai-refund"],
        tools=["examples.orders.refund"],
    )

GREETINGS = {"en": "Hello", "fr": "Bonjour", "de": "Hallo", "es": "Hola", "it": "Ciao"}


@durable.tool(name="examples.lookup_greeting", safety="read_only")
def lookup_greeting(language: str = "en") -> dict[str, str]:
    """Look up the greeting word for a language (read-only: safe to repeat)."""
    code = (language or "en").strip().lower()[:2]
    if code not in GREETINGS:
        code = "en"
    return {"language": code, "greeting": GREETINGS[code]}


def normalize_name(name: Any) -> str:
    """Trim and title-case the name; an empty name becomes "world"."""
    text = " ".join(str(name or "").split())
    return text.title() if text else "world"


def compose(greeting: str, name: str) -> str:
    return f"{greeting}, {name}!"


@durable.workflow(name="examples.hello", version="1")
def hello(ctx, data):
    """Greet someone: normalize the name, look up a greeting (a tool), compose the message."""
    data = data or {}
    name = ctx.step("normalize_name", normalize_name, data.get("name"))
    found = ctx.call_tool("examples.lookup_greeting", {"language": data.get("language", "en")})
    message = ctx.step("compose", compose, found["greeting"], name)
    return {"message": message, "language": found["language"]}


# =============================================================== reference agents
#
# Three agents taken from the failure stories Durable is built for. Their tools
# (examples/tools.py) speak real protocols to real processes: the payments service
# (HTTP, Stripe's idempotency contract), the SMTP sink (SMTP) and any OpenAI-compatible
# LLM endpoint (the scripted local one in development and tests).

#: the support agent's tools, in the OpenAI function-calling format
SUPPORT_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "kb_search",
            "description": "Search the help-center articles.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "tickets_create",
            "description": "Open a support ticket for the customer.",
            "parameters": {
                "type": "object",
                "properties": {
                    "customer": {"type": "string"},
                    "email": {"type": "string"},
                    "subject": {"type": "string"},
                    "body": {"type": "string"},
                    "priority": {"type": "string", "enum": ["low", "normal", "high", "urgent"]},
                },
                "required": ["customer", "subject"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "payments_refund",
            "description": "Refund a charge the customer should not have paid (a person "
            "approves it first). Amounts in cents.",
            "parameters": {
                "type": "object",
                "properties": {
                    "charge_id": {"type": "string", "description": "ch_..."},
                    "amount_cents": {"type": "integer"},
                    "reason": {"type": "string"},
                },
                "required": ["charge_id", "amount_cents"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "email_send",
            "description": "Email the customer.",
            "parameters": {
                "type": "object",
                "properties": {
                    "to": {"type": "string"},
                    "subject": {"type": "string"},
                    "body": {"type": "string"},
                },
                "required": ["to", "subject", "body"],
            },
        },
    },
]
#: LLM function name -> registered tool (OpenAI function names may not contain dots)
SUPPORT_TOOL_NAMES = {
    "kb_search": "examples.kb.search",
    "tickets_create": "examples.tickets.create",
    "payments_refund": "examples.payments.refund",
    "email_send": "examples.email.send",
}
#: model calls one support run may make (the token budget usually ends it sooner)
SUPPORT_MAX_LLM_CALLS = 8
#: the first words of the message that feeds an unusable model reply back to the model
FEEDBACK_PREFIX = "Your previous reply could not be used"
SUPPORT_SYSTEM_PROMPT = (
    "You are the support agent of Example Shop. Read the customer's message and act: "
    "search the knowledge base, open a ticket, refund a charge the customer was billed "
    "twice for (a support lead approves refunds), and email the customer. Call tools with "
    "JSON arguments. When every tool has answered, reply with a short summary for the "
    "support team.\n"
    "durable-script: support\n"
    "run: {run_id}"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_EMAIL = re.compile(r"^[\w.+\-]+@[\w\-]+(\.[\w\-]+)+$")
MAX_MESSAGE_CHARS = 4000


def read_customer_message(data: Any) -> dict[str, str]:
    """Validate and normalise the support input ``{"customer", "email", "message"}``.

    Raises :class:`durable.PermanentError` saying what is wrong: a message that is not
    text or is empty cannot be handled by retrying. Control characters are removed and
    the message is cut to 4,000 characters; an invalid email address is dropped (the
    agent then does not email).
    """
    if not isinstance(data, dict):
        raise durable.PermanentError(
            f"the support input must be a JSON object with 'message', got "
            f"{type(data).__name__}; start the run again with "
            '{"customer": ..., "email": ..., "message": ...}'
        )
    message = data.get("message")
    if not isinstance(message, str):
        raise durable.PermanentError(f"'message' must be text, got {type(message).__name__}")
    message = _CONTROL.sub("", message).strip()[:MAX_MESSAGE_CHARS]
    if not message:
        raise durable.PermanentError("'message' is empty: there is nothing to answer")
    customer = _CONTROL.sub("", str(data.get("customer") or "")).strip()[:200] or "customer"
    email = str(data.get("email") or "").strip()
    return {"customer": customer, "email": email if _EMAIL.match(email) else "", "message": message}


@durable.workflow(name="examples.support", version="1")
def support(ctx, data):
    """Support agent: the LLM plans from a customer message, the tools act, the LLM sums up.

    The plan is one recorded ``ctx.llm`` step ("plan"): a replay after a crash reads it
    back instead of asking the model again. Tool errors the model can fix (an unknown
    tool, wrong arguments, a rejected refund) go back to it as tool results; an
    unusable reply (malformed tool-call JSON) goes back as a message. The run's token
    budget bounds how often. Once a person rejects a call of a turn, the turn's later
    writes are not run: each goes back to the model as a skipped call.
    """
    request = ctx.step("read_message", read_customer_message, data)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SUPPORT_SYSTEM_PROMPT.format(run_id=ctx.run_id)},
        {
            "role": "user",
            "content": f"Customer: {request['customer']} <{request['email']}>\n"
            f"Message:\n{request['message']}",
        },
    ]
    done: dict[str, Any] = {"ticket": None, "refund": None, "email": None}
    planned = False
    for _ in range(SUPPORT_MAX_LLM_CALLS):
        reply = ctx.llm(messages, tools=SUPPORT_TOOLS, step_id="turn" if planned else "plan")
        if isinstance(reply, durable.ModelRecoverable):
            messages.append(
                {
                    "role": "user",
                    "content": (
                        f"{FEEDBACK_PREFIX}: {reply.message}. Send your tool calls again, each "
                        "with a JSON object as its arguments."
                    ),
                }
            )
            continue
        planned = True
        if not reply["tool_calls"]:
            return {**done, "summary": reply["content"] or "", "status": "answered"}
        messages.append(
            {
                "role": "assistant",
                "content": reply["content"],
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                    }
                    for c in reply["tool_calls"]
                ],
            }
        )
        # reads run in parallel, writes one by one in the model's order; once a person
        # rejects a call of the turn, the turn's later writes were planned on the
        # assumption it would go through, so they are not run but reported as skipped
        # (tests/examples/test_turns_inprocess.py)
        answers = ctx.run_tool_calls(reply["tool_calls"], names=SUPPORT_TOOL_NAMES)
        for call, answer in zip(reply["tool_calls"], answers, strict=True):
            result = json.loads(answer["content"]).get("result")
            key = {
                "tickets_create": "ticket",
                "payments_refund": "refund",
                "email_send": "email",
            }.get(call["name"])
            if key and isinstance(result, dict):
                done[key] = result.get("id") or result.get("message_id")
        messages.extend(answers)
    raise durable.PermanentError(
        f"the agent did not finish within {SUPPORT_MAX_LLM_CALLS} model calls"
    )


# ---------------------------------------------------------------------- invoice


def read_invoice_request(data: Any) -> dict[str, Any]:
    """Validate ``{"customer", "email", "lines": [{"description", "amount_cents"}],
    "currency"}``; raises :class:`durable.PermanentError`."""
    if not isinstance(data, dict):
        raise durable.PermanentError("the invoice input must be a JSON object")
    lines = data.get("lines")
    if not isinstance(lines, list) or not lines:
        raise durable.PermanentError("'lines' must be a non-empty list")
    clean = []
    for line in lines:
        if not isinstance(line, dict) or not isinstance(line.get("amount_cents"), int):
            raise durable.PermanentError(
                "each line needs a 'description' and an integer 'amount_cents'"
            )
        clean.append(
            {
                "description": str(line.get("description") or "item")[:300],
                "amount_cents": line["amount_cents"],
            }
        )
    email = str(data.get("email") or "").strip()
    if not _EMAIL.match(email):
        raise durable.PermanentError(f"'email' is not an email address: {email!r}")
    timeout = data.get("approval_timeout_seconds")
    return {
        "customer": str(data.get("customer") or "").strip()[:200] or "customer",
        "email": email,
        "lines": clean,
        "currency": str(data.get("currency") or "usd").lower()[:3],
        "approval_timeout": float(timeout) if timeout else None,
    }


@durable.workflow(name="examples.invoice", version="1")
def invoice(ctx, data):
    """Invoice: create it, wait for approval before sending, email it, mark it complete.

    A rejected approval voids the invoice. Compensating a failed run voids the invoice
    and emails the customer a correction (the ``compensate`` hooks of the tools).
    """
    order = ctx.step("read_request", read_invoice_request, data)
    inv = ctx.call_tool(
        "examples.invoices.create",
        {
            "customer": order["customer"],
            "email": order["email"],
            "lines": order["lines"],
            "currency": order["currency"],
        },
    )
    if isinstance(inv, durable.ModelRecoverable):
        raise durable.PermanentError(f"the billing service refused the invoice: {inv.message}")
    total = f"{inv['total_cents'] / 100:,.2f} {inv['currency'].upper()}"
    decision = ctx.wait_for_approval(
        "send-invoice",
        title=f"Send invoice {inv['number']} ({total}) to {order['email']}?",
        payload={
            "invoice": inv["id"],
            "number": inv["number"],
            "customer": order["customer"],
            "email": order["email"],
            "total": total,
            "lines": order["lines"],
        },
        approvers="billing",
        timeout=order["approval_timeout"],
        on_timeout="reject",
        four_eyes=True,
    )  # money leaves with the invoice: whoever asked may not approve
    if not decision.approved:
        ctx.call_tool("examples.invoices.void", {"invoice_id": inv["id"]})
        return {
            "invoice": inv["id"],
            "number": inv["number"],
            "status": "voided",
            "decided_by": list(decision.decided_by),
            "comment": decision.comment,
        }
    sent = ctx.call_tool(
        "examples.invoices.send",
        {
            "invoice_id": inv["id"],
            "number": inv["number"],
            "to": order["email"],
            "customer": order["customer"],
            "total_cents": inv["total_cents"],
            "currency": inv["currency"],
        },
    )
    if isinstance(sent, durable.ModelRecoverable):
        raise durable.PermanentError(f"the invoice email was refused: {sent.message}")
    done = ctx.call_tool("examples.invoices.complete", {"invoice_id": inv["id"]})
    if isinstance(done, durable.ModelRecoverable):
        raise durable.PermanentError(f"the invoice could not be completed: {done.message}")
    return {
        "invoice": inv["id"],
        "number": inv["number"],
        "status": done["status"],
        "email": sent["message_id"],
        "approved_by": list(decision.decided_by),
    }


# ------------------------------------------------------------------ procurement

THREE_DAYS = 3 * 24 * 3600.0
THIRTY_DAYS = 30 * 24 * 3600.0


def read_purchase_request(data: Any) -> dict[str, Any]:
    """Validate ``{"requester", "item", "quantity", "amount_cents", "vendor"}`` (and the
    optional ``approval_timeout_seconds``, ``goods_timeout_seconds``)."""
    if not isinstance(data, dict):
        raise durable.PermanentError("the purchase request must be a JSON object")
    for name in ("quantity", "amount_cents"):
        if not isinstance(data.get(name), int) or data[name] < 1:
            raise durable.PermanentError(f"'{name}' must be a positive whole number")
    for name in ("requester", "item", "vendor"):
        if not isinstance(data.get(name), str) or not data[name].strip():
            raise durable.PermanentError(f"'{name}' must be non-empty text")
    return {
        "requester": data["requester"].strip()[:200],
        "item": data["item"].strip()[:300],
        "vendor": data["vendor"].strip()[:200],
        "quantity": data["quantity"],
        "amount_cents": data["amount_cents"],
        "approval_timeout": float(data.get("approval_timeout_seconds") or THREE_DAYS),
        "goods_timeout": float(data.get("goods_timeout_seconds") or THIRTY_DAYS),
    }


@durable.workflow(name="examples.procurement", version="1")
def procurement(ctx, data):
    """Procurement: submit a request, wait up to 3 days for approval (then the request
    escalates to finance for 3 more), place the order, wait for "goods_received", close.

    The approval is four-eyes: neither the run's starter nor the purchase's
    ``requester`` (a dashboard username, when it is one) may approve it."""
    req = ctx.step("read_request", read_purchase_request, data)
    pr = ctx.call_tool(
        "examples.procurement.submit",
        {k: req[k] for k in ("requester", "item", "quantity", "amount_cents", "vendor")},
    )
    if isinstance(pr, durable.ModelRecoverable):
        raise durable.PermanentError(f"the purchase request was refused: {pr.message}")
    decision = ctx.wait_for_approval(
        "purchase",
        title=f"Buy {req['quantity']} x {req['item']} from {req['vendor']} "
        f"({req['amount_cents'] / 100:,.2f})?",
        payload={
            "purchase_request": pr["id"],
            **{k: req[k] for k in ("requester", "item", "quantity", "amount_cents", "vendor")},
        },
        approvers="procurement",
        timeout=req["approval_timeout"],
        on_timeout="escalate",
        escalate_to="finance",
        # the requester of the purchase may not approve it, nor may whoever started the run
        four_eyes=True,
        requesters=[req["requester"]],
    )
    if not decision.approved:
        outcome = "expired" if decision.expired else "rejected"
        ctx.call_tool(
            "examples.procurement.close", {"purchase_request": pr["id"], "outcome": outcome}
        )
        return {
            "purchase_request": pr["id"],
            "status": outcome,
            "decided_by": list(decision.decided_by),
        }
    order = ctx.call_tool(
        "examples.orders.place",
        {
            "purchase_request": pr["id"],
            "vendor": req["vendor"],
            "item": req["item"],
            "quantity": req["quantity"],
            "amount_cents": req["amount_cents"],
        },
    )
    if isinstance(order, durable.ModelRecoverable):
        raise durable.PermanentError(f"the order was refused: {order.message}")
    goods = ctx.wait_for_signal("goods_received", timeout=req["goods_timeout"], default=None)
    outcome = "received" if goods is not None else "goods not received in time"
    ctx.call_tool("examples.procurement.close", {"purchase_request": pr["id"], "outcome": outcome})
    return {
        "purchase_request": pr["id"],
        "order": order["id"],
        "status": outcome,
        "approved_by": list(decision.decided_by),
        "goods": goods,
    }


def approver_links(approval_id: int, address: str) -> list[dict[str, Any]]:
    """The links of each user at ``address`` who may decide the request, bound to that
    user (``api/links.py``): ``[{"user": username, "approve": url, "reject": url}]``.
    A step of :func:`approval_email`, so a replay sends the links it minted once."""
    from django.contrib.auth import get_user_model

    from api.links import approval_links
    from approvals.models import ApprovalRequest
    from approvals.services import authority_problems

    req = ApprovalRequest.objects.filter(pk=approval_id).select_related("approver_group").first()
    if req is None:
        return []
    users = get_user_model().objects.filter(email=address, is_active=True).order_by("pk")
    return [
        {"user": user.get_username(), **approval_links(req.pk, recipient=user)}
        for user in users
        if not authority_problems(user, req)
    ]


@durable.workflow(name="examples.approval_email", version="2")
def approval_email(ctx, data):
    """Email each approver of a request their own one-time links to approve or reject.

    Started by the outgoing-webhook outbox for each ``approval.requested`` event when
    ``DURABLE_APPROVAL_EMAIL_WORKFLOW`` names it (``api/webhooks_out.py``); ``data``:
    ``{"event": <the event>, "to": [addresses]}``. The links are minted per approver, bound
    to them (a step, :func:`approver_links`), so with N-of-M each approver's link is their
    vote and one approver's links cannot count twice. Each email is the ``email.send``
    tool, so an approver gets it once, even after a crash.
    """
    approval = data["event"]["data"]["approval"]
    run_id = data["event"]["data"]["run_id"]
    deadline = f"\nDecide before {approval['expires_at']}.\n" if approval.get("expires_at") else ""
    sent = []
    for n, address in enumerate(data["to"]):  # by position: an address may be long
        mine = ctx.step(f"links.{n}", approver_links, approval["id"], address)
        if not mine:  # nobody at this address may decide it any more
            continue
        links = "\n".join(
            (f"As {m['user']}:\n" if len(mine) > 1 else "")
            + f"Approve: {m['approve']}\nReject:  {m['reject']}"
            for m in mine
        )
        body = (
            f"Run {run_id} asks for your approval: {approval['title']}\n{deadline}\n"
            f"{links}\n\n"
            "Each link opens a confirmation page; it is yours, works once and expires."
        )
        ctx.call_tool(
            "examples.email.send",
            {"to": address, "subject": f"Approval needed: {approval['title']}", "body": body},
        )
        sent.append(address)
    return {"sent": sent}
