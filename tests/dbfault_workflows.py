"""Workflows and the fault injector of the database-fault tests (``tests/processes``).

Worker processes import this module (``DURABLE_WORKFLOW_MODULES`` names it, see
``tests/processes/test_db_faults.py``); the test process imports it to start runs.
Effects and invocations are logged as in ``tests/crash_workflows.py`` (the same
``CRASH_TEST_DIR`` files), so "each effect once" is counted across processes.

**The fault injector** (test-only; nothing in ``durable/`` knows about it). When the
environment names a plan (``DBFAULT_PLAN=<path of a JSON file>``), importing this module
installs, in that worker process:

- a Celery ``task_prerun`` hook that starts counting the statements of each
  ``durable.execute_run`` task (one *execution* of a run) and notes which execution of
  that run it is (a counter file per run in ``CRASH_TEST_DIR``);
- a ``connection.execute_wrapper`` on the task thread's connection (the heartbeat
  thread's connection is not counted). Before statement ``n`` of execution ``k`` of run
  ``r`` -- where the plan says ``{"r": [n_1, n_2, ...]}`` and ``n = n_k`` -- it
  terminates *its own* backend: on PostgreSQL from a second connection with
  ``pg_terminate_backend(pid, 5000)`` (which waits until the backend is gone), so the
  statement then fails exactly as after a server restart or failover. On SQLite, where
  there is no server to lose, it raises ``OperationalError("database is locked")`` (a
  busy timeout that ran out) instead of running the statement.

Each fault is logged to ``faults.jsonl`` (``{run, execution, statement, sql, pid}``),
so the test can tell which parts of the engine were hit (claim, ledger, checkpoint,
completion, release).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import durable
from durable import NOT_FOUND
from tests.crash_workflows import (
    append_jsonl,
    crash_dir,
    enter,
    read_jsonl,
    service_call,
    service_lookup,
)

# ------------------------------------------------------------------ the workflow


def open_ticket(n: int, seconds: float, *, idempotency_key: str) -> dict[str, Any]:
    """A plain step whose effect is an idempotent service call (dedupes by key)."""
    enter("step", idempotency_key)
    time.sleep(seconds)
    return service_call(
        "tickets",
        idempotency_key,
        {"n": n},
        dedupe=True,
        make_result=lambda i: {"ticket": f"T-{i}"},
    )


def find_charge(params: dict[str, Any], *, idempotency_key: str) -> Any:
    enter("reconcile", idempotency_key)
    return service_lookup("charges", idempotency_key) or NOT_FOUND


@durable.tool(name="dbf.charge", safety="unsafe_write", reconcile=find_charge)
def charge(n: int, ticket: str, seconds: float = 0.0, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent: every call is another charge (a repeat would be a visible dup)."""
    enter("step", idempotency_key)
    time.sleep(seconds)
    return service_call(
        "charges",
        idempotency_key,
        {"n": n, "ticket": ticket},
        dedupe=False,
        make_result=lambda i: {"charge_id": f"C-{i}"},
    )


@durable.workflow(name="dbf.two_steps", version="1")
def two_steps(ctx, data):
    """S28: a plain step with an idempotent effect, then an unsafe write with reconcile."""
    seconds = data.get("seconds", 0.0)
    first = ctx.step("first", open_ticket, data["n"], seconds)
    charged = ctx.call_tool(
        "dbf.charge", {"n": data["n"], "ticket": first["ticket"], "seconds": seconds}
    )
    return {"n": data["n"], "ticket": first["ticket"], "charge": charged["charge_id"]}


@durable.workflow(name="dbf.swallow", version="1")
def swallow(ctx, data):
    """Workflow code that catches everything around a step (it must not hide a fault)."""
    try:
        ctx.step("first", open_ticket, 1, 0.0)
    except Exception:  # noqa: BLE001 - the point of the test
        return "swallowed"
    return "recorded"


def note_call(label: str, *, idempotency_key: str) -> str:
    """A body that only logs that it ran (a model asked, say): run again, it logs again."""
    enter("step", idempotency_key)
    return label


@durable.workflow(name="dbf.batched", version="1")
def batched_steps(ctx, data):
    """``n`` batched plain steps (flushed every ``BATCH_MAX_STEPS``), then a sync one."""
    out = [ctx.step(f"b{i}", note_call, f"b{i}", durability="batched") for i in range(data["n"])]
    out.append(ctx.step("last", note_call, "last"))
    return out


def effect_counts(folder: Path) -> dict[tuple[str, str], int]:
    """``{(service, key): effects}`` of the ``effects.jsonl`` in ``folder``."""
    counts: dict[tuple[str, str], int] = {}
    for line in read_jsonl(folder / "effects.jsonl"):
        counts[(line["service"], line["key"])] = counts.get((line["service"], line["key"]), 0) + 1
    return counts


# ------------------------------------------------------------- the fault injector

_state = threading.local()


def _plan() -> dict[str, list[int]]:
    path = os.environ.get("DBFAULT_PLAN")
    if not path:
        return {}
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}


def _next_execution(run_id: str) -> int:
    """1 for the run's first execution in this test folder, then 2, 3, ... (any process)."""
    import fcntl

    path = crash_dir() / f"executions-{run_id}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        count = int(os.read(fd, 32) or b"0") + 1
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(count).encode())
        return count
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _task_started(sender=None, task=None, args=None, **kwargs) -> None:
    _state.target = None
    name = getattr(task if task is not None else sender, "name", "")
    if name != "durable.execute_run" or not args:
        return
    run_id = str(args[0])
    faults = _plan().get(run_id)
    if not faults:
        return
    execution = _next_execution(run_id)
    if execution <= len(faults) and faults[execution - 1] > 0:
        _state.target = {
            "run": run_id,
            "execution": execution,
            "statement": faults[execution - 1],
            "seen": 0,
        }
    from django.db import connection

    if _inject not in connection.execute_wrappers:
        connection.execute_wrappers.append(_inject)


def _inject(execute, sql, params, many, context):
    target = getattr(_state, "target", None)
    if target is not None:
        target["seen"] += 1
        if target["seen"] == target["statement"]:
            _state.target = None
            _fault(context["connection"], target, sql)
    return execute(sql, params, many, context)


def _fault(wrapper: Any, target: dict[str, Any], sql: str) -> None:
    from django.db import OperationalError

    append_jsonl(
        crash_dir() / "faults.jsonl",
        {
            "run": target["run"],
            "execution": target["execution"],
            "statement": target["statement"],
            "sql": " ".join(sql.split())[:160],
            "pid": os.getpid(),
            "vendor": wrapper.vendor,
            "t": time.time(),
        },
    )
    if wrapper.vendor != "postgresql":
        raise OperationalError("database is locked (injected by tests/dbfault_workflows.py)")
    import psycopg

    pid = wrapper.connection.info.backend_pid
    params = {
        k: v
        for k, v in wrapper.get_connection_params().items()
        if k in ("dbname", "user", "password", "host", "port") and v
    }
    with psycopg.connect(**params, autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


def install() -> None:
    """Arm the injector in a worker process whose environment names a plan."""
    if not os.environ.get("DBFAULT_PLAN"):
        return
    from celery.signals import task_prerun

    task_prerun.connect(_task_started, weak=False, dispatch_uid="dbfault-injector")


install()
