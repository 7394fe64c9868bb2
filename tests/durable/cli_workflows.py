"""Fixture workflows and tools for the management-command and admin tests.

Importing this module registers them. Calls are recorded in ``CALLS``; the knobs in
``FAILURES`` make a tool fail a given number of times before it succeeds.
"""

from __future__ import annotations

import durable
from durable import AmbiguousOutcomeError, PermanentError, RetryPolicy, TransientError

CALLS: list[tuple[str, object]] = []
#: tool name -> how many more calls fail before one succeeds
FAILURES: dict[str, int] = {"cli_charge": 0, "cli_lookup": 0}


def reset() -> None:
    CALLS.clear()
    for name in FAILURES:
        FAILURES[name] = 0


def _should_fail(name: str) -> bool:
    if FAILURES[name] > 0:
        FAILURES[name] -= 1
        return True
    return False


def echo(value: object) -> object:
    CALLS.append(("echo", value))
    return value


def boom(why: str) -> None:
    CALLS.append(("boom", why))
    raise PermanentError(f"cannot do it: {why}")


@durable.tool(safety="unsafe_write")
def cli_charge(amount: int, *, idempotency_key: str) -> dict:
    """Charge a card (no reconcile hook: an unknown outcome waits for an operator)."""
    CALLS.append(("cli_charge", idempotency_key))
    if _should_fail("cli_charge"):
        raise AmbiguousOutcomeError("timed out after the request was sent")
    return {"charge_id": f"ch_{amount}", "amount": amount}


@durable.tool(
    safety="read_only", retry=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
)
def cli_lookup(query: str) -> str:
    """Look something up; fails transiently while FAILURES["cli_lookup"] > 0."""
    CALLS.append(("cli_lookup", query))
    if _should_fail("cli_lookup"):
        raise TransientError("503 from upstream")
    return f"found {query}"


@durable.workflow(name="cli.echo", version="1")
def echo_workflow(ctx, data):
    return {"echo": ctx.step("echo", echo, data)}


@durable.workflow(name="cli.echo_batched", version="1")
def echo_batched_workflow(ctx, data):
    """A batched step, then a sync one (``show`` says which is which)."""
    first = ctx.step("echo", echo, data, durability="batched")
    return {"echo": ctx.step("again", echo, first)}


@durable.workflow(name="cli.charge", version="1")
def charge_workflow(ctx, data):
    receipt = ctx.call_tool("cli_charge", {"amount": data["amount"]})
    return {"receipt": receipt}


@durable.workflow(name="cli.lookup", version="1")
def lookup_workflow(ctx, data):
    return ctx.call_tool("cli_lookup", {"query": data["query"]})


@durable.workflow(name="cli.fail", version="1")
def fail_workflow(ctx, data):
    ctx.step("boom", boom, data["why"])
