"""Capability 7: a permanent failure says which rule made it permanent on every surface
(docs/architecture.md "Failures and retries": stored error, ``durable show``,
``RunFailed``, API, the ``run.failed`` webhook; a parent's ``ChildFailed`` ends with the
child's), for failures reached through a parallel group and through a child run."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

import durable
from api.webhooks_out import event_of
from durable.client import RunFailed
from durable.models import RunStatus, TraceEvent
from durable.testing import drive
from tests.api.conftest import api_for
from tests.dashboard.conftest import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

RULE = "permanent: PermanentError: the step says retrying cannot help"


def _show_reason(run_id: str) -> str:
    out = StringIO()
    call_command("durable", "show", run_id, stdout=out, stderr=StringIO())
    for line in out.getvalue().split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "reason":
            return value.strip()
    raise AssertionError(f"durable show printed no reason:\n{out.getvalue()}")


def test_a_parallel_groups_failure_for_good_names_its_rule_on_every_surface():
    """nika "a declared retry block silently never fires on a non-transient HTTP failure
    -- ... the run card says [nothing about] why"
    (https://github.com/supernovae-st/nika/issues/1603). One call of a ``ctx.parallel``
    group raises ``PermanentError``: the run's stored error, ``durable show``,
    ``RunFailed``, the API and the ``run.failed`` webhook all carry the rule."""
    run = drive(durable.start("acceptance.parallel_fails", {}).id)
    assert run.status == RunStatus.FAILED, run.status
    reason = run.error.get("reason")
    assert reason and reason.startswith(RULE), run.error
    assert _show_reason(run.id) == reason
    with pytest.raises(RunFailed) as caught:
        durable.result(run.id, timeout=1)
    assert caught.value.reason == reason and reason in str(caught.value)
    body = api_for(make_user("acc-vic", "viewer")).get(f"/runs/{run.id}").json()
    assert body["error"]["reason"] == reason, body["error"]
    failed = TraceEvent.objects.filter(run_id=run.id, kind="failed").get()
    webhook = event_of(failed)
    assert webhook is not None and webhook["data"]["error"].startswith(reason), webhook


def test_a_parents_child_failed_ends_with_the_childs_rule():
    """GameAnalytics "If we run out of retries, tell the end user the full reason for
    failure" (https://github.com/GameAnalytics/current/pull/20). A parent waits on a
    child that fails for good: the parent's error (``ChildFailed``) ends with the child's
    rule, and the parent's own ``reason`` says why the parent's failure is final."""
    parent = drive(durable.start("acceptance.child_fails", {}).id)
    child = drive(f"{parent.id}.bad")
    assert child.status == RunStatus.FAILED
    child_reason = child.error["reason"]
    assert child_reason.startswith(RULE), child.error
    parent = drive(parent.id)
    assert parent.status == RunStatus.FAILED, parent.status
    assert parent.error_type == "ChildFailed", parent.error
    # "ends with the child's": its last words are "(failed for good: <the child's reason>)"
    assert parent.error["message"].endswith(f"(failed for good: {child_reason})"), parent.error
    assert parent.error.get("reason"), parent.error
    assert _show_reason(parent.id) == parent.error["reason"]
