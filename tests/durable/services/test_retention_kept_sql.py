"""``why_kept`` reuses the SQL of the prune's condition (durable/services/retention.py,
``_kept_sql``): the reused SQL answers as the condition built each time, and a keeper
registered or a setting changed later is honoured at once."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Exists, OuterRef
from django.test.utils import CaptureQueriesContext

import durable
from api.models import WebhookSubscription
from durable.models import Run, RunStatus, Wait
from durable.services import retention
from durable.testing import drive
from tests.durable.runtime import child_workflows as cwf

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _reset():
    cwf.reset()
    yield
    cwf.reset()


def _finished() -> Run:
    run = drive(durable.start("tests.children.leaf", {"n": 2}).id)
    assert run.status == RunStatus.SUCCEEDED
    return run


def _built_each_time(run: Run) -> bool:
    return Run.objects.filter(pk=run.pk).filter(retention._blockers()).exists()


def test_the_reused_sql_answers_as_the_condition_built_each_time():
    free = _finished()
    waiting = _finished()
    Wait.objects.create(run=waiting, wait_id="w", position=9, kind="signal", key="k")
    assert retention.why_kept(free) is None
    assert retention.why_kept(waiting) == "it has a pending wait"
    assert retention._kept_sql(connection.alias) is not None  # reused, not rebuilt
    for run in (free, waiting):
        assert retention._is_kept(run) is _built_each_time(run)
    with CaptureQueriesContext(connection) as queries:
        assert retention.why_kept(free) is None
    assert len(queries) == 1


def test_a_keeper_registered_later_is_honoured():
    run = _finished()
    assert retention.why_kept(run) is None
    keeps_all = Exists(Run.objects.filter(pk=OuterRef("pk")))
    retention.register_keeper("tests.all", lambda: keeps_all, lambda r: "tests keep it")
    try:
        assert retention.why_kept(run) == "tests keep it"
    finally:
        retention._KEEPERS.pop("tests.all")
        retention._KEPT_SQL.clear()
    assert retention.why_kept(run) is None


def test_a_changed_setting_is_honoured(settings):
    """The API's keeper keeps a run whose events the outbox has not sent while someone
    listens: an active subscription, or the approval e-mail workflow's setting."""
    settings.DURABLE_APPROVAL_EMAIL_WORKFLOW = ""
    run = _finished()
    assert not WebhookSubscription.objects.exists()
    assert retention.why_kept(run) is None
    settings.DURABLE_APPROVAL_EMAIL_WORKFLOW = "tests.approval_email"
    assert retention._is_kept(run) is True
    settings.DURABLE_APPROVAL_EMAIL_WORKFLOW = ""
    assert retention._is_kept(run) is False


def test_a_condition_that_changes_between_builds_is_built_each_time():
    run = _finished()
    calls = []

    def changing():
        calls.append(1)
        return Exists(Run.objects.filter(pk=OuterRef("pk"), steps_executed__gt=len(calls)))

    retention.register_keeper("tests.changing", changing, lambda r: None)
    try:
        assert retention._kept_sql(connection.alias) is None
        retention._is_kept(run)
        built = len(calls)
        retention._is_kept(run)
        assert len(calls) == built + 1
    finally:
        retention._KEEPERS.pop("tests.changing")
        retention._KEPT_SQL.clear()
