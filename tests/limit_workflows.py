"""Fixture workflows and tools for the limit tests, in-process and with real workers.

Importing this module registers them. ``CALLS`` logs every tool body call (in-process);
``FAILS[label]`` lists exceptions a body raises, one per call, before it succeeds. The
HTTP tool calls the scripted server whose URL is ``DURABLE_TEST_LIMIT_URL`` (set by the
process tests), which answers 429 when a window of one second holds more than its limit.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import durable
from durable import RetryPolicy, TransientError

CALLS: list[tuple[str, float]] = []
FAILS: dict[str, list[BaseException]] = {}


def reset() -> None:
    CALLS.clear()
    FAILS.clear()


def _body(label: str) -> str:
    CALLS.append((label, time.time()))
    failures = FAILS.get(label)
    if failures:
        raise failures.pop(0)
    return label


@durable.tool(safety="read_only", rate_limit="2/m")
def limited_read(label: str = "read") -> str:
    """Two calls a minute, across every run."""
    return _body(label)


@durable.tool(safety="idempotent_write", rate_limit="2/m")
def limited_write(label: str, *, idempotency_key: str) -> str:
    """A write with a rate: it waits before its ledger row."""
    return _body(label)


@durable.tool(
    safety="read_only",
    rate_limit="100/s",
    retry=RetryPolicy(max_attempts=3, initial_interval=0.01, max_interval=0.01),
)
def provider(label: str = "provider") -> str:
    """A provider that may answer 429 with a Retry-After (``FAILS``)."""
    return _body(label)


@durable.tool(safety="read_only", rate_limit="1/h", timeout=5, retry=RetryPolicy(max_attempts=2))
def timed_read(label: str = "timed") -> str:
    """One call an hour, each try bounded by 5 s (its wait for the rate included)."""
    return _body(label)


@durable.tool(safety="read_only", concurrency=1)
def one_at_a_time(label: str = "one") -> str:
    return _body(label)


@durable.workflow(name="limits.reads")
def reads(ctx, data: dict[str, Any]) -> list[str]:
    tool = data.get("tool", "limited_read")
    return [ctx.call_tool(tool, {"label": f"{data['name']}-{i}"}) for i in range(data["n"])]


@durable.workflow(name="limits.writes")
def writes(ctx, data: dict[str, Any]) -> list[str]:
    return [ctx.call_tool("limited_write", {"label": f"w{i}"}) for i in range(data["n"])]


@durable.workflow(name="limits.llm")
def llm_calls(ctx, data: dict[str, Any]) -> list[Any]:
    return [ctx.llm([{"role": "user", "content": str(i)}], model="m1") for i in range(data["n"])]


# --- real workers --------------------------------------------------------------------


@durable.tool(
    safety="read_only",
    rate_limit="10/s",
    retry=RetryPolicy(max_attempts=10, initial_interval=0.2, max_interval=1.0),
)
def scripted_http(run: str, i: int) -> dict[str, Any]:
    """A GET to the scripted server; a 429 is raised with its Retry-After."""
    url = f"{os.environ['DURABLE_TEST_LIMIT_URL']}/call?run={run}&i={i}"
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 429:
            retry_after = float(exc.headers.get("Retry-After", 1))
            raise TransientError("429", retry_after=retry_after) from exc
        raise


@durable.workflow(name="limits.http")
def http_calls(ctx, data: dict[str, Any]) -> int:
    for i in range(data["n"]):
        ctx.call_tool("scripted_http", {"run": ctx.run_id, "i": i})
    return data["n"]


@durable.workflow(name="limits.exclusive", max_concurrent_runs=2)
def exclusive(ctx, data: dict[str, Any]) -> str:
    """Holds its slot for ``seconds``, recording when it ran, in a file per run."""
    marker = os.path.join(data["dir"], ctx.run_id.replace("/", "_"))
    start = time.time()
    time.sleep(data["seconds"])
    with open(marker, "w") as fh:
        fh.write(f"{start} {time.time()}")
    return "done"


@durable.tool(safety="read_only", rate_limit="5/s")
def fair_call(folder: str, run: str) -> str:
    """Five calls a second across every run; writes when its body ran, a file per run."""
    with open(os.path.join(folder, run.replace("/", "_")), "w") as fh:
        fh.write(repr(time.time()))
    return run


@durable.workflow(name="limits.fair")
def fair(ctx, data: dict[str, Any]) -> str:
    return ctx.call_tool("fair_call", {"folder": data["dir"], "run": ctx.run_id})
