"""A run's page says how it ended (issue 31, item 3): a compensated run shows what was
undone (each compensation step, its write and its result) instead of the red failure
banner, the failure folded below; a failed run says "failed after N attempts", N the
failing step's attempts."""

from __future__ import annotations

import re

import pytest

import durable
from durable.models import Step
from durable.testing import drive
from tests import waits_workflows as ww
from tests.dashboard import dash_workflows as dw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _effects():
    ww.EFFECTS.clear()
    yield
    ww.EFFECTS.clear()


def section(page: str, name: str) -> str:
    return page.split(f'aria-labelledby="{name}"', 1)[1].split("</section>", 1)[0]


def test_a_compensated_run_shows_what_was_undone_not_a_red_banner(viewer_client):
    run = drive(durable.start("tests.charge_then_fail", {}).id)
    assert run.status == "failed"
    durable.compensate(run.id)
    run = drive(run.id)
    assert run.status == "compensated"
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert 'class="run-error"' not in page  # no red banner
    undone = section(page, "undone-title")
    assert "Compensated: what was undone" in undone and "2 writes undone" in undone
    # newest first, each with the write it undid, its status and its result
    assert re.findall(r'undid <span class="mono">([^<]+)</span>', undone) == [
        "waits.charge#2",
        "waits.charge",
    ]
    assert undone.count('class="badge status-succeeded"') == 2
    assert undone.count("The undo returned nothing.") == 2  # waits.charge's undo returns None
    # the failure stays readable, folded
    folded = page.split('<details class="run-error-folded">', 1)[1].split("</details>", 1)[0]
    assert "Why it was compensated" in folded and "PermanentError" in folded
    assert "card declined" in folded and "failed after 1 attempt" in folded


def test_a_failed_run_says_failed_after_n_attempts(viewer_client):
    dw.KNOBS["flaky"] = 99  # every attempt fails: the retries run out
    run = drive(durable.start("dash.flaky", {}).id)
    assert run.status == "failed", run.status
    attempts = Step.objects.get(run=run, step_id="flaky").attempts
    assert attempts == 5
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    banner = page.split('<div class="run-error" role="note">', 1)[1].split("</div>", 1)[0]
    assert "failed after 5 attempts" in banner and "flaky" in banner
    assert "run-error-folded" not in page and 'aria-labelledby="undone-title"' not in page


def test_one_attempt_is_said_in_the_singular(viewer_client):
    run = drive(durable.start("dash.fail", {"why": "card declined"}).id)
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert "failed after 1 attempt<" in page


def test_an_undos_result_and_the_writes_left_are_shown(viewer_client):
    from tests.durable.runtime import compensation_workflows as cw

    cw.reset()
    try:
        cw.PROVIDER["smtp_550"] = True
        run = drive(durable.start("comp.s23", {"charge": "ch_1"}).id)
        assert run.status == "failed", run.status
        durable.compensate(run.id)
        run = drive(run.id)
    finally:
        cw.reset()
    assert run.status == "compensated", run.error
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    undone = section(page, "undone-title")
    assert re.findall(r'undid <span class="mono">([^<]+)</span>', undone) == ["refund"]
    assert "&quot;voided&quot;" in undone or "&#34;voided&#34;" in undone
    assert "Never happened, so nothing to undo" in undone and ">email<" in undone
