"""Every value that crosses into storage round-trips or fails loudly, naming where
(docs/values.md). Runs on PostgreSQL and on SQLite alike."""

from __future__ import annotations

import pytest

import durable
from durable.models import Run, RunStatus, Step, StepAttempt, StepStatus, TraceEvent
from durable.testing import drive
from tests.durable.values import values_workflows as vw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    vw.reset()
    yield
    vw.reset()


def _attempts(run_id: str) -> list[StepAttempt]:
    return list(StepAttempt.objects.filter(run_id=run_id).order_by("attempt"))


# --- S25: NUL in an error message -------------------------------------------------------


def test_nul_in_a_transient_error_is_stored_readably_and_retried():
    vw.RAISE["lookup"] = [ValueError("bad byte \x00 here") for _ in range(2)]
    vw.RETURN["lookup"] = "found"
    run = drive(durable.start("values.lookup").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == "found"
    assert vw.CALLS["lookup"] == 3
    attempts = _attempts(run.id)
    assert [a.message for a in attempts] == ["bad byte \\x00 here"] * 2
    assert all("bad byte \\x00 here" in a.traceback for a in attempts)
    assert all(a.classification == "transient" for a in attempts)
    assert (
        TraceEvent.objects.filter(
            run=run, kind="attempt_failed", message="bad byte \\x00 here"
        ).count()
        == 2
    )


def test_nul_in_an_error_that_exhausts_its_retries_fails_the_run_with_the_message():
    vw.RAISE["lookup"] = [ValueError("bad byte \x00 here") for _ in range(5)]
    run = drive(durable.start("values.lookup").id)
    assert run.status == RunStatus.FAILED
    assert run.error["message"] == "bad byte \\x00 here"
    assert run.error["reason"].startswith("max attempts exceeded: ")
    step = Step.objects.get(run=run)
    assert step.status == StepStatus.FAILED
    assert step.error["message"] == "bad byte \\x00 here"
    assert len(_attempts(run.id)) == 3


def test_lone_surrogate_in_an_error_message_is_stored_escaped():
    vw.RAISE["lookup"] = [ValueError("file \udcff.txt \x00")]
    vw.RETURN["lookup"] = "ok"
    run = drive(durable.start("values.lookup").id)
    assert run.status == RunStatus.SUCCEEDED
    (attempt,) = _attempts(run.id)
    assert attempt.message == "file \\udcff.txt \\x00"


# --- model-recoverable details that the codec cannot store --------------------------------


class Unstorable:
    def __repr__(self) -> str:
        return "<Unstorable>"


def test_model_recoverable_details_that_cannot_be_stored_stay_model_recoverable():
    import collections

    import pydantic

    class Item(pydantic.BaseModel):
        sku: str
        qty: int

    details = collections.OrderedDict(
        items=[1, Item(sku="a\x00b", qty=2), ValueError("no \x00"), Unstorable()],
        ratio=float("inf"),
        big=2**70,
    )
    vw.RAISE["check"] = [durable.ModelRecoverableError("fix the items", details=details)]
    run = drive(durable.start("values.step", {"label": "check"}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    rendered = {
        "items": [1, {"sku": "a\x00b", "qty": 2}, "ValueError: no \x00", "<Unstorable>"],
        "ratio": float("inf"),
        "big": 2**70,
    }
    assert run.output_value() == {"message": "fix the items", "details": rendered}
    ((_, seen),) = vw.SEEN
    assert seen.details == rendered and type(seen.details) is dict
    step = Step.objects.get(run=run)
    assert step.error["classification"] == "model_recoverable"
    assert step.error["details_note"].startswith(
        "step 'check': cannot store step output.details: type OrderedDict"
    )
    # a replay returns what the first execution returned
    assert step.output_value()["details"] == rendered


def test_model_recoverable_details_over_the_payload_limit_stay_model_recoverable(settings):
    settings.DURABLE = {**settings.DURABLE, "MAX_PAYLOAD_BYTES": 10_000}
    vw.RAISE["check"] = [durable.ModelRecoverableError("too much", details="x" * 20_000)]
    run = drive(durable.start("values.step", {"label": "check"}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert out["message"] == "too much"
    assert out["details"].startswith(
        "<details not stored: step 'check': step output is 20072 bytes, over the payload limit"
    )


# --- S26: a write that happened but whose result cannot be stored --------------------------


def test_unsafe_write_with_an_unstorable_result_waits_for_an_operator_who_records_it():
    from durable.models import Operation, OperationStatus, Wait, WaitKind, WaitStatus
    from durable.services import runs as services

    vw.RETURN["refund"] = Unstorable()
    run = drive(durable.start("values.refund").id)
    assert run.status == RunStatus.WAITING
    assert len(vw.EFFECTS) == 1
    assert vw.SEEN == []  # the workflow never saw a value
    op = Operation.objects.get(run=run)
    assert op.status == OperationStatus.UNKNOWN and op.result is None
    assert op.error["type"] == "ResultNotStorable"
    assert "cannot store step output" in op.error["message"]
    wait = Wait.objects.get(run=run, kind=WaitKind.RECONCILE, status=WaitStatus.PENDING)
    assert "happened" in wait.title
    step = Step.objects.get(run=run)
    assert step.status == StepStatus.WAITING

    services.operation_reconcile(
        operation_id=op.pk, outcome="happened", result={"refund_id": "re_1"}, by="ops"
    )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"refund": {"refund_id": "re_1"}}
    assert vw.SEEN == [("refund", {"refund_id": "re_1"})]
    assert len(vw.EFFECTS) == 1  # never repeated
    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED


def test_unstorable_write_result_is_recorded_from_the_reconcile_hook():
    vw.RETURN["refund"] = Unstorable()
    vw.RETURN["reconciled"] = {"refund_id": "re_2"}
    run = drive(durable.start("values.refund_reconciled").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"refund": {"refund_id": "re_2"}}
    assert len(vw.EFFECTS) == 1


def test_unstorable_write_result_and_an_unstorable_reconcile_answer_wait_for_an_operator():
    vw.RETURN["refund"] = Unstorable()
    vw.RETURN["reconciled"] = Unstorable()
    run = drive(durable.start("values.refund_reconciled").id)
    assert run.status == RunStatus.WAITING
    assert vw.SEEN == []


def test_idempotent_write_with_an_unstorable_result_never_gives_the_workflow_none():
    vw.RETURN["upsert"] = Unstorable()
    run = drive(durable.start("values.upsert").id)
    assert run.status == RunStatus.WAITING
    assert vw.SEEN == []
    from durable.models import Operation, OperationStatus

    assert Operation.objects.get(run=run).status == OperationStatus.UNKNOWN


def test_unstorable_step_result_fails_the_step_naming_the_path():
    vw.RETURN["s"] = {"rows": [1, 2, Unstorable()]}
    run = drive(durable.start("values.step", {"label": "s"}).id)
    assert run.status == RunStatus.FAILED
    assert run.error["classification"] == "permanent"
    assert run.error["message"].startswith(
        "step 's': cannot store step output.rows[2]: type Unstorable"
    )
    assert run.error["step_id"] == "s"


def test_a_write_recorded_succeeded_without_a_result_asks_an_operator_on_resume():
    """Rows written before results were checked: 'succeeded' with no result is not None."""
    from durable.models import Operation, OperationStatus
    from durable.services import runs as services

    vw.RETURN["refund"] = Unstorable()
    run = drive(durable.start("values.refund").id)
    op = Operation.objects.get(run=run)
    # what the ledger used to record, and a run failed on it
    Operation.objects.filter(pk=op.pk).update(
        status=OperationStatus.SUCCEEDED, result=None, resolution="result too large to store"
    )
    Run.objects.filter(pk=run.id).update(status=RunStatus.FAILED)
    Step.objects.filter(run=run).update(status=StepStatus.FAILED)
    durable.resume(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.WAITING
    assert vw.SEEN == []
    assert len(vw.EFFECTS) == 1
    services.operation_reconcile(operation_id=op.pk, outcome="happened", result={"id": "r"})
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert vw.SEEN == [("refund", {"id": "r"})]


def test_enum_members_in_json_columns_are_stored_as_their_plain_values():
    """The vocabularies are str enums; a member that reaches a JSON column (an event's
    data, an error dict) is stored as its value, never as its repr."""
    import enum

    from durable.values.fields import storable_json
    from durable.vocabulary import Classification, EventKind, StepKind

    class Level(enum.IntEnum):
        HIGH = 3

    stored = storable_json(
        {
            "kind": StepKind.STEP,
            EventKind.FAILED: [Classification.TRANSIENT, Level.HIGH],
            Level.HIGH: 1.5,
        }
    )
    assert stored == {"kind": "step", "failed": ["transient", 3], "3": 1.5}
    assert all(type(v) is str for v in (stored["kind"], *stored["failed"][:1]))
    assert type(stored["failed"][1]) is int


def test_no_stored_event_or_error_holds_an_enum_repr():
    """After runs that succeed, retry and fail, no JSON the engine wrote spells an
    enum member's repr (``StepKind.STEP``) where its value belongs."""
    import json

    vw.RAISE["boom"] = [ValueError("boom")]
    failed = drive(durable.start("values.raise").id)
    assert failed.status == RunStatus.FAILED
    vw.RAISE["boom"] = [durable.ModelRecoverableError("fix it", details={"k": 1})]
    done = drive(durable.start("values.raise").id)
    assert done.status == RunStatus.SUCCEEDED
    stored = [e.data for e in TraceEvent.objects.filter(run__in=[failed, done])]
    stored += [r.error for r in Run.objects.filter(pk__in=[failed.pk, done.pk])]
    stored += [s.error for s in Step.objects.filter(run__in=[failed, done])]
    text = json.dumps(stored)
    for enum_name in ("StepKind.", "EventKind.", "Classification.", "RunStatus.", "Safety."):
        assert enum_name not in text, text
    kinds = [e.data["kind"] for e in TraceEvent.objects.filter(run=done, kind="step_executed")]
    assert kinds == ["step"]
    assert StepAttempt.objects.filter(run=failed).count() == 1


# --- identifiers longer than their columns: refused the same on both databases ------------


def test_a_step_id_longer_than_its_column_fails_the_run_with_a_clear_error():
    ok = drive(durable.start("values.named_steps", {"sid": "s" * 253, "times": 9}).id)
    assert ok.status == RunStatus.SUCCEEDED  # "s"*253 + "#9" is 255 characters
    run = drive(durable.start("values.named_steps", {"sid": "s" * 253, "times": 10}).id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "ValueError"
    assert (
        "is 256 characters; a step id (with its #n occurrence suffix) is at most 255"
        in (run.error["message"])
    )
    assert Step.objects.filter(run=run).count() == 9  # the nine before it are kept


def test_an_actor_name_longer_than_its_column_is_refused_before_anything_is_written():
    from tests import waits_workflows  # noqa: F401  (registers tests.signal)

    run = drive(durable.start("tests.signal", {}).id)
    events = TraceEvent.objects.filter(run=run).count()
    for act in (
        lambda: durable.cancel(run.id, by="x" * 201),
        lambda: durable.signal(run.id, "go", {}, by="x" * 201),
        lambda: durable.resume(run.id, by="x" * 201),
    ):
        with pytest.raises(ValueError, match="who acted is at most 200 characters, got 201"):
            act()
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING
    assert TraceEvent.objects.filter(run=run).count() == events
    assert durable.cancel(run.id, by="x" * 200).status == RunStatus.CANCELLED
