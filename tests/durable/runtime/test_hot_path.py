"""The PostgreSQL hot path: one statement each for a run's start, its claim, a step's
checkpoint, a write's ``started`` ledger row and the completion (``durable/postgres/runs.py``,
``durable/postgres/checkpoints.py``), writing exactly what the transactional path writes.

The one-statement paths apply outside a transaction, so these tests commit
(``transaction=True``); each also runs the transactional path (the one-statement
functions made unavailable) and compares what both wrote.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

import durable
from durable import postgres
from durable.models import Operation, OperationStatus, Run, RunStatus, Step, TraceEvent
from durable.values import codec
from durable.worker.engine import execute
from tests.durable.runtime import hot_path_workflows as flows

pytestmark = pytest.mark.django_db(transaction=True)

RUN_FIELDS = (
    "status",
    "output",
    "error",
    "lease_owner",
    "lease_token",
    "lease_expires_at",
    "wake_at",
    "claims",
    "cursor_position",
    "cursor_lost",
    "steps_executed",
    "steps_replayed",
    "tokens_used",
)


@pytest.fixture(autouse=True)
def _postgresql_only(steady_clock):
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement paths are PostgreSQL's (SQLite takes the transactions)")
    flows.WRITES.clear()


def _statements(fn) -> tuple[Any, list[str]]:
    """``fn()``'s result and the statements it sent on this thread's connection."""
    sent: list[str] = []

    def wrapper(execute_, sql, params, many, context):
        sent.append(sql.split()[0].upper())
        return execute_(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        return fn(), sent


def _written(run_id: str) -> dict[str, Any]:
    run = Run.objects.get(pk=run_id)
    events = TraceEvent.objects.filter(run_id=run_id).order_by("id")
    steps = Step.objects.filter(run_id=run_id).order_by("position")
    ops = Operation.objects.filter(run_id=run_id).order_by("step_id")
    return {
        "run": {name: getattr(run, name) for name in RUN_FIELDS},
        "times": [run.started_at is not None, run.finished_at is not None],
        "events": [(e.kind, e.step_id, e.message, _untimed(e.data), e.actor) for e in events],
        # every column of the step but its id, run and times: the one-statement path
        # writes the model's columns (durable/postgres/rows.py), so a new one shows here
        "steps": [
            {f.attname: getattr(s, f.attname) for f in Step._meta.concrete_fields}
            | {"id": None, "run_id": None, "started_at": None, "finished_at": None}
            for s in steps
        ],
        "operations": [
            (o.step_id, o.tool_name, o.safety, o.status, o.result, o.attempts, o.params)
            for o in ops
        ],
    }


def _untimed(data: Any) -> Any:
    """An event's data without its measured duration (``seconds``)."""
    return {k: v for k, v in data.items() if k != "seconds"} if isinstance(data, dict) else data


def _without_one_statement_paths(monkeypatch) -> None:
    monkeypatch.setattr(postgres, "available", lambda: False)


def _normalised(written: dict[str, Any], run_id: str) -> dict[str, str]:
    return {k: repr(v).replace(run_id, "<run>") for k, v in written.items()}


def test_one_step_run_is_four_statements_and_writes_what_the_transactions_write(monkeypatch):
    run, start_sql = _statements(lambda: durable.start("hp.one_step", {}))
    status, execute_sql = _statements(lambda: execute(run.id, worker_id="w"))
    assert status == RunStatus.SUCCEEDED
    # the start, the claim (no step query for a new run), the checkpoint, the completion
    assert start_sql == ["WITH"]
    assert execute_sql == ["WITH", "WITH", "WITH"]
    fast = _written(run.id)
    assert [e[0] for e in fast["events"]] == ["created", "claimed", "step_executed", "completed"]
    assert fast["run"]["lease_token"] == "" and fast["run"]["claims"] == 1

    _without_one_statement_paths(monkeypatch)
    slow_run = durable.start("hp.one_step", {})
    assert execute(slow_run.id, worker_id="w") == RunStatus.SUCCEEDED
    assert _normalised(fast, run.id) == _normalised(_written(slow_run.id), slow_run.id)


def test_a_write_is_two_statements_and_records_what_the_transactions_record(monkeypatch):
    run = durable.start("hp.writes", {})
    status, sent = _statements(lambda: execute(run.id, worker_id="w"))
    assert status == RunStatus.SUCCEEDED, Run.objects.get(pk=run.id).error
    # claim, the tool row, then per write: the fenced ledger row and the checkpoint,
    # then the completion
    assert sent == ["WITH", "SELECT", "WITH", "WITH", "WITH", "WITH", "WITH"], sent
    fast = _written(run.id)
    assert [o[3] for o in fast["operations"]] == [OperationStatus.SUCCEEDED] * 2
    assert flows.WRITES == [f"{run.id}:hp.write", f"{run.id}:hp.write#2"]

    _without_one_statement_paths(monkeypatch)
    slow_run = durable.start("hp.writes", {})
    assert execute(slow_run.id, worker_id="w") == RunStatus.SUCCEEDED
    assert _normalised(fast, run.id) == _normalised(_written(slow_run.id), slow_run.id)


def test_a_write_whose_key_has_a_row_takes_the_ledger_transaction():
    """A ``started`` row left by a lost worker: the one statement inserts nothing (the
    fence held, the key is taken), and the ledger's transaction settles it."""
    run = durable.start("hp.writes", {})
    Operation.objects.create(
        idempotency_key=f"{run.id}:hp.write",
        run_id=run.id,
        step_id="hp.write",
        tool_name="hp.write",
        safety="unsafe_write",
        params='{"n":1}',
        params_hash=codec.fingerprint({"n": 1}),
        status=OperationStatus.FAILED,
        lease_token="gone",
    )
    assert execute(run.id, worker_id="w") == RunStatus.SUCCEEDED
    op = Operation.objects.get(idempotency_key=f"{run.id}:hp.write")
    assert op.status == OperationStatus.SUCCEEDED and op.attempts == 2
    assert len(flows.WRITES) == 2


def test_a_resumed_run_counts_its_replays_in_the_completion_statement():
    run = durable.start("hp.one_step", {})
    assert execute(run.id, worker_id="w") == RunStatus.SUCCEEDED
    step = Step.objects.get(run_id=run.id)
    # replay it: the run is claimable again as pending, with its step recorded
    Run.objects.filter(pk=run.id).update(status=RunStatus.PENDING, output=None)
    status, sent = _statements(lambda: execute(run.id, worker_id="w"))
    assert status == RunStatus.SUCCEEDED
    assert sent == ["WITH", "SELECT", "WITH"]  # claim, the recorded steps, completion
    step.refresh_from_db()
    assert step.replay_count == 1
    assert Run.objects.get(pk=run.id).steps_replayed == 1
