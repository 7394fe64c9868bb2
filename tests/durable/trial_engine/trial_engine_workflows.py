"""Fixture workflows of the outside trial of the batched hot path (``test_trial_engine.py``).

``trial_engine.logs``: batched steps that log from inside (one on a timeout thread, one
failing its first try, two in a parallel group) and workflow code that logs between
them; ``trial_engine.values``: the same awkward value returned by a batched and a sync
step; ``trial_engine.chain``: ``n`` batched steps in a row.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import durable

logger = logging.getLogger("durable.trial_engine")

#: step label -> tries so far (a body fails its first try when its label is in FAIL_ONCE)
TRIES: dict[str, int] = {}
FAIL_ONCE: set[str] = set()
#: the name of the thread each body ran on
THREADS: dict[str, str] = {}


def reset() -> None:
    TRIES.clear()
    FAIL_ONCE.clear()
    THREADS.clear()


def noisy(label: str) -> str:
    TRIES[label] = TRIES.get(label, 0) + 1
    THREADS[label] = threading.current_thread().name
    logger.warning("inside %s try %d", label, TRIES[label])
    if label in FAIL_ONCE and TRIES[label] == 1:
        raise durable.TransientError(f"{label} busy")
    return label


QUICK = durable.RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=False)


@durable.workflow(name="trial_engine.logs", version="1", durability="batched")
def logs(ctx, data):
    out = [ctx.step("a", noisy, "a", durability="batched")]
    logger.warning("between a and b")
    out.append(ctx.step("b", noisy, "b", timeout=60, durability="batched"))
    out.append(ctx.step("c", noisy, "c", retry=QUICK, durability="batched"))
    logger.warning("after c")
    return out


@durable.workflow(name="trial_engine.group", version="1", durability="batched")
def group(ctx, data):
    logger.warning("before the group")
    out = ctx.parallel(
        [
            durable.call(noisy, "p0", step_id="p0", retry=QUICK, durability="batched"),
            durable.call(noisy, "p1", step_id="p1", retry=QUICK, durability="batched"),
        ]
    )
    logger.warning("after the group")
    return out


def awkward_value() -> dict[Any, Any]:
    return {
        "nul": "a\x00b",
        "surrogate": "x\ud800y",
        "astral": "\U0001f600",
        "big": 2**80,
        "negbig": -(2**70),
        "nan": float("nan"),
        "inf": float("inf"),
        "ninf": float("-inf"),
        1: "int key",
        "k\x00ey": "nul key",
        "nested": {"nul": "\x00", "big": 2**90, "list": [float("nan"), "\udfff"]},
        "empty": "",
        "none": None,
    }


def produce(kind: str) -> dict[Any, Any]:
    return awkward_value()


@durable.workflow(name="trial_engine.values", version="1", durability="batched")
def values(ctx, data):
    batched = ctx.step("batched", produce, "batched", durability="batched")
    sync = ctx.step("sync", produce, "sync", durability="sync")
    ctx.sleep(3600, step_id="nap")  # the resumed execution replays both steps
    return {"batched": batched, "sync": sync}


def plain(i: int) -> int:
    return i * 10


@durable.workflow(name="trial_engine.chain", version="1", durability="batched")
def chain(ctx, data):
    return [ctx.step(f"s{i}", plain, i, durability="batched") for i in range(int(data["n"]))]


@durable.workflow(name="trial_engine.long_id", version="1", durability="batched")
def long_id(ctx, data):
    return ctx.step("x" * int(data["n"]), plain, 1, durability="batched")


def killable(i: int) -> int:
    """A body that notes each call in ``$TRIAL_CALL_LOG`` and SIGKILLs its own process
    at the step named by ``$TRIAL_KILL_AT`` while the file ``$TRIAL_KILL_FILE`` exists
    (removed first: the kill happens once)."""
    import os
    import signal

    with open(os.environ["TRIAL_CALL_LOG"], "a", encoding="utf-8") as log:
        log.write(f"s{i}\n")
    flag = os.environ.get("TRIAL_KILL_FILE", "")
    if f"s{i}" == os.environ.get("TRIAL_KILL_AT") and flag and os.path.exists(flag):
        os.remove(flag)
        os.kill(os.getpid(), signal.SIGKILL)
    return i * 10


@durable.workflow(name="trial_engine.killable", version="1", durability="batched")
def killable_chain(ctx, data):
    return [ctx.step(f"s{i}", killable, i, durability="batched") for i in range(int(data["n"]))]
