"""Fixture workflows of the child-run tests (tests/durable/runtime/test_children.py, the run page's
tree and the crash test). Importing this module registers them.

``EFFECTS`` counts each side effect by name (a step's body, a write), so a test can
assert that a replay or a recovery did not repeat one. ``GATE`` is a ``threading.Event``
a child waits on when its input says so (tests that act while a child runs).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import durable
from durable import RetryPolicy

ONCE = RetryPolicy(max_attempts=1)
EFFECTS: Counter[str] = Counter()
VOIDS: list[str] = []
GATE = threading.Event()


def reset() -> None:
    EFFECTS.clear()
    VOIDS.clear()
    GATE.clear()


def effect(name: str) -> str:
    """A side effect: counted here and, in a worker process, one line in
    ``$CRASH_TEST_DIR/children_effects.jsonl`` (counted across processes)."""
    EFFECTS[name] += 1
    folder = os.environ.get("CRASH_TEST_DIR")
    if folder:
        from tests.crash_workflows import append_jsonl

        append_jsonl(Path(folder) / "children_effects.jsonl", {"effect": name, "pid": os.getpid()})
    return name


def void(params: dict[str, Any], result: Any, *, idempotency_key: str) -> dict[str, Any]:
    VOIDS.append(params["what"])
    return {"voided": params["what"]}


@durable.tool(safety="idempotent_write", compensate=void)
def children_charge(what: str, *, idempotency_key: str) -> dict[str, Any]:
    """A write with a compensation: counted in ``EFFECTS`` as ``charge:<what>``."""
    EFFECTS[f"charge:{what}"] += 1
    return {"charged": what}


@durable.workflow(name="tests.children.leaf", version="1")
def leaf(ctx, data):
    """Doubles ``data["n"]``; fails when ``data["fail"]``; writes when ``data["charge"]``."""
    ctx.step("work", effect, f"leaf:{data.get('tag', data['n'])}")
    if data.get("charge"):
        ctx.call_tool("children_charge", {"what": data["charge"]})
    if data.get("wait_signal"):
        ctx.wait_for_signal("go")
    if data.get("fail"):
        raise durable.PermanentError(f"leaf {data['n']} refuses")
    return {"double": data["n"] * 2}


@durable.workflow(name="tests.children.parent", version="1")
def parent(ctx, data):
    """Starts one leaf per item of ``data["items"]`` and sums their results."""
    ctx.step("before", effect, "parent:before")
    handles = [
        ctx.start_child("tests.children.leaf", item, child_id=item.get("id"))
        for item in data["items"]
    ]
    total = 0
    for handle in handles:
        total += ctx.wait_child(handle)["double"]
    ctx.step("after", effect, "parent:after")
    return {"total": total, "children": [h.run_id for h in handles]}


@durable.workflow(name="tests.children.catching", version="1")
def catching(ctx, data):
    """Catches a child's failure and returns what it saw."""
    handle = ctx.start_child("tests.children.leaf", {"n": 1, "fail": True})
    try:
        handle.result()
    except durable.ChildFailed as exc:
        return {"caught": exc.status, "child": exc.run_id, "type": exc.error_type}
    return {"caught": None}


@durable.workflow(name="tests.children.uncaught", version="1")
def uncaught(ctx, data):
    handle = ctx.start_child("tests.children.leaf", {"n": 1, "fail": True}, child_id="bad")
    return ctx.wait_child(handle)


@durable.workflow(name="tests.children.middle", version="1")
def middle(ctx, data):
    """A child that has children of its own (a tree of three levels)."""
    if data.get("charge"):
        ctx.call_tool("children_charge", {"what": f"middle:{data['charge']}"})
    handle = ctx.start_child("tests.children.leaf", data["leaf"], child_id="leaf")
    return ctx.wait_child(handle)


@durable.workflow(name="tests.children.grand", version="1")
def grand(ctx, data):
    """The root of a three-level tree; fails at the end when ``data["fail"]``."""
    handle = ctx.start_child("tests.children.middle", data["middle"], child_id="mid")
    value = ctx.wait_child(handle)
    if data.get("charge"):
        ctx.call_tool("children_charge", {"what": "root"})
    if data.get("fail"):
        raise durable.PermanentError("the root fails after its children")
    return value


@durable.workflow(name="tests.children.batched", version="1", durability="batched")
def batched(ctx, data):
    """Batched reads before a child: they must be committed with the child's start."""
    for i in range(3):
        ctx.step(f"read{i}", effect, f"read{i}", durability="batched")
    handle = ctx.start_child("tests.children.leaf", {"n": 2}, child_id="after-reads")
    return ctx.wait_child(handle)


@durable.workflow(name="tests.children.late_wait", version="1")
def late_wait(ctx, data):
    """Starts a child, waits for a signal (the child ends meanwhile), then waits on it."""
    handle = ctx.start_child("tests.children.leaf", {"n": 5}, child_id="early")
    ctx.wait_for_signal("now")
    return handle.result()


@durable.workflow(name="tests.children.slow_leaf", version="1")
def slow_leaf(ctx, data):
    """A child with a quick step, then a slow one (the crash test kills its worker there)."""
    ctx.step("first", effect, "child:first")
    ctx.step("slow", slow_effect, data["seconds"])
    return {"done": data["tag"]}


def slow_effect(seconds: float) -> str:
    effect("child:slow:started")
    time.sleep(seconds)
    return effect("child:slow:done")


@durable.workflow(name="tests.children.slow_parent", version="1")
def slow_parent(ctx, data):
    ctx.step("before", effect, "parent:before")
    handle = ctx.start_child("tests.children.slow_leaf", data, child_id="slow")
    value = handle.result()
    ctx.step("after", effect, "parent:after")
    return value


@durable.workflow(name="tests.children.starts_and_fails", version="1")
def starts_and_fails(ctx, data):
    """Starts a child it never waits on (``data["leaf"]``), then fails for good when
    ``data["fail"]`` or returns."""
    options = {"parent_close_policy": data["policy"]} if data.get("policy") else {}
    ctx.start_child("tests.children.leaf", data["leaf"], child_id="c", **options)
    if data.get("fail"):
        raise durable.PermanentError("the parent fails for good")
    return "done"


@durable.workflow(name="tests.children.leaf_with_deadline", version="1", deadline_seconds=5)
def leaf_with_deadline(ctx, data):
    """A child with a 5 s deadline that waits on a signal."""
    ctx.wait_for_signal("go")
    return "late"


@durable.workflow(name="tests.children.catching_deadline", version="1")
def catching_deadline(ctx, data):
    """Waits on a child with a deadline; returns how it ended."""
    handle = ctx.start_child("tests.children.leaf_with_deadline", {}, child_id="slow")
    try:
        handle.result()
    except durable.ChildFailed as exc:
        return {"status": exc.status, "type": exc.error_type}
    return {"status": "succeeded"}


@durable.workflow(name="tests.children.starts_then_charges", version="1")
def starts_then_charges(ctx, data):
    """Starts a child that waits on a signal, then makes a write (tests make its outcome
    unknown, and an operator aborts the run)."""
    ctx.start_child("tests.children.leaf", {"n": 1, "wait_signal": True}, child_id="c")
    return ctx.call_tool("cli_charge", {"amount": 5})
