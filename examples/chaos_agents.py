"""The chaos audit's agents of the newer capabilities (``manage.py durable_chaos``).

Beside the three reference agents, the audit starts runs of these, under the same
SIGKILLs and payments-service faults, and counts their effects (examples/chaos_audit.py):

- ``examples.fanout``: one parallel group (``ctx.parallel``, docs/parallel.md) of three
  ticket writes and two reads, then one call of the limited tool: four tickets;
- ``examples.family``: a parent that starts two ``examples.family_child`` runs
  (``ctx.start_child`` / ``ctx.wait_child``, docs/children.md) and waits for both; each
  child writes one ticket and calls the limited tool once: four tickets per parent;
- ``examples.limited``: three calls of the limited tool in turn: three tickets.

``examples.chaos.limited_ticket`` opens a ticket under a ``rate_limit`` and a
``concurrency`` (docs/limits.md) shared by every run of the audit, so runs park on the
limit and lose their worker while parked or holding a slot.

Every ticket's subject starts with the run id and names the effect (``"<run id>
fan-out 0"``), so the audit can also find the same effect written under two keys.
Workers serve this module by naming it in ``DURABLE_WORKFLOW_MODULES``.
"""

from __future__ import annotations

from typing import Any

import durable

from . import clients
from .tools import SERVICE_RETRY, _by_key, _object_id

#: the shared limit of ``examples.chaos.limited_ticket``
LIMITED_RATE = "10/s"
LIMITED_CONCURRENCY = 2
#: what one succeeded run of each agent leaves in the services: (collection, count)
EXPECTED = {
    "fanout": {"ticket": 4},
    "family": {"ticket": 4},
    "limited": {"ticket": 3},
}
#: the children each ``examples.family`` run starts
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
    """Three limited writes in turn."""
    ids = [
        _ok(
            ctx.call_tool(
                "examples.chaos.limited_ticket",
                {"customer": str(data["customer"]), "subject": f"{ctx.run_id} limited {j}"},
            ),
            f"limited {j}",
        )["id"]
        for j in range(3)
    ]
    return {"tickets": ids}
