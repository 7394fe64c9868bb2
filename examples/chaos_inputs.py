"""The chaos audit's runs: which agents it starts, in turn, and each run's input.

Run number ``i`` is of kind ``KINDS[i % len(KINDS)]``; :func:`inputs` gives its input and
the operator's plan for it (procurement: let the approval escalate, send the signal
before the run waits for it; cascade: cancel it mid-flight, and compensate it or not).
A ``scheduled`` run is not started by the audit: its number is one slot of the audit's
schedule (examples/chaos_operator.py), whose run the schedule starts. Faults the
scripted LLM acts on ride in the support message (``[fault:429]``, ``[fault:malformed_json]``).
"""

from __future__ import annotations

import random
from typing import Any

from .chaos_frameworks import EXPECTED as FRAMEWORK_EXPECTED
from .chaos_frameworks import message as framework_message

#: the agents the audit starts, in turn (``examples.<kind>``; examples/workflows.py,
#: examples/chaos_agents.py and examples/chaos_frameworks.py)
KINDS = (
    "support",
    "invoice",
    "procurement",
    "fanout",
    "family",
    "limited",
    "scheduled",
    "cascade",
    "langgraph",
    "pydantic_ai",
    "openai_agents",
)
#: the kinds whose runs something else starts (a schedule): the audit counts their slots
NOT_STARTED = ("scheduled",)


def inputs(i: int, kind: str, rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    """(input, plan) of chaos run number ``i``; ``plan`` says how the operator acts."""
    if kind == "support":
        faults = []
        if i % 5 == 0:
            faults.append("[fault:429]")
        if i % 7 == 0:
            faults.append("[fault:malformed_json]")
        return (
            {
                "customer": f"Chaos Customer {i}",
                "email": f"customer{i}@example.com",
                "message": f"I was charged twice for order #{5000 + i}; please refund the "
                f"duplicate charge ch_chaos{i:05d} of ${10 + i % 90}.{i % 100:02d}. "
                + " ".join(faults),
            },
            {},
        )
    if kind in ("fanout", "family", "limited"):
        return {"customer": f"Chaos Customer {i}"}, {}
    if kind == "scheduled":
        return {"customer": "Chaos Scheduled"}, {"slot": True}
    if kind == "cascade":
        # every other cascade (the first one too) is compensated after its cancel
        return {"customer": f"Chaos Customer {i}"}, {
            "cancel": True,
            "compensate": (i // len(KINDS)) % 2 == 0,
        }
    if kind in FRAMEWORK_EXPECTED:  # a message naming a charge only this run refunds
        return {"message": framework_message(i)}, {}
    if kind == "invoice":
        return (
            {
                "customer": f"Chaos Corp {i}",
                "email": f"billing{i}@example.com",
                "lines": [
                    {"description": "Service", "amount_cents": 10000 + i},
                    {"description": "Support", "amount_cents": 500},
                ],
            },
            {},
        )
    escalate = i % 2 == 0
    return (
        {
            "requester": f"Chaos Buyer {i}",
            "item": f"Part {i}",
            "quantity": 1 + i % 4,
            "amount_cents": 1000 * (1 + i % 50),
            "vendor": "Chaos Supplies",
            "approval_timeout_seconds": 2 if escalate else 600,
            "goods_timeout_seconds": 3600,
        },
        {"escalate": escalate, "early_signal": rng.random() < 0.5},
    )
