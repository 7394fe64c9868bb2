"""``durable.testing.replay(export)``: a run's audit export replayed against the code
installed now, dry, with the same report as ``manage.py durable replay-check``."""

from __future__ import annotations

import json

import pytest

import durable
from durable.models import Run, RunStatus
from durable.services import export
from durable.testing import drive, replay
from tests.durable import replay_workflows as rw

WORKFLOWS_FILE = rw.__file__


@pytest.fixture(autouse=True)
def _reset():
    rw.reset()
    yield
    rw.reset()


def waiting_export() -> dict:
    run = drive(durable.start("replay.support", {"message": "twice"}, version="1").id)
    assert run.status == RunStatus.WAITING, run.error
    return json.loads(export.to_json(export.export_run(run.id)))


@pytest.mark.django_db(transaction=True)
def test_an_exported_waiting_run_replays_against_unchanged_code_and_a_compatible_edit():
    doc = waiting_export()
    rw.CALLS.clear()
    for edit in (None, "step_after_wait"):
        rw.EDIT["support"] = edit
        report = replay(doc)
        assert report.compatible, report
        assert report.outcome == "continues"
        assert report.continues_at["step_id"] == "approval:refund"
        assert report.continues_at["position"] == 2
        assert report.replayed == 2
    assert rw.CALLS == []


@pytest.mark.django_db(transaction=True)
def test_an_export_names_the_call_added_before_the_wait(tmp_path):
    doc = waiting_export()
    rw.EDIT["support"] = "call_before_wait"
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    for given in (doc, json.dumps(doc), path, str(path)):
        report = replay(given)
        assert not report.compatible
        d = report.divergence
        assert (d.reason, d.position) == ("different_call", 2)
        assert d.expected["step_id"] == "approval:refund"
        assert d.got["step_id"] == "check_fraud"
        assert d.file == WORKFLOWS_FILE
    assert report.to_dict()["run_id"] == doc["run"]["id"]
    assert "diverged" in str(report) and "check_fraud" in str(report)


@pytest.mark.django_db(transaction=True)
def test_the_report_is_the_one_replay_check_gives_for_the_same_run():
    from io import StringIO

    from django.core.management import CommandError, call_command

    doc = waiting_export()
    rw.EDIT["support"] = "tool_renamed"
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("durable", "replay-check", "--json", stdout=out)
    (from_db,) = json.loads(out.getvalue())["groups"][0]["runs"]
    assert replay(doc).to_dict() == from_db


@pytest.mark.django_db(transaction=True)
def test_a_finished_run_completes_and_another_workflow_or_version_can_be_named():
    run = drive(durable.start("replay.support", {"message": "x"}, version="1").id)
    from django.db import transaction

    from durable.models import Wait
    from durable.waits.closing import close_wait_txn

    with transaction.atomic():
        wait = Wait.objects.select_for_update().get(run_id=run.id, status="pending")
        close_wait_txn(wait, status="resolved", result={"approved": True}, by="t")
    assert drive(run.id).status == RunStatus.SUCCEEDED
    doc = export.export_run(run.id)
    assert replay(doc).outcome == "completes"
    # the latest version (2) asks for check_fraud where the history has the lookup
    latest = replay(doc, workflow="replay.support")
    assert latest.version == "2"
    assert latest.divergence.reason == "different_call"
    assert latest.divergence.expected["step_id"] == "replay.lookup"
    assert replay(doc, workflow=rw.support).compatible  # a function, named directly
    Run.objects.filter(pk=run.pk).update(workflow_version="0-retired")
    assert replay(export.export_run(run.id)).divergence.reason == "not_registered"


#: a run's export as ``manage.py durable export`` writes it (the keys replay reads)
EXPORT = {
    "format": "durable.run-export/1",
    "run": {
        "id": "prod-run-1",
        "workflow": "replay.support",
        "version": "1",
        "status": "waiting",
        "input": {"message": "charged twice"},
        "error": None,
    },
    "steps": [
        {
            "position": 0,
            "step_id": "plan",
            "kind": "step",
            "tool": "",
            "status": "succeeded",
            "input": None,
            "output": {"charge": "ch_9", "amount": 10, "why": "x"},
            "error": None,
        },
        {
            "position": 1,
            "step_id": "replay.lookup",
            "kind": "tool",
            "tool": "replay.lookup",
            "status": "succeeded",
            "input": {"charge_id": "ch_9"},
            "output": {"charge_id": "ch_9", "paid": 10},
            "error": None,
        },
    ],  # fmt: skip
    "waits": [
        {"wait_id": "approval:refund", "position": 2, "kind": "approval", "status": "pending"}
    ],
}


def test_a_production_run_is_a_unit_test_without_a_database():
    assert replay(EXPORT).compatible
    rw.EDIT["support"] = "call_before_wait"
    report = replay(EXPORT)
    assert not report.compatible and report.divergence.got["step_id"] == "check_fraud"
    assert rw.CALLS == []


def test_a_document_that_is_not_a_run_export_is_refused():
    with pytest.raises(ValueError, match="not a run export"):
        replay({"format": "something else"})
