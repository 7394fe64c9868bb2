"""Nothing secret is persisted or logged, while steps still get the real values (S15)."""

from __future__ import annotations

import logging

import pytest
from django.db import connection

import durable
from durable.models import Operation, Run, RunStatus, Step, StepAttempt, TraceEvent, Wait
from durable.testing import drive
from tests.durable import engine_workflows as ew

pytestmark = pytest.mark.django_db(transaction=True)

API_KEY = "sk-test-XYZ123456"
TOKEN = "Bearer abc.def.ghi"
LITERALS = ("sk-test-XYZ123456", "abc.def.ghi")

DURABLE_MODELS = (Run, Step, StepAttempt, Operation, Wait, TraceEvent)


@pytest.fixture(autouse=True)
def _reset():
    ew.reset()
    yield
    ew.reset()


def orm_text() -> str:
    """``str()`` of every concrete field of every row of Durable's tables."""
    parts = []
    for model in DURABLE_MODELS:
        fields = [f for f in model._meta.get_fields() if getattr(f, "concrete", False)]
        for obj in model.objects.all():
            parts.extend(str(getattr(obj, f.attname)) for f in fields)
    return "\n".join(parts)


def raw_database_text() -> str:
    """Every value of every row of every table, read with SQL (no ORM conversion)."""
    parts = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f'SELECT * FROM "{table}"')  # table names from introspection
            for row in cursor.fetchall():
                parts.extend(str(value) for value in row)
    return "\n".join(parts)


def assert_no_literals(text: str, literals=LITERALS) -> None:
    for literal in literals:
        assert text.count(literal) == 0, f"{literal!r} found"


def test_s15_secrets_never_reach_the_database_or_logs(settings, caplog):
    settings.DEBUG = True  # log every SQL statement with its parameters
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django.db.backends")
    ew.FAILS["pause"] = [durable.TransientError("come back later")]

    run = durable.start("eng.secrets", {"api_key": API_KEY, "q": "hi"})
    run = drive(run.id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING
    ew.make_due(run.id)
    run = drive(run.id)  # the second execution replays the recorded steps

    assert run.status == RunStatus.SUCCEEDED, run.error
    # the steps and the workflow got the real values, on both executions
    seen = ew.SEEN
    assert seen.count(("input", API_KEY)) == 2
    assert seen.count(("use_key", API_KEY)) == 1
    assert seen.count(("issued", TOKEN)) == 2
    assert seen.count(("eng_store_token", TOKEN)) == 1
    assert seen.count(("stored", TOKEN)) == 2
    assert run.output_value() == {"token": TOKEN, "q": "hi"}
    assert ew.CALLS["use_key"] == 1 and ew.CALLS["issue_token"] == 1

    orm = orm_text()
    raw = raw_database_text()
    # the scan is not vacuous: it sees the rows and their non-secret values
    assert Step.objects.filter(run=run).count() == 4 and Operation.objects.count() == 1
    assert '"q":"hi"' in orm and '"q":"hi"' in raw
    assert_no_literals(orm)
    assert_no_literals(raw)

    assert "durable_step" in caplog.text  # SQL was logged, parameters included
    assert_no_literals(caplog.text)
    for record in caplog.records:
        assert_no_literals(record.getMessage())


def test_secret_in_an_exception_message_is_stored_redacted():
    run = drive(durable.start("eng.secret_error", {"api_key": API_KEY}).id)

    assert run.status == RunStatus.FAILED
    [attempt] = StepAttempt.objects.filter(run=run)
    assert attempt.message.startswith("upstream rejected the key [REDACTED]")
    assert "[REDACTED]" in attempt.traceback
    assert "PermanentError" in attempt.traceback
    assert_no_literals(attempt.message)
    assert_no_literals(attempt.traceback)
    assert "[REDACTED]" in run.error["message"]
    assert_no_literals(orm_text())
    assert_no_literals(raw_database_text())


def test_reconcile_failure_is_logged_redacted(caplog):
    caplog.set_level(logging.WARNING, logger="durable")
    ew.FLAGS["crash:eng_transfer"] = True
    ew.FLAGS["reconcile_raises"] = f"ledger lookup refused key {API_KEY}"
    run = durable.start("eng.tool", {"tool": "eng_transfer", "params": {"amount": 5}})
    with pytest.raises(ew.Crash):
        drive(run.id)
    ew.expire_lease(run.id)
    run = drive(run.id)

    assert run.status == RunStatus.WAITING  # the operator decides
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("durable")]
    assert any("reconcile" in m and "[REDACTED]" in m for m in messages), messages
    assert_no_literals(caplog.text)
    assert_no_literals(raw_database_text())


def test_secret_wrapper_is_encrypted_and_given_back_to_steps():
    run = drive(
        durable.start(
            "eng.keyed_secret",
            {"password": "hunter2-plain", "vault": durable.Secret("opensesame-42")},
        ).id
    )

    assert run.status == RunStatus.SUCCEEDED, run.error
    [(_, vault)] = [item for item in ew.SEEN if item[0] == "unlock"]
    assert isinstance(vault, durable.Secret) and vault.reveal() == "opensesame-42"
    assert_no_literals(raw_database_text(), ("opensesame-42",))
    # the run input keeps the key-selected secret encrypted
    assert "hunter2-plain" not in Run.objects.get(pk=run.id).input


def test_key_selected_secret_stays_secret_when_passed_to_a_step():
    drive(
        durable.start(
            "eng.keyed_secret",
            {"password": "hunter2-plain", "vault": durable.Secret("opensesame-42")},
        ).id
    )
    assert ("login", "hunter2-plain") in ew.SEEN
    assert_no_literals(raw_database_text(), ("hunter2-plain",))
