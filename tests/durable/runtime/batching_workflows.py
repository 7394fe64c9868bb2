"""Fixture workflows of the batched-checkpoint tests (``tests/durable/test_batching*.py``).

``batch.ops`` (durability="batched") and ``batch.ops_sync`` (the default) run a list of
operations given as input, one durable call each (``read``, ``read_sync``,
``read_batched``, ``step_b``, ``step``, ``llm``, ``llm_sync``, ``write``, ``idem``,
``sleep``, ``fail``), plus ``pause`` (workflow code sleeping 30 ms, no durable call).
Every body logs, in :data:`LOG`, the positions of the run's steps that are committed
when it starts -- what a crash at that moment would keep -- so the tests can check the
flush rules from inside the bodies. :data:`ACTIONS` makes a body crash, cancel its run
or steal its lease.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import durable
from durable import NOT_FOUND
from durable.models import Step, StepStatus
from tests.durable.engine_workflows import Crash

#: one entry per body call: {"label", "position", "durable": [committed positions]}
LOG: list[dict[str, Any]] = []
CALLS: Counter[str] = Counter()
#: label -> what its body does once before returning: "crash", "cancel", "steal", "fail"
ACTIONS: dict[str, str] = {}
#: the fake write service: idempotency key -> result
WRITES: dict[str, dict[str, Any]] = {}


def reset() -> None:
    LOG.clear()
    CALLS.clear()
    ACTIONS.clear()
    WRITES.clear()


def committed_positions(run_id: str) -> list[int]:
    """The positions of the run's succeeded steps in the database (committed)."""
    return sorted(
        Step.objects.filter(run_id=run_id, status=StepStatus.SUCCEEDED).values_list(
            "position", flat=True
        )
    )


def observe(label: str, position: int, idempotency_key: str) -> str:
    """What every body does: log, then act once as ``ACTIONS`` says."""
    run_id = idempotency_key.partition(":")[0]
    CALLS[label] += 1
    LOG.append({"label": label, "position": position, "durable": committed_positions(run_id)})
    action = ACTIONS.pop(label, None)
    if action == "crash":
        raise Crash(label)
    if action == "cancel":
        durable.cancel(run_id, reason="cancelled inside a batch")
    if action == "steal":
        from durable.models import Run

        Run.objects.filter(pk=run_id).update(lease_token="thief-token")
    if action == "fail":
        raise durable.PermanentError(f"{label} failed")
    if action == "transient":
        raise durable.TransientError(f"{label} busy")
    return f"{label}@{position}"


def step_body(label: str, position: int, *, idempotency_key: str) -> str:
    return observe(label, position, idempotency_key)


@durable.tool(name="batch.read", safety="read_only")
def read(label: str, position: int, *, idempotency_key: str) -> str:
    """A read: the workflow's durability applies."""
    return observe(label, position, idempotency_key)


@durable.tool(name="batch.read_sync", safety="read_only", durability="sync")
def read_sync(label: str, position: int, *, idempotency_key: str) -> str:
    """A read whose tool says sync."""
    return observe(label, position, idempotency_key)


@durable.tool(name="batch.read_batched", safety="read_only", durability="batched")
def read_batched(label: str, position: int, *, idempotency_key: str) -> str:
    """A read whose tool says batched."""
    return observe(label, position, idempotency_key)


def find_write(params: dict[str, Any], *, idempotency_key: str) -> Any:
    return WRITES.get(idempotency_key) or NOT_FOUND


@durable.tool(name="batch.write", safety="unsafe_write", reconcile=find_write)
def write(label: str, position: int, *, idempotency_key: str) -> dict[str, Any]:
    """An unsafe write: the fake service records it by key."""
    observe(label, position, idempotency_key)
    WRITES[idempotency_key] = {"written": label}
    return WRITES[idempotency_key]


@durable.tool(name="batch.idem", safety="idempotent_write")
def idem(label: str, position: int, *, idempotency_key: str) -> dict[str, Any]:
    observe(label, position, idempotency_key)
    return {"idem": label}


def fake_chat(messages, *, model=None, tools=None, timeout=None, **options) -> dict[str, Any]:
    """Stands in for ``durable.runtime.llm.chat`` (tests patch it in): 10 tokens, scripted."""
    label = messages[0]["content"]
    CALLS[label] += 1
    return {
        "content": label,
        "tool_calls": [],
        "usage": {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10},
        "model": "scripted",
        "finish_reason": "stop",
        "cost_usd": None,
        "scripted": True,
    }


BATCHED_OPS = {"read", "read_batched", "step_b", "llm"}


def run_ops(ctx, data: dict[str, Any]) -> list[Any]:
    results: list[Any] = []
    position = 0
    for i, op in enumerate(data["ops"]):
        label = f"{op}{i}"
        params = {"label": label, "position": position}
        if op == "pause":
            time.sleep(0.03)
            continue
        if op in ("read", "read_sync", "read_batched", "write", "idem"):
            tool = "batch." + op if op != "read" else "batch.read"
            results.append(ctx.call_tool(tool, params, step_id=label))
        elif op == "step_b":
            results.append(ctx.step(label, step_body, label, position, durability="batched"))
        elif op in ("step", "fail"):
            if op == "fail":
                ACTIONS[label] = "fail"
            results.append(ctx.step(label, step_body, label, position))
        elif op == "llm":
            results.append(ctx.llm([{"role": "user", "content": label}], step_id=label)["content"])
        elif op == "llm_sync":
            reply = ctx.llm([{"role": "user", "content": label}], step_id=label, durability="sync")
            results.append(reply["content"])
        elif op == "sleep":
            ctx.sleep(3600, step_id=label)
            results.append(label)
        else:
            raise ValueError(f"unknown op {op!r}")
        position += 1
    return results


@durable.workflow(name="batch.ops", version="1", durability="batched")
def ops_batched(ctx, data):
    return run_ops(ctx, data)


@durable.workflow(name="batch.ops_sync", version="1")
def ops_sync(ctx, data):
    return run_ops(ctx, data)


@durable.workflow(name="batch.bad_step", version="1", durability="batched")
def bad_step(ctx, data):
    return ctx.step("odd", step_body, "odd", 0, durability="fast")


#: texts a batch flush must carry as they are: array-literal syntax (quotes, braces,
#: commas, backslashes, the word NULL), NUL, a lone surrogate, astral characters
AWKWARD_TEXTS = [
    'say "hi", {a,b}',
    "back\\slash \\\\ and \\",
    "NULL",
    "",
    "nul\x00inside",
    "lone \ud800 surrogate",
    "emoji \U0001f600 and ünï",
    "{}",
    '{"json": [1, 2]}',
]


def echo_text(text: str) -> dict[str, Any]:
    return {"text": text, "again": [text, None, text]}


@durable.workflow(name="batch.awkward", version="1", durability="batched")
def awkward(ctx, data):
    ids = ['q "1"', "{a,b}", "c\\d", "NULL", "e,f", "g}h", "i{j", "k l", "m'n"]
    return [
        ctx.step(f"{ids[i % len(ids)]}#{i}", echo_text, text, durability="batched")
        for i, text in enumerate(data["texts"])
    ]
