"""Tools the MCP tests serve (``tests/contrib/test_mcp_*.py``, the crash test).

Effects go to the recording fake service of :mod:`tests.crash_workflows` (the folder
``CRASH_TEST_DIR``): ``shipping`` does not dedupe, so a repeated write is a visible
duplicate; its ``reconcile`` looks the effect up by idempotency key.
"""

from __future__ import annotations

from typing import Any

import durable
from durable import NOT_FOUND
from tests.crash_workflows import crash_point, enter, service_call, service_lookup


@durable.tool(name="mcpt.stock", safety="read_only")
def stock(sku: str, warehouse: str = "main") -> dict[str, Any]:
    """How many items of ``sku`` a warehouse holds.

    Counts what is on the shelves now.
    """
    return {"sku": sku, "warehouse": warehouse, "count": len(sku)}


def find_shipment(params: dict[str, Any], *, idempotency_key: str) -> Any:
    enter("reconcile", idempotency_key)
    return service_lookup("shipping", idempotency_key) or NOT_FOUND


@durable.tool(
    name="mcpt.ship", safety="unsafe_write", requires_approval=True, reconcile=find_shipment
)
def ship(order_id: str, quantity: int, *, idempotency_key: str) -> dict[str, Any]:
    """Ship an order. Not idempotent: every call sends a parcel."""
    enter("step", idempotency_key)
    crash_point("mcpt.ship:before")
    result = service_call(
        "shipping",
        idempotency_key,
        {"order_id": order_id, "quantity": quantity},
        dedupe=False,
        make_result=lambda n: {"parcel": f"P-{n}", "order_id": order_id},
    )
    crash_point("mcpt.ship:after_effect")
    return result


@durable.tool(name="mcpt.tag", safety="idempotent_write")
def tag(order_id: str, label: str, *, idempotency_key: str) -> dict[str, Any]:
    """Label an order (the service dedupes by idempotency key)."""
    return service_call(
        "tags",
        idempotency_key,
        {"order_id": order_id, "label": label},
        dedupe=True,
        make_result=lambda n: {"tag": n},
    )


@durable.tool(name="mcpt.quote", safety="read_only", rate_limit="1/h")
def quote(sku: str) -> dict[str, Any]:
    """A price from a provider that allows one request an hour."""
    return {"sku": sku, "price": 3}
