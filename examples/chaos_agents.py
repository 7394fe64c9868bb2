"""The chaos audit's agents of the newer capabilities (``manage.py durable_chaos``).

Beside the three reference agents, the audit starts runs of these, under the same
SIGKILLs and payments-service faults, and counts their effects (examples/chaos_audit.py):

- ``examples.fanout``: one parallel group (``ctx.parallel``, docs/parallel.md) of three
  ticket writes and two reads, then one call of the limited tool: four tickets;
- ``examples.family``: a parent that starts two ``examples.family_child`` runs
  (``ctx.start_child`` / ``ctx.wait_child``, docs/children.md) and waits for both; each
  child writes one ticket and calls the limited tool once: four tickets per parent;
- ``examples.limited``: three calls of the limited tool at once (a parallel group, more
  than its concurrency): three tickets;

- ``examples.scheduled``: one ticket; the audit does not start these runs, a schedule
  (``durable.schedule``, docs/schedules.md) it declares does, one run per slot
  (examples/chaos_operator.py ticks it);
- ``examples.cascade``: a parent that starts two ``examples.cascade_child`` runs, each of
  which bills three invoices (``examples.chaos.bill``, compensated by a refund of the
  invoice) and then waits for a signal that never comes: the operator cancels the parent
  mid-flight (its children are cancelled with it, parent-close policy ``cancel``), and
  for every other cascade also compensates it (each child's invoices are refunded).

``examples.chaos.limited_ticket`` opens a ticket under a ``rate_limit`` and a
``concurrency`` (docs/limits.md) shared by every run of the audit, tight enough that many
calls park on the limit and lose their worker while parked or holding a slot.

Every ticket's subject and every invoice's customer starts with the run id and names the
effect (``"<run id> fan-out 0"``, ``"<run id> bill 2"``), and a refund's charge is
``ch_<invoice id>``, so the audit can also find the same effect written under two keys.
Workers serve this module by naming it in ``DURABLE_WORKFLOW_MODULES``.
"""

from __future__ import annotations

from typing import Any

import durable

from . import clients
from .tools import SERVICE_RETRY, _by_key, _object_id

#: the shared limit of ``examples.chaos.limited_ticket``: calls per second, at once
LIMITED_CALLS_PER_SECOND = 3
LIMITED_RATE = f"{LIMITED_CALLS_PER_SECOND}/s"
LIMITED_CONCURRENCY = 1
#: the invoices each ``examples.cascade_child`` bills before it waits for the operator
CASCADE_BILLS = 3
#: what one run of each agent leaves in the services at most: (collection, count); a
#: succeeded run leaves exactly that (a cascade never succeeds: it is cancelled)
EXPECTED = {
    "fanout": {"ticket": 4},
    "family": {"ticket": 4},
    "limited": {"ticket": 3},
    "scheduled": {"ticket": 1},
    "cascade": {"invoice": 2 * CASCADE_BILLS, "refund": 2 * CASCADE_BILLS},
}
#: the children each ``examples.family`` and ``examples.cascade`` run starts
CHILD_IDS = ("a", "b")


@durable.tool(
    name="examples.chaos.limited_ticket",
    safety="idempotent_write",
    retry=SERVICE_RETRY,
    reconcile=_by_key("tickets"),
    external_id=_object_id,
    rate_limit=LIMITED_RATE,
    concurrency=LIMITED_CONCURRENCY,
)
def limited_ticket(customer: str, subject: str, *, idempotency_key: str) -> dict[str, Any]:
    """Open a low-priority ticket under the audit's shared rate and concurrency limit."""
    return clients.payments(
        "POST",
        "/v1/tickets",
        idempotency_key=idempotency_key,
        json={"customer": customer, "subject": subject, "priority": "low"},
    )


def _refund_bill(params: dict[str, Any], result: Any, *, idempotency_key: str) -> Any:
    """Compensation of ``examples.chaos.bill``: refund the invoice (charge ``ch_<id>``)."""
    return clients.payments(
        "POST",
        "/v1/refunds",
        idempotency_key=idempotency_key,
        json={
            "charge_id": f"ch_{result['id']}",
            "amount_cents": result["total_cents"],
            "reason": f"compensates {params['customer']}",
        },
    )


@durable.tool(
    name="examples.chaos.bill",
    safety="idempotent_write",
    retry=SERVICE_RETRY,
    reconcile=_by_key("invoices"),
    compensate=_refund_bill,
    external_id=_object_id,
)
def bill(customer: str, amount_cents: int, *, idempotency_key: str) -> dict[str, Any]:
    """Bill ``customer`` (an invoice of one line); compensated by refunding it."""
    return clients.payments(
        "POST",
        "/v1/invoices",
        idempotency_key=idempotency_key,
        json={
            "customer": customer,
            "email": "cascade@example.com",
            "lines": [{"description": "Chaos cascade", "amount_cents": amount_cents}],
        },
    )


def _ticket(ctx: Any, customer: str, what: str) -> dict[str, Any]:
    return {"customer": customer, "subject": f"{ctx.run_id} {what}", "priority": "low"}


def _ok(result: Any, what: str) -> dict[str, Any]:
    """A tool call's result, or the run fails naming the call (a ModelRecoverable)."""
    if isinstance(result, durable.ModelRecoverable) or not isinstance(result, dict):
        raise RuntimeError(f"{what}: {result!r}")
    return result


@durable.workflow(name="examples.fanout", version="1")
def fanout(ctx, data):
    """Three ticket writes and two reads in one parallel group, then one limited write."""
    customer = str(data["customer"])
    results = ctx.parallel(
        [
            *[
                durable.tool_call("examples.tickets.create", _ticket(ctx, customer, f"fan-out {j}"))
                for j in range(3)
            ],
            durable.tool_call("examples.kb.search", {"query": "refund duplicate charge"}),
            durable.tool_call("examples.kb.search", {"query": "delivery delays"}),
        ],
        max_concurrency=3,
    )
    tickets = [_ok(r, f"fan-out {j}")["id"] for j, r in enumerate(results[:3])]
    articles = sum(len(_ok(r, "kb.search")["articles"]) for r in results[3:])
    limited = ctx.call_tool(
        "examples.chaos.limited_ticket",
        {"customer": customer, "subject": f"{ctx.run_id} limited 0"},
    )
    return {"tickets": tickets, "limited": _ok(limited, "limited 0")["id"], "articles": articles}


@durable.workflow(name="examples.family_child", version="1")
def family_child(ctx, data):
    """One ticket write and one limited write (a child of ``examples.family``)."""
    customer = str(data["customer"])
    ticket = ctx.call_tool("examples.tickets.create", _ticket(ctx, customer, "child ticket"))
    limited = ctx.call_tool(
        "examples.chaos.limited_ticket",
        {"customer": customer, "subject": f"{ctx.run_id} limited 0"},
    )
    return {"ticket": _ok(ticket, "child ticket")["id"], "limited": _ok(limited, "limited")["id"]}


@durable.workflow(name="examples.family", version="1")
def family(ctx, data):
    """Start two children, wait for both; a failed child fails the parent."""
    handles = [
        ctx.start_child("examples.family_child", {"customer": data["customer"]}, child_id=cid)
        for cid in CHILD_IDS
    ]
    return {"children": [ctx.wait_child(h) for h in handles]}


@durable.workflow(name="examples.limited", version="1")
def limited(ctx, data):
    """Three limited writes at once (a parallel group): more than the limit's
    concurrency, so some wait for the slot, parking the run."""
    results = ctx.parallel(
        [
            durable.tool_call(
                "examples.chaos.limited_ticket",
                {"customer": str(data["customer"]), "subject": f"{ctx.run_id} limited {j}"},
            )
            for j in range(3)
        ],
        max_concurrency=3,
    )
    return {"tickets": [_ok(r, f"limited {j}")["id"] for j, r in enumerate(results)]}


@durable.workflow(name="examples.scheduled", version="1")
def scheduled(ctx, data):
    """One ticket (started by the audit's schedule, one run per slot)."""
    ticket = ctx.call_tool(
        "examples.tickets.create", _ticket(ctx, str(data["customer"]), "scheduled")
    )
    return {"ticket": _ok(ticket, "scheduled")["id"]}


@durable.workflow(name="examples.cascade_child", version="1")
def cascade_child(ctx, data):
    """Bill three invoices, then wait for a "proceed" signal (the operator cancels first)."""
    bills = [
        _ok(
            ctx.call_tool(
                "examples.chaos.bill",
                {"customer": f"{ctx.run_id} bill {j}", "amount_cents": 100 * (j + 1)},
            ),
            f"bill {j}",
        )["id"]
        for j in range(CASCADE_BILLS)
    ]
    ctx.wait_for_signal("proceed")
    return {"bills": bills}


@durable.workflow(name="examples.cascade", version="1")
def cascade(ctx, data):
    """Start two billing children and wait for both (until the operator cancels it)."""
    handles = [
        ctx.start_child("examples.cascade_child", {"customer": data["customer"]}, child_id=cid)
        for cid in CHILD_IDS
    ]
    return {"children": [ctx.wait_child(h) for h in handles]}
