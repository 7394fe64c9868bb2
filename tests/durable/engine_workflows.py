"""Fixture workflows and tools for the engine tests (replay, retries, ledger, budgets,
redaction and the in-process scenarios).

Importing this module registers them. Tests steer them through module-level state that
:func:`reset` clears before each test:

- ``CALLS`` counts step/tool body executions by label;
- ``FAILS[label]`` is a list of exceptions the body raises, one per call, before it
  starts succeeding (put many in it for "always fails");
- ``KEYS`` records ``(label, idempotency_key)`` for every body call that received a key;
- ``FLAGS`` switches workflow code paths between executions (to simulate a code change
  or a crash at a chosen point);
- ``SEEN`` records what the workflow function saw, per execution;
- ``PAYMENTS``/``CHARGES`` are a fake payment service keyed by idempotency key.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import durable
from durable import RetryPolicy
from durable.models import Operation

CALLS: Counter[str] = Counter()
FAILS: dict[str, list[BaseException]] = {}
KEYS: list[tuple[str, str]] = []
FLAGS: dict[str, Any] = {}
SEEN: list[tuple[str, Any]] = []
PAYMENTS: dict[str, dict[str, Any]] = {}
CHARGES: list[str] = []
OPERATION_SNAPSHOTS: list[dict[str, Any]] = []


def reset() -> None:
    for container in (CALLS, FAILS, FLAGS, PAYMENTS, OPERATION_SNAPSHOTS):
        container.clear()
    for seq in (KEYS, SEEN, CHARGES):
        seq.clear()


class Crash(BaseException):
    """Simulates the worker process dying at this point.

    Not an ``Exception``: neither user code nor the engine may catch it, so it leaves
    ``execute`` with the run's lease still held, as a SIGKILL would.
    """


def crash_point(name: str) -> None:
    """Raise :class:`Crash` once when ``FLAGS["crash:" + name]`` is set."""
    if FLAGS.pop(f"crash:{name}", False):
        raise Crash(name)


#: short retries that stay in-process
FAST = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
#: a long first delay: the run is released as RETRYING
SLOW = RetryPolicy(max_attempts=3, initial_interval=60.0, jitter=False)
ONCE = RetryPolicy(max_attempts=1, initial_interval=0.01, jitter=False)
FIVE = RetryPolicy(max_attempts=5, initial_interval=0.01, jitter=False)

POLICIES: dict[str, RetryPolicy] = {
    "fast": FAST,
    "slow": SLOW,
    "once": ONCE,
    "five": FIVE,
    "non_retryable_keyerror": RetryPolicy(
        max_attempts=5, initial_interval=0.01, jitter=False, non_retryable=(KeyError,)
    ),
    "retryable_connection": RetryPolicy(
        max_attempts=5, initial_interval=0.01, jitter=False, retryable=(ConnectionError,)
    ),
}


def _maybe_fail(label: str) -> None:
    CALLS[label] += 1
    plan = FAILS.get(label)
    if plan:
        raise plan.pop(0)


def body(label: str, value: Any = None) -> Any:
    """A step body: counts its call, raises the next planned failure, else returns value."""
    _maybe_fail(label)
    return value


def keyed_body(label: str, value: Any = None, *, idempotency_key: str) -> Any:
    """Like :func:`body`, recording the idempotency key the engine passed."""
    KEYS.append((label, idempotency_key))
    _maybe_fail(label)
    return value


def kwargs_body(label: str, **kwargs: Any) -> Any:
    """Accepts ``**kwargs``: the engine passes the key through them."""
    KEYS.append((label, kwargs.get("idempotency_key", "")))
    _maybe_fail(label)
    return sorted(kwargs)


def derived_helper() -> str:
    CALLS["derived_helper"] += 1
    return "helped"


class Helpers:
    @staticmethod
    def normalize() -> str:
        CALLS["normalize"] += 1
        return "normal"


# --- replay ---------------------------------------------------------------------------


@durable.workflow(name="eng.three_steps", version="1")
def three_steps(ctx, data):
    policy = POLICIES[(data or {}).get("policy", "fast")]
    a = ctx.step("one", body, "one", 1)
    b = ctx.step("two", body, "two", 2)
    crash_point("after_two")
    c = ctx.step("three", body, "three", 3, retry=policy)
    SEEN.append(("three_steps", [a, b, c]))
    return [a, b, c]


@durable.workflow(name="eng.ids", version="1")
def ids(ctx, data):
    fetched = [ctx.step("fetch", body, "fetch", i) for i in range(3)]
    helped = [ctx.step(None, derived_helper), ctx.step(None, derived_helper)]
    normal = ctx.step(None, Helpers.normalize)
    return {"fetched": fetched, "helped": helped, "normal": normal}


@durable.workflow(name="eng.branching", version="1")
def branching(ctx, data):
    ctx.step("one", body, "one")
    if FLAGS.get("alt"):
        ctx.step("two_alt", body, "two_alt")
    else:
        ctx.step("two", body, "two")
    ctx.step("three", body, "three", retry=SLOW)
    ctx.step("four", body, "four")
    return "done"


@durable.workflow(name="eng.reordered", version="1")
def reordered(ctx, data):
    order = ["b", "a"] if FLAGS.get("swap") else ["a", "b"]
    for name in order:
        ctx.step(name, body, name)
    ctx.step("c", body, "c", retry=SLOW)
    return "done"


@durable.workflow(name="eng.versioned", version="1")
def versioned_v1(ctx, data):
    return ctx.step("which", body, "which", "v1")


@durable.workflow(name="eng.versioned", version="2")
def versioned_v2(ctx, data):
    return ctx.step("which", body, "which", "v2")


@durable.workflow(name="eng.keyed", version="1")
def keyed(ctx, data):
    policy = POLICIES[(data or {}).get("policy", "fast")]
    charged = ctx.step("charge", keyed_body, "charge", "ok", retry=policy)
    fetched = [ctx.step("fetch", keyed_body, "fetch", i) for i in range(2)]
    plain = ctx.step("plain", body, "plain", "plain")
    kw = ctx.step("kw", kwargs_body, "kw")
    return {"charged": charged, "fetched": fetched, "plain": plain, "kw": kw}


# --- retries --------------------------------------------------------------------------


@durable.workflow(name="eng.single", version="1")
def single(ctx, data):
    """One step ``data["label"]`` with the policy ``data["policy"]``; returns its value."""
    policy = POLICIES[data.get("policy", "fast")]
    value = ctx.step(data["label"], body, data["label"], data.get("value"), retry=policy)
    SEEN.append(("single", value))
    if isinstance(value, durable.ModelRecoverable):
        return {"recoverable": value.message, "type": value.error_type, "details": value.details}
    return value


@durable.workflow(name="eng.model_recoverable", version="1")
def model_recoverable(ctx, data):
    value = ctx.step("validate", body, "validate", "valid", retry=FAST)
    SEEN.append(("validate", value))
    ctx.step("after", body, "after", retry=SLOW)
    return value.message if isinstance(value, durable.ModelRecoverable) else value


S03_POLICY = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)


@durable.workflow(name="eng.s03", version="1")
def s03(ctx, data):
    """User code catches everything and asks for the step again (S03)."""
    try:
        return ctx.step("s", body, "s", retry=S03_POLICY)
    except Exception as exc:  # noqa: BLE001 - the point of the scenario
        SEEN.append(("s03_caught", type(exc).__name__))
        return ctx.step("s", body, "s", retry=S03_POLICY)


# --- ledger ---------------------------------------------------------------------------


class FakeResponse:
    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status_code
        self.headers = headers or {}


class FakeHTTPError(Exception):
    """Shaped like ``httpx.HTTPStatusError``: ``.response.status_code`` and ``.headers``."""

    def __init__(
        self, status_code: int, headers: dict[str, str] | None = None, message: str = ""
    ) -> None:
        super().__init__(message or f"HTTP {status_code}")
        self.response = FakeResponse(status_code, headers)


def _snapshot_operation(label: str, key: str) -> None:
    op = (
        Operation.objects.filter(idempotency_key=key)
        .values("status", "step_id", "tool_name", "safety", "params_hash", "attempts")
        .first()
    )
    OPERATION_SNAPSHOTS.append({"label": label, "key": key, "row": op})


def _pay(label: str, amount: int, key: str) -> dict[str, Any]:
    """The fake payment service: stores the first result per key and returns it again."""
    if key in PAYMENTS:
        return PAYMENTS[key]
    result = {"charge_id": f"ch_{len(CHARGES) + 1}", "amount": amount}
    PAYMENTS[key] = result
    CHARGES.append(key)
    return result


@durable.tool(safety="idempotent_write", retry=FAST)
def eng_charge(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Idempotent payment: ``FLAGS["lose_response"]`` commits the charge, then times out;
    ``FLAGS["in_progress"]`` answers 409 "in progress" that many times first."""
    KEYS.append(("eng_charge", idempotency_key))
    CALLS["eng_charge"] += 1
    _snapshot_operation("eng_charge", idempotency_key)
    crash_point("eng_charge")
    if FLAGS.get("in_progress", 0) > 0:
        FLAGS["in_progress"] -= 1
        raise FakeHTTPError(409, message="409 Conflict: a request with this key is in progress")
    result = _pay("eng_charge", amount, idempotency_key)
    crash_point("eng_charge_after_pay")
    if FLAGS.pop("lose_response", False):
        raise durable.AmbiguousOutcomeError("read timeout after the request was sent")
    return result


def find_transfer(params: dict[str, Any], *, idempotency_key: str) -> Any:
    CALLS["find_transfer"] += 1
    KEYS.append(("find_transfer", idempotency_key))
    if FLAGS.get("reconcile_raises"):
        raise RuntimeError(FLAGS["reconcile_raises"])
    return PAYMENTS.get(idempotency_key, durable.NOT_FOUND)


@durable.tool(safety="unsafe_write", reconcile=find_transfer, retry=FAST)
def eng_transfer(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Unsafe write with a reconcile hook. ``FLAGS["transfer_lost"]``: the write happens
    but the response is lost; ``FLAGS["transfer_timeout"]``: a timeout before it happened."""
    KEYS.append(("eng_transfer", idempotency_key))
    CALLS["eng_transfer"] += 1
    _snapshot_operation("eng_transfer", idempotency_key)
    crash_point("eng_transfer")
    if FLAGS.pop("transfer_timeout", False):
        raise durable.AmbiguousOutcomeError("timed out; the transfer may not have been sent")
    result = _pay("eng_transfer", amount, idempotency_key)
    crash_point("eng_transfer_after_pay")
    if FLAGS.pop("transfer_lost", False):
        raise durable.AmbiguousOutcomeError("connection reset after the request was sent")
    return result


@durable.tool(safety="unsafe_write")
def eng_send_email(to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Unsafe write without reconcile: an unknown outcome waits for an operator."""
    KEYS.append(("eng_send_email", idempotency_key))
    CALLS["eng_send_email"] += 1
    _snapshot_operation("eng_send_email", idempotency_key)
    crash_point("eng_send_email")
    if FLAGS.pop("email_lost", False):
        raise durable.AmbiguousOutcomeError("SMTP connection dropped after DATA")
    return {"message_id": f"msg-{CALLS['eng_send_email']}", "to": to}


@durable.tool(safety="read_only", retry=FAST)
def eng_lookup(query: str) -> dict[str, Any]:
    CALLS["eng_lookup"] += 1
    _maybe_fail("eng_lookup_plan")
    return {"query": query, "hits": 3}


@durable.workflow(name="eng.tool", version="1")
def tool_workflow(ctx, data):
    """Calls the tool ``data["tool"]`` with ``data["params"]``, then ``data["then"]`` more."""
    result = ctx.call_tool(data["tool"], data.get("params") or {}, step_id=data.get("step_id"))
    SEEN.append(("tool", result))
    crash_point("after_tool")
    for extra in data.get("then", []):
        ctx.step(extra, body, extra)
    return result


# --- budgets --------------------------------------------------------------------------


@durable.workflow(name="eng.loop", version="1")
def loop(ctx, data):
    return [ctx.step("tick", body, "tick", i) for i in range(data["n"])]


def big_output(label: str, size: int) -> str:
    CALLS[label] += 1
    return "x" * size


@durable.workflow(name="eng.big_output", version="1")
def big_output_workflow(ctx, data):
    return len(ctx.step("big", big_output, "big", data["size"], retry=FIVE))


@durable.workflow(name="eng.big_input", version="1")
def big_input_workflow(ctx, data):
    return ctx.step("big_in", body, "big_in", "x" * data["size"], retry=FIVE)


@durable.workflow(name="eng.big_result", version="1")
def big_result_workflow(ctx, data):
    ctx.step("small", body, "small", 1)
    return "y" * data["size"]


# --- redaction (S15) -------------------------------------------------------------------


def use_key(label: str, api_key: str) -> str:
    CALLS[label] += 1
    SEEN.append((label, api_key))
    return "used"


def issue_token(label: str) -> dict[str, str]:
    CALLS[label] += 1
    return {"token": "Bearer abc.def.ghi"}


@durable.tool(safety="idempotent_write", retry=FAST)
def eng_store_token(token: str, *, idempotency_key: str) -> dict[str, Any]:
    CALLS["eng_store_token"] += 1
    SEEN.append(("eng_store_token", token))
    return {"stored": True, "authorization": token}


@durable.workflow(name="eng.secrets", version="1")
def secrets_workflow(ctx, data):
    SEEN.append(("input", data["api_key"]))
    ctx.step("use_key", use_key, "use_key", data["api_key"])
    issued = ctx.step("issue_token", issue_token, "issue_token")
    SEEN.append(("issued", issued["token"]))
    stored = ctx.call_tool("eng_store_token", {"token": issued["token"]})
    SEEN.append(("stored", stored["authorization"]))
    ctx.step("pause", body, "pause", retry=SLOW)
    return {"token": issued["token"], "q": data["q"]}


def leak_in_error(label: str, api_key: str) -> None:
    CALLS[label] += 1
    raise durable.PermanentError(
        f"upstream rejected the key {api_key} (Authorization: Bearer abc.def.ghi)"
    )


@durable.workflow(name="eng.secret_error", version="1")
def secret_error(ctx, data):
    return ctx.step("leaky", leak_in_error, "leaky", data["api_key"])


# --- in-process scenarios ---------------------------------------------------------------


def s10_expected() -> dict[str, Any]:
    """Values of many types that must round-trip exactly across a crash (S10), built
    fresh each call."""
    return {
        "price": Decimal("19.90"),
        "when": dt.datetime(2024, 3, 10, 1, 30, 15, 250000, tzinfo=ZoneInfo("America/New_York")),
        "offset": dt.datetime(
            2024, 3, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))
        ),
        "raw": b"\x00\xff",
        "pairs": {(1, 2), (3, 4)},
        "text": "naïve 😀",
        "nested": [(Decimal("0.10"), b"\xff"), frozenset({"a"})],
    }


def s10_values(label: str) -> dict[str, Any]:
    CALLS[label] += 1
    return s10_expected()


@durable.workflow(name="eng.s10", version="1")
def s10(ctx, data):
    values = ctx.step("values", s10_values, "values")
    SEEN.append(("values", values))
    crash_point("after_values")
    return values


def unsupported(label: str) -> Any:
    CALLS[label] += 1
    return {"fine": 1, "conn": object()}


@durable.workflow(name="eng.unsupported", version="1")
def unsupported_workflow(ctx, data):
    value = ctx.step("unsupported", unsupported, "unsupported", retry=FIVE)
    SEEN.append(("unsupported", value))
    return "unreachable"


@durable.workflow(name="eng.s11", version="1")
def s11(ctx, data):
    first = ctx.step("unicode_failure", body, "unicode_failure", "recovered", retry=FAST)
    second = ctx.step("nasty_failure", body, "nasty_failure", "recovered too", retry=FAST)
    return [first, second]


@durable.workflow(name="eng.s14", version="1")
def s14(ctx, data):
    a = ctx.step("a", body, "a", "A")
    b = ctx.step("b", body, "b", "B")
    crash_point("after_last_step")
    return a + b


# --- test helpers ------------------------------------------------------------------------


def make_due(run_id: str) -> None:
    """:func:`durable.testing.make_due` for a run whose retry is stored: asserts that the
    run is RETRYING (these tests mean a scheduled retry, not any time the run has)."""
    from durable.models import Run, RunStatus
    from durable.testing import make_due

    assert Run.objects.filter(pk=run_id, status=RunStatus.RETRYING).exists(), (
        "the run is not retrying"
    )
    make_due(run_id)


def expire_lease(run_id: str) -> None:
    """Move a RUNNING run's lease expiry into the past (its worker is presumed dead)."""
    from datetime import timedelta

    from django.utils import timezone

    from durable.models import Run, RunStatus

    updated = (
        Run.objects.filter(pk=run_id, status=RunStatus.RUNNING)
        .exclude(lease_token="")
        .update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    )
    assert updated == 1, "the run is not running under a lease"


@durable.workflow(name="eng.keyed_secret", version="1")
def keyed_secret(ctx, data):
    """A secret that is only secret by its key, passed on as a plain argument."""
    ctx.step("login", use_key, "login", data["password"])
    vault = data["vault"]
    ctx.step("unlock", use_key, "unlock", vault)
    return {"ok": True}


@durable.workflow(name="eng.shortened", version="1")
def shortened(ctx, data):
    ctx.step("one", body, "one")
    if FLAGS.get("short"):
        return "returned early"  # the new code no longer asks for "two"
    ctx.step("two", body, "two")
    ctx.step("three", body, "three", retry=SLOW)
    return "done"
