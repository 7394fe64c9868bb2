"""Fixture workflows and tools of tests/acceptance (an outside tester's cases). Importing
this module registers them. ``BODIES`` logs the tool bodies that began; ``IN_FLIGHT`` /
``PEAK`` count the bodies of ``acc_slow_one`` running at once."""

from __future__ import annotations

import threading
import time

import durable
from durable import RetryPolicy

BODIES: list[str] = []
_lock = threading.Lock()
STATE = {"in_flight": 0, "peak": 0}
ENDED = threading.Event()


def reset() -> None:
    BODIES.clear()
    STATE.update(in_flight=0, peak=0)
    ENDED.clear()


def _began(label: str) -> None:
    with _lock:
        BODIES.append(label)


@durable.workflow(name="acceptance.echo", version="1")
def echo(ctx, data):
    return ctx.step("echo", lambda: data)


@durable.workflow(name="acceptance.other", version="1")
def other(ctx, data):
    return ctx.step("other", lambda: {"other": data})


@durable.workflow(name="acceptance.signal", version="1")
def signal_flow(ctx, data):
    return {"got": ctx.wait_for_signal("go")}


# --- a workflow whose runs execute one at a time ---------------------------------------


@durable.workflow(name="acceptance.exclusive", version="1", max_concurrent_runs=1)
def exclusive(ctx, data):
    return ctx.step("work", lambda: "done")


# --- a rate-limited read, for the in-place sleep ----------------------------------------


@durable.tool(safety="read_only", rate_limit="2/s")
def acc_rated(label: str) -> str:
    _began(label)
    return label


@durable.workflow(name="acceptance.rated", version="1")
def rated(ctx, data):
    return [ctx.call_tool("acc_rated", {"label": label}) for label in data["labels"]]


# --- a concurrency=1 tool whose try times out while its body goes on ---------------------


@durable.tool(
    safety="read_only",
    concurrency=1,
    timeout=0.3,
    retry=RetryPolicy(max_attempts=2, initial_interval=60, jitter=False),
)
def acc_slow_one(label: str, seconds: float = 0.0) -> str:
    with _lock:
        BODIES.append(label)
        STATE["in_flight"] += 1
        STATE["peak"] = max(STATE["peak"], STATE["in_flight"])
    try:
        time.sleep(seconds)
    finally:
        with _lock:
            STATE["in_flight"] -= 1
        if seconds:
            ENDED.set()
    return label


@durable.workflow(name="acceptance.slow_one", version="1")
def slow_one(ctx, data):
    return ctx.call_tool("acc_slow_one", {"label": data["label"], "seconds": data["seconds"]})


# --- parents and children ---------------------------------------------------------------


@durable.workflow(name="acceptance.waiting_leaf", version="1")
def waiting_leaf(ctx, data):
    ctx.step("work", lambda: "leaf")
    return {"got": ctx.wait_for_signal("go")}


@durable.workflow(name="acceptance.parent_waits_on_child", version="1")
def parent_waits_on_child(ctx, data):
    """Starts one waiting child with ``data["policy"]`` and waits on it."""
    handle = ctx.start_child(
        "acceptance.waiting_leaf", {}, child_id="kid", parent_close_policy=data["policy"]
    )
    return ctx.wait_child(handle)


@durable.workflow(name="acceptance.parent_child_fork", version="1")
def parent_child_fork(ctx, data):
    """A child that ends at once, waited on; a step after it (a fork point)."""
    handle = ctx.start_child("acceptance.echo", {"n": 1}, child_id="kid")
    value = ctx.wait_child(handle)
    after = ctx.step("after", lambda: "after")
    return {"child": value, "after": after}


@durable.workflow(name="acceptance.child_ids", version="1")
def child_ids(ctx, data):
    handle = ctx.start_child("acceptance.echo", data.get("input", {}), child_id=data["child_id"])
    return ctx.wait_child(handle)


# --- failures for good -------------------------------------------------------------------


def _refuses() -> str:
    raise durable.PermanentError("the provider refuses this request")


@durable.workflow(name="acceptance.parallel_fails", version="1")
def parallel_fails(ctx, data):
    return ctx.parallel([durable.call(lambda: "ok", step_id="fine"), durable.call(_refuses)])


@durable.workflow(name="acceptance.child_fails", version="1")
def child_fails(ctx, data):
    handle = ctx.start_child("acceptance.parallel_fails", {}, child_id="bad")
    return ctx.wait_child(handle)


# --- identifiers -------------------------------------------------------------------------


@durable.workflow(name="acceptance.named_step", version="1")
def named_step(ctx, data):
    return ctx.step(data["step_id"], lambda: "x")


@durable.workflow(name="acceptance.named_signal", version="1")
def named_signal(ctx, data):
    return ctx.wait_for_signal(data["name"])


@durable.workflow(name="acceptance.two_children_one_id", version="1")
def two_children_one_id(ctx, data):
    """Child 'a' of acceptance.echo, then child 'a' of acceptance.other, one same input."""
    first = ctx.start_child("acceptance.echo", {"n": 1}, child_id="a")
    second = ctx.start_child("acceptance.other", {"n": 1}, child_id="a")
    return [ctx.wait_child(first), ctx.wait_child(second)]


# --- timed-out bodies inside a parallel group / a model turn ------------------------------

LONG_RETRY = RetryPolicy(max_attempts=2, initial_interval=60, jitter=False)


def _slow_body(seconds: float) -> str:
    _began("slow")
    time.sleep(seconds)
    ENDED.set()
    return "late"


@durable.tool(safety="read_only", timeout=0.2, retry=LONG_RETRY)
def acc_slow_read(seconds: float) -> str:
    return _slow_body(seconds)


@durable.workflow(name="acceptance.parallel_timeout", version="1")
def parallel_timeout(ctx, data):
    if data["how"] == "parallel":
        return ctx.parallel(
            [durable.call(_slow_body, data["seconds"], timeout=0.2, retry=LONG_RETRY)]
        )
    call = {
        "id": "call-1",
        "function": {"name": "acc_slow_read", "arguments": f'{{"seconds": {data["seconds"]}}}'},
    }
    return ctx.run_tool_calls([call])
