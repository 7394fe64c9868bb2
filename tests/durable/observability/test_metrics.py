"""Metrics (durable/observability/metrics.py, GET /metrics): counted where the engine commits, the
state read at scrape time, and the endpoint closed to anyone without a token or a
viewer's login."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from prometheus_client import REGISTRY

import durable
from durable.exceptions import LeaseLost
from durable.models import Run, RunStatus
from durable.observability import metrics
from durable.observability.scrape import broker_queue_depths
from durable.testing import drive
from tests import waits_workflows  # noqa: F401  (registers tests.approval)
from tests.durable import cli_workflows as cw
from tests.durable import engine_workflows as ew

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    cw.reset()
    ew.reset()
    yield
    cw.reset()
    ew.reset()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_executed_steps_failures_and_checkpoints_are_counted():
    executed = sample("durable_steps_executed_total", kind="tool")
    transient = sample("durable_attempts_failed_total", classification="transient", retried="True")
    checkpoints = sum(
        sample("durable_checkpoint_seconds_count", path=p) for p in ("orm", "one_statement")
    )
    cw.FAILURES["cli_lookup"] = 2
    run = drive(durable.start("cli.lookup", {"query": "m"}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error

    assert sample("durable_steps_executed_total", kind="tool") == executed + 1
    assert (
        sample("durable_attempts_failed_total", classification="transient", retried="True")
        == transient + 2
    )
    after = sum(
        sample("durable_checkpoint_seconds_count", path=p) for p in ("orm", "one_statement")
    )
    assert after >= checkpoints + 3  # two failures, the step (and the run's end)


def test_a_recovery_and_its_replayed_steps_are_counted():
    recoveries = sample("durable_recoveries_total")
    replayed = sample("durable_steps_replayed_total", kind="step")
    ew.FLAGS["crash:after_two"] = True
    run = durable.start("eng.three_steps", {"policy": "fast"})
    with pytest.raises(ew.Crash):
        drive(run.id)
    ew.expire_lease(run.id)
    assert drive(run.id).status == RunStatus.SUCCEEDED

    assert sample("durable_recoveries_total") == recoveries + 1
    assert sample("durable_steps_replayed_total", kind="step") == replayed + 2


def test_a_lost_lease_is_counted_and_still_raised():
    lost = sample("durable_lease_losses_total")
    with pytest.raises(LeaseLost), metrics.checkpoint():
        raise LeaseLost()
    assert sample("durable_lease_losses_total") == lost + 1


def scrape(client: Client, **headers: str):
    return client.get("/metrics", **headers)


def test_metrics_endpoint_needs_a_token_or_a_viewer(settings):
    settings.DURABLE = {**settings.DURABLE, "METRICS_TOKEN": "s3cret-token"}
    anonymous = scrape(Client())
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    assert scrape(Client(), HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert scrape(Client(), HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200

    nobody = Client()
    nobody.force_login(User.objects.create_user("nobody", password="x"))
    assert scrape(nobody).status_code == 403
    viewer = User.objects.create_user("viewer", password="x")
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client = Client()
    client.force_login(viewer)
    assert scrape(client).status_code == 200


def test_without_a_token_no_bearer_is_accepted(settings):
    settings.DURABLE = {**settings.DURABLE, "METRICS_TOKEN": ""}
    assert scrape(Client(), HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_the_scrape_shows_runs_waits_approvals_unknown_writes_and_the_queue(settings):
    settings.DURABLE = {**settings.DURABLE, "METRICS_TOKEN": "t"}
    drive(durable.start("cli.echo", {"x": 1}).id)
    drive(durable.start("tests.approval", {"n": 1}).id)  # waits for an approval
    cw.FAILURES["cli_charge"] = 1
    drive(durable.start("cli.charge", {"amount": 2}).id)  # waits for a reconcile decision

    response = scrape(Client(), HTTP_AUTHORIZATION="Bearer t")
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'durable_runs{status="succeeded"} 1.0' in text
    assert 'durable_runs{status="waiting"} 2.0' in text
    assert 'durable_waits_pending{kind="approval"} 1.0' in text
    assert 'durable_waits_pending{kind="reconcile"} 1.0' in text
    assert 'durable_wait_oldest_age_seconds{kind="approval"}' in text
    assert "durable_approvals_pending 1.0" in text
    assert "durable_operations_unknown 1.0" in text
    assert 'durable_approval_decision_seconds_bucket{le="+Inf"}' in text
    assert "durable_checkpoint_seconds_bucket" in text
    assert "durable_steps_executed_total" in text
    assert "durable_broker_queue_depth" in text  # the HELP line, whatever the broker
    assert Run.objects.count() == 3


def test_the_queue_depth_of_the_configured_broker_is_read():
    depths = broker_queue_depths()
    assert set(depths) <= {"celery"}
    assert all(isinstance(n, int) and n >= 0 for n in depths.values())
