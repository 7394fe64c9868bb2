"""Workflows and tools for the multi-process crash tests (``tests/processes``).

Worker processes import this module (``DURABLE_WORKFLOW_MODULES=tests.crash_workflows``);
the test process imports it too, to start runs and to read the files it writes.

Everything observable lives in the folder named by the ``CRASH_TEST_DIR`` environment
variable, one per test:

- ``effects.jsonl`` -- the *recording fake service*: one line per effective external
  effect ``{service, key, params, result}``. Appended under a lock and fsync'ed, so a
  SIGKILL right after a call cannot lose the line. ``tickets`` (and ``api``) dedupe by
  idempotency key like Stripe; ``payments`` and ``email`` do not, so a repeated call is
  a visible duplicate.
- ``invocations.jsonl`` -- one line each time a step/tool body or a reconcile hook is
  entered: ``{kind, step, run, key, pid}``.
- ``api_requests.jsonl`` -- the request log of the fake API of S05 (every call, deduped
  or not).
- ``crashed-*`` markers -- a crash point fires once per test folder.

Crash switch: ``CRASH_AT=<step_id>:<phase>[,...]`` in a worker's environment, where
phase is ``before`` (the step body's first line, after the invocation is logged),
``after_effect`` (the effect is written, the step has not returned, so nothing is
checkpointed) or an orchestration point (``B:after_checkpoint``,
``finish:before_complete``). The worker SIGKILLs itself there, once: a marker file is
created (O_EXCL) before the kill.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import durable
from durable import NOT_FOUND, RetryPolicy

# ------------------------------------------------------------------ files and hooks


def crash_dir() -> Path:
    path = os.environ.get("CRASH_TEST_DIR")
    if not path:
        raise RuntimeError("CRASH_TEST_DIR is not set: the crash workflows need a folder")
    return Path(path)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line with a single write(2) on an O_APPEND fd, then fsync."""
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@contextlib.contextmanager
def _locked(name: str = "service.lock") -> Iterator[None]:
    fd = os.open(crash_dir() / name, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def split_key(key: str) -> tuple[str, str]:
    """``"{run_id}:{step_id}"`` -> ``(run_id, step_id)``."""
    run_id, _, step_id = key.partition(":")
    return run_id, step_id


def enter(kind: str, key: str, **extra: Any) -> None:
    """Log that a body (``kind="step"``) or a reconcile hook was entered."""
    run_id, step_id = split_key(key)
    append_jsonl(
        crash_dir() / "invocations.jsonl",
        {
            "kind": kind,
            "step": step_id,
            "run": run_id,
            "key": key,
            "pid": os.getpid(),
            "t": time.time(),
            **extra,
        },
    )


def crash_point(point: str) -> None:
    """SIGKILL this process if ``point`` is armed in ``CRASH_AT`` (once per test folder)."""
    armed = [p.strip() for p in os.environ.get("CRASH_AT", "").split(",") if p.strip()]
    if point not in armed:
        return
    marker = crash_dir() / ("crashed-" + re.sub(r"[^A-Za-z0-9_.-]", "_", point))
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()}\n".encode())
    os.fsync(fd)
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def first_time(name: str) -> bool:
    """True the first time ``name`` is asked for in this test folder (any process)."""
    try:
        fd = os.open(crash_dir() / f"first-{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    os.close(fd)
    return True


# ----------------------------------------------------------- the recording fake service


def service_call(
    service: str,
    key: str,
    params: dict[str, Any],
    *,
    dedupe: bool,
    make_result: Callable[[int], dict[str, Any]],
) -> dict[str, Any]:
    """Perform an external effect: one line in ``effects.jsonl``.

    ``dedupe``: a repeated key returns the first result and writes nothing (an
    idempotent API); otherwise every call is a new effect. Ids are sequential per
    service (``make_result(n)``), as a real service assigns them.
    """
    path = crash_dir() / "effects.jsonl"
    with _locked():
        lines = [e for e in read_jsonl(path) if e["service"] == service]
        if dedupe:
            for line in lines:
                if line["key"] == key:
                    return line["result"]
        result = make_result(len(lines) + 1)
        append_jsonl(
            path,
            {
                "service": service,
                "key": key,
                "params": params,
                "result": result,
                "pid": os.getpid(),
            },
        )
        return result


def service_lookup(service: str, key: str) -> dict[str, Any] | None:
    for line in read_jsonl(crash_dir() / "effects.jsonl"):
        if line["service"] == service and line["key"] == key:
            return line["result"]
    return None


# ------------------------------------------------------- the reference agent's calls


def plan_llm(message: str, customer: str, *, idempotency_key: str) -> dict[str, Any]:
    """Stands in for an LLM call: the step we must not pay for twice."""
    enter("step", idempotency_key)
    crash_point("plan:before")
    return {
        "query": "refund policy duplicate charge",
        "subject": f"Duplicate charge reported by {customer}",
        "refund_amount": Decimal("19.90"),
        "reply": f"We are refunding the duplicate charge. ({len(message)} chars read)",
    }


@durable.tool(name="kb.search", safety="read_only")
def kb_search(query: str, *, idempotency_key: str) -> list[dict[str, str]]:
    """Search the knowledge base."""
    enter("step", idempotency_key)
    crash_point("kb.search:before")
    return [
        {"id": "kb-7", "title": "Refunds for duplicate charges"},
        {"id": "kb-12", "title": f"Escalation policy ({query.split()[0]})"},
    ]


@durable.tool(name="tickets.create", safety="idempotent_write")
def tickets_create(customer: str, subject: str, *, idempotency_key: str) -> dict[str, Any]:
    """Open a support ticket (the service dedupes by idempotency key)."""
    enter("step", idempotency_key)
    crash_point("tickets.create:before")
    result = service_call(
        "tickets",
        idempotency_key,
        {"customer": customer, "subject": subject},
        dedupe=True,
        make_result=lambda n: {"ticket_id": f"T-{n}"},
    )
    crash_point("tickets.create:after_effect")
    return result


def find_refund(params: dict[str, Any], *, idempotency_key: str) -> Any:
    enter("reconcile", idempotency_key)
    return service_lookup("payments", idempotency_key) or NOT_FOUND


@durable.tool(
    name="payments.refund",
    safety="unsafe_write",
    reconcile=find_refund,
    external_id=lambda result: result.get("refund_id"),
)
def payments_refund(charge_id: str, amount: Decimal, *, idempotency_key: str) -> dict[str, Any]:
    """Refund a charge. Not idempotent: every call moves money."""
    enter("step", idempotency_key)
    crash_point("payments.refund:before")
    result = service_call(
        "payments",
        idempotency_key,
        {"charge_id": charge_id, "amount": str(amount)},
        dedupe=False,
        make_result=lambda n: {"refund_id": f"R-{n}", "amount": str(amount)},
    )
    crash_point("payments.refund:after_effect")
    return result


def find_email(params: dict[str, Any], *, idempotency_key: str) -> Any:
    enter("reconcile", idempotency_key)
    return service_lookup("email", idempotency_key) or NOT_FOUND


@durable.tool(name="email.send", safety="unsafe_write", reconcile=find_email)
def email_send(to: str, subject: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    """Send an email. Not idempotent: every call is another email."""
    enter("step", idempotency_key)
    crash_point("email.send:before")
    result = service_call(
        "email",
        idempotency_key,
        {"to": to, "subject": subject, "body": body},
        dedupe=False,
        make_result=lambda n: {"message_id": f"M-{n}"},
    )
    crash_point("email.send:after_effect")
    return result


def summarize(
    plan: dict[str, Any],
    docs: list[dict[str, str]],
    ticket: dict[str, Any],
    refund: dict[str, Any],
    email: dict[str, Any],
    *,
    idempotency_key: str,
) -> str:
    enter("step", idempotency_key)
    crash_point("summary:before")
    return (
        f"{ticket['ticket_id']}: refunded {refund['amount']} as {refund['refund_id']}, "
        f"emailed {email['message_id']}; sources {', '.join(d['id'] for d in docs)}; "
        f"{plan['subject']}"
    )


#: the reference agent's durable calls in order (step ids)
AGENT_STEPS = ("plan", "kb.search", "tickets.create", "payments.refund", "email.send", "summary")
#: the ones with an external effect
AGENT_EFFECT_STEPS = ("tickets.create", "payments.refund", "email.send")


def get_safety(step_id: str) -> str | None:
    """The safety class of the tool a step calls (``None`` for a plain step)."""
    from durable.exceptions import ToolNotFound
    from durable.registry import get_tool

    try:
        return get_tool(step_id).safety
    except ToolNotFound:
        return None


AGENT_INPUT = {
    "customer": "cus_42",
    "email": "ada@example.com",
    "charge_id": "ch_1001",
    "message": "I was charged twice for order 1001, please refund one.",
}


@durable.workflow(name="crash.support_agent", version="1")
def support_agent(ctx, data):
    plan = ctx.step("plan", plan_llm, data["message"], data["customer"])
    docs = ctx.call_tool("kb.search", {"query": plan["query"]})
    ticket = ctx.call_tool(
        "tickets.create", {"customer": data["customer"], "subject": plan["subject"]}
    )
    refund = ctx.call_tool(
        "payments.refund", {"charge_id": data["charge_id"], "amount": plan["refund_amount"]}
    )
    email = ctx.call_tool(
        "email.send", {"to": data["email"], "subject": plan["subject"], "body": plan["reply"]}
    )
    summary = ctx.step("summary", summarize, plan, docs, ticket, refund, email)
    return {
        "ticket": ticket["ticket_id"],
        "refund": refund,
        "email": email["message_id"],
        "docs": [d["id"] for d in docs],
        "summary": summary,
    }


# ------------------------------------------------------------ scenario workflows


def tally(label: str, value: Any, *, idempotency_key: str) -> Any:
    """A step body that only logs its invocation."""
    enter("step", idempotency_key, label=label)
    crash_point(f"{label}:before")
    return value


def long_write(seconds: float, *, idempotency_key: str) -> dict[str, Any]:
    """S01: runs longer than the lease, then writes to an external ledger."""
    enter("step", idempotency_key)
    time.sleep(seconds)
    service_call(
        "ledger",
        idempotency_key,
        {"seconds": seconds},
        dedupe=False,
        make_result=lambda n: {"entry": n},
    )
    return {"slept": seconds}


@durable.workflow(name="crash.long_step", version="1")
def long_step(ctx, data):
    return ctx.step("long", long_write, data["seconds"])


def slow_first(seconds: float, *, idempotency_key: str) -> dict[str, Any]:
    """S02: the first attempt (in this test folder) sleeps ``seconds``; later ones do not."""
    first = first_time(f"slow-{idempotency_key}")
    enter("step", idempotency_key, first=first)
    if first:
        time.sleep(seconds)
    return {"slow_attempt": first}


@durable.workflow(name="crash.slow_first", version="1")
def slow_first_wf(ctx, data):
    slow = ctx.step("slow", slow_first, data["seconds"])
    after = ctx.step("after", tally, "after", "done")
    return {"slow": slow, "after": after}


def charge_api(amount: str, *, idempotency_key: str) -> dict[str, Any]:
    """S05: the first attempt sleeps past its timeout, then still calls the API."""
    first = first_time(f"charge-{idempotency_key}")
    attempt = 1 if first else 2
    enter("step", idempotency_key, attempt=attempt)
    if first:
        time.sleep(5.0)
    append_jsonl(
        crash_dir() / "api_requests.jsonl",
        {"key": idempotency_key, "attempt": attempt, "pid": os.getpid(), "t": time.time()},
    )
    charge = service_call(
        "api",
        idempotency_key,
        {"amount": amount},
        dedupe=True,
        make_result=lambda n: {"charge_id": f"C-{n}", "attempt": attempt},
    )
    return {"attempt": attempt, "charge": charge}


@durable.workflow(name="crash.timeout_api", version="1")
def timeout_api(ctx, data):
    charged = ctx.step(
        "charge",
        charge_api,
        data["amount"],
        timeout=2,
        retry=RetryPolicy(max_attempts=2, initial_interval=0.1),
    )
    counted = ctx.step("count", tally, "count", charged["charge"]["charge_id"])
    return {"charged": charged, "counted": counted}


@durable.workflow(name="crash.abc", version="1")
def abc(ctx, data):
    a = ctx.step("A", tally, "A", data["n"] + 1)
    b = ctx.step("B", tally, "B", a * 10)
    crash_point("B:after_checkpoint")  # B's checkpoint has committed when ctx.step returns
    c = ctx.step("C", tally, "C", b + 1)
    return {"a": a, "b": b, "c": c}


@durable.workflow(name="crash.ten_steps", version="1")
def ten_steps(ctx, data):
    total = 0
    for i in range(10):
        total += ctx.step(f"s{i}", tally, f"s{i}", data["n"] + i)
    return {"n": data["n"], "total": total}


@durable.workflow(name="crash.finish", version="1")
def finish(ctx, data):
    values = [ctx.step(f"f{i}", tally, f"f{i}", i * data["k"]) for i in range(3)]
    crash_point("finish:before_complete")  # the last checkpoint has committed
    return {"values": values, "sum": sum(values)}


def steal_lease(*, idempotency_key: str) -> str:
    """S01 fencing: another worker claims the run while this step body runs."""
    from datetime import timedelta

    from django.utils import timezone

    from durable.models import Run

    run_id, _ = split_key(idempotency_key)
    enter("step", idempotency_key)
    Run.objects.filter(pk=run_id).update(
        lease_token="thief-token",
        lease_owner="thief:1:1",
        lease_expires_at=timezone.now() + timedelta(seconds=60),
    )
    service_call(
        "ledger",
        idempotency_key,
        {"by": "stale worker"},
        dedupe=False,
        make_result=lambda n: {"entry": n},
    )
    return "written by a worker that lost its lease"


@durable.workflow(name="crash.stolen", version="1")
def stolen(ctx, data):
    first = ctx.step("stale", steal_lease)
    return ctx.step("next", tally, "next", first)


def gated(*, idempotency_key: str) -> dict[str, Any]:
    """Held until the test creates ``gate-<run id>`` in the test folder (at most 120 s)."""
    enter("step", idempotency_key)
    run_id, _ = split_key(idempotency_key)
    gate = crash_dir() / f"gate-{run_id}"
    deadline = time.monotonic() + 120
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"pid": os.getpid()}


@durable.workflow(name="crash.gated", version="1")
def gated_wf(ctx, data):
    held = ctx.step("held", gated)
    after = ctx.step("after", tally, "after", "done")
    return {"held": held, "after": after}
