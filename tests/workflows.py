"""Fixture workflows and tools for the test suite (like Django's tests/tasks/tasks.py).

Side effects are recorded in the ``LEDGER`` list or, for multi-process tests, in a
file named by the DURABLE_TEST_LEDGER environment variable, one JSON line per call.
"""

from __future__ import annotations

import json
import os
import time
from decimal import Decimal

import durable

CALLS: list[tuple[str, object]] = []


def record(kind: str, value: object = None) -> None:
    CALLS.append((kind, value))
    path = os.environ.get("DURABLE_TEST_LEDGER")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(
                json.dumps({"kind": kind, "value": value, "pid": os.getpid(), "t": time.time()})
                + "\n"
            )
            fh.flush()
            os.fsync(fh.fileno())


def add(a: int, b: int) -> int:
    record("add", [a, b])
    return a + b


@durable.workflow(name="tests.add_twice", version="1")
def add_twice(ctx, data):
    x = ctx.step("first", add, data["a"], data["b"])
    y = ctx.step("second", add, x, data["b"])
    return {"result": y}


@durable.workflow(name="tests.values", version="1")
def values(ctx, data):
    return ctx.step(
        "values",
        lambda: {
            "price": Decimal("19.90"),
            "raw": b"\x00\xff",
            "pairs": {(1, 2), (3, 4)},
            "text": "naïve 😀",
        },
    )
