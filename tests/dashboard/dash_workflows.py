"""Fixture workflows and tools for the dashboard tests.

Importing this module registers them; ``tests/dashboard/conftest.py`` also lists it in
``DURABLE['WORKFLOW_MODULES']``. ``KNOBS`` make steps fail a given number of times.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import durable
from durable import (
    NOT_FOUND,
    AmbiguousOutcomeError,
    PermanentError,
    RetryPolicy,
    TransientError,
)

KNOBS: dict[str, int] = {"flaky": 0, "unknown": 0}


def reset() -> None:
    for name in KNOBS:
        KNOBS[name] = 0


def _echo(value: object) -> object:
    return value


def _flaky() -> str:
    if KNOBS["flaky"] > 0:
        KNOBS["flaky"] -= 1
        raise TransientError("503 from upstream <b>bold</b>")
    return "ok"


def _always_transient() -> str:
    raise TransientError("429 rate limited")


def _boom(why: str) -> None:
    raise PermanentError(f"cannot do it: {why}")


@durable.tool(name="dash.send_money", safety="unsafe_write")
def send_money(amount: int, *, idempotency_key: str = "") -> dict:
    """An unsafe write without reconcile: an unknown outcome waits for an operator."""
    if KNOBS["unknown"] > 0:
        KNOBS["unknown"] -= 1
        raise AmbiguousOutcomeError("timed out after the request was sent")
    return {"transfer": f"tr_{amount}", "amount": amount}


def _provider_file(idempotency_key: str) -> Path:
    """The record's file, in the var folder the test's processes share (the harness's
    session folder, which a browser test's daphne has as its own)."""
    from django.conf import settings

    from tests import harness

    folder = harness._session_var_dir or Path(settings.VAR_DIR)
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
    return folder / "test-provider" / f"{digest}.json"


def provider_records(idempotency_key: str, payment: dict | None) -> None:
    """The payment provider's own record of a write, as ``dash.pay``'s reconcile hook
    reads it, in a file of the var folder (a browser test's web server is another
    process): a payment, or ``None`` (the provider has none). Without a record the
    provider's lookup is down: the hook raises."""
    path = _provider_file(idempotency_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payment))


def find_payment(params: dict, *, idempotency_key: str) -> object:
    path = _provider_file(idempotency_key)
    if not path.exists():
        raise ConnectionError("the provider's lookup API is down")
    found = json.loads(path.read_text())
    return NOT_FOUND if found is None else found


@durable.tool(
    name="dash.pay",
    safety="unsafe_write",
    reconcile=find_payment,
    external_id=lambda result: result["payment"],
)
def pay(amount: int, *, idempotency_key: str = "") -> dict:
    """An unsafe write with a reconcile hook (that may be down when the engine asks)."""
    if KNOBS["unknown"] > 0:
        KNOBS["unknown"] -= 1
        raise AmbiguousOutcomeError("timed out after the request was sent")
    return {"payment": f"pay_{amount}", "amount": amount}


@durable.tool(name="dash.lookup", safety="read_only")
def lookup(query: str) -> dict:
    return {"query": query, "hits": 1}


@durable.workflow(name="dash.echo", version="1")
def echo(ctx, data):
    return {"echo": ctx.step("echo", _echo, data)}


@durable.workflow(name="dash.parallel", version="1")
def parallel(ctx, data):
    """A parallel group of three calls, then one of a single call (the run page groups them)."""
    three = ctx.parallel([durable.call(_echo, n) for n in ("a", "b", "c")])
    one = ctx.parallel([durable.call(_echo, "<d>")])
    return three + one


@durable.workflow(name="dash.echo", version="2")
def echo_v2(ctx, data):
    return {"echo": ctx.step("echo", _echo, data), "v": 2}


@durable.workflow(name="dash.big", version="1")
def big(ctx, data):
    return ctx.step("big", _echo, "x" * data["size"] + "<script>alert(1)</script>" + "END")


@durable.workflow(name="dash.flaky", version="1")
def flaky(ctx, data):
    ctx.call_tool("dash.lookup", {"query": "q"})
    return ctx.step(
        "flaky", _flaky, retry=RetryPolicy(max_attempts=5, initial_interval=0.01, jitter=False)
    )


@durable.workflow(name="dash.slow_retry", version="1")
def slow_retry(ctx, data):
    return ctx.step(
        "slow",
        _always_transient,
        retry=RetryPolicy(max_attempts=5, initial_interval=3600, jitter=False, max_interval=3600),
    )


@durable.workflow(name="dash.fail", version="1")
def fail(ctx, data):
    ctx.step("first", _echo, 1)
    ctx.step("boom", _boom, data.get("why", "no reason"), retry=RetryPolicy(max_attempts=1))


@durable.workflow(name="dash.transfer", version="1")
def transfer(ctx, data):
    receipt = ctx.call_tool("dash.send_money", {"amount": data["amount"]})
    return {"receipt": receipt}


@durable.workflow(name="dash.payout", version="1")
def payout(ctx, data):
    return {"receipt": ctx.call_tool("dash.pay", {"amount": data["amount"]})}


@durable.tool(name="dash.notify", safety="idempotent_write", requires_approval=True)
def notify(channel: str, text: str, *, idempotency_key: str = "") -> dict:
    """Post a message to a channel (the chat service dedupes by key): low-risk."""
    return {"posted": text, "channel": channel}


@durable.tool(name="dash.wire", safety="unsafe_write", requires_approval=True)
def wire(amount: int, *, idempotency_key: str = "") -> dict:
    """Wire money: every call is a new transfer."""
    return {"wired": amount}


@durable.workflow(name="dash.announce", version="1")
def announce(ctx, data):
    return ctx.call_tool("dash.notify", {"channel": data.get("channel", "#ops"), "text": "done"})


@durable.workflow(name="dash.pay_out", version="1")
def pay_out(ctx, data):
    return ctx.call_tool("dash.wire", {"amount": data.get("amount", 5)})
