"""The one-statement paths refuse a text longer than its column, as the ORM's INSERT does.

A ``SELECT`` of parameters gives PostgreSQL no column to infer their types from, so the
one-statement inserts cast each parameter. An explicit cast to ``varchar(n)`` cuts a
longer text silently (PostgreSQL's rule for explicit casts); the casts carry no length,
and the INSERT's assignment to the column refuses the text ("value too long"), writing
nothing. The engine checks step ids and tool names before they get here; this holds
the database's own guard in place for every column."""

from __future__ import annotations

import uuid

import pytest
from django.db import DataError, connection, transaction
from django.utils import timezone

import durable
from durable.models import Run, RunStatus, Step, TraceEvent
from durable.models.operations import Operation
from durable.postgres import checkpoints, rows
from durable.vocabulary import StepKind, StepStatus
from durable.worker.engine import claim
from tests.durable.postgres import trial_hot_path_workflows  # noqa: F401 - registers trial.long_id

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="PostgreSQL's casts; SQLite does not enforce a varchar's length",
    ),
]


@pytest.mark.parametrize("model", [Step, Operation, Run, TraceEvent])
def test_no_cast_of_a_one_statement_path_has_a_length(model):
    for field in rows.insert_fields(model):
        assert not rows.cast_type(field).startswith("varchar("), field.name
    with connection.cursor() as cursor:
        long = "x" * 500
        for field in rows.insert_fields(model):
            if rows.cast_type(field) == "varchar":
                cursor.execute(f"SELECT %s::{rows.cast_type(field)}", [long])
                assert cursor.fetchone()[0] == long, field.name


def test_a_checkpoint_with_a_too_long_tool_name_writes_nothing():
    run = durable.start("trial.long_id", {})  # any workflow: it is not executed
    token = str(uuid.uuid4())
    claimed = claim(run.id, token=token, worker_id="w")
    assert claimed is not None
    now = timezone.now()
    step = rows.unsaved(
        Step,
        run_id=run.id,
        step_id="s",
        position=0,
        kind=StepKind.TOOL,
        tool_name="t" * 201,  # the column is varchar(200)
        status=StepStatus.SUCCEEDED,
        input="{}",
        output="null",
        attempts=1,
        started_at=now,
        finished_at=now,
    )
    with pytest.raises(DataError, match="too long"), transaction.atomic():
        checkpoints.checkpoint_in_one_statement(
            run_id=run.id,
            token=token,
            status=RunStatus.RUNNING,
            worker_id="w",
            step=step,
            tokens=0,
            event_data={},
        )
    assert not Step.objects.filter(run_id=run.id).exists()
    assert Run.objects.get(pk=run.id).steps_executed == 0
