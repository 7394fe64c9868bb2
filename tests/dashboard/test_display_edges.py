"""Values at the edges of what the pages show: a stored error whose message is null, a
step that ends before it starts by another worker's clock, a long run id in the inbox,
and identifiers or names that would not read as what they are (bidirectional overrides,
zero-width and control characters). Found by an outside trial of the dashboard rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

import durable
from dashboard import selectors
from dashboard.templatetags.dashboard_rows import approval_items, step_rows
from durable.exceptions import InvalidIdentifier
from durable.models import Run, RunStatus, Step, StepStatus
from durable.services.base import actor_of
from durable.testing import drive
from durable.values.fields import hidden_character

pytestmark = pytest.mark.django_db(transaction=True)


def make_run(rid: str, **fields) -> Run:
    now = timezone.now()
    defaults = dict(
        workflow_name="dash.echo",
        workflow_version="1",
        status=RunStatus.FAILED,
        input="{}",
        input_hash="h",
        created_at=now - timedelta(minutes=5),
        started_at=now - timedelta(minutes=5),
        finished_at=now,
    )
    return Run.objects.create(id=rid, **{**defaults, **fields})


def test_a_null_error_message_shows_as_nothing_on_the_run_page_and_its_steps(operator_client):
    run = make_run("null-message", error={"type": "Boom", "message": None})
    Step.objects.create(
        run=run,
        step_id="s1",
        position=0,
        status=StepStatus.FAILED,
        error={"type": "Boom", "message": None, "classification": "permanent"},
        finished_at=timezone.now(),
    )
    page = operator_client.get(reverse("dashboard:run", args=[run.id])).content.decode()
    assert "Boom" in page
    assert ">None<" not in page and ": None</p>" not in page
    rows = selectors.run_detail(run).steps
    html = str(step_rows(rows, run))
    assert '<p class="step-error"><span class="mono">Boom</span>' in html
    assert "None" not in html

    cancelled = make_run("null-cancel", status=RunStatus.CANCELLED, error={"type": "Cancelled"})
    page = operator_client.get(reverse("dashboard:run", args=[cancelled.id])).content.decode()
    assert "<strong>Cancelled</strong>" in page and "None" not in page.split("run-note", 1)[1][:200]


def test_a_step_that_ends_before_it_starts_by_another_clock_lasts_zero():
    run = make_run("skewed")
    now = timezone.now()
    step = Step.objects.create(
        run=run,
        step_id="s1",
        position=0,
        status=StepStatus.SUCCEEDED,
        started_at=now,
        finished_at=now - timedelta(seconds=5),
    )
    assert step.duration == 0.0
    html = str(step_rows(selectors.run_detail(run).steps, run))
    assert '<span class="dur">0 ms</span>' in html and "-5000" not in html


def test_the_inbox_shows_a_long_run_id_short_with_the_whole_id_as_its_title(approver):
    run_id = "refund-ticket-4242-for-a-customer-with-a-very-long-name-20261204"
    drive(durable.start("tests.approval", {"budget": 1}, run_id=run_id).id)
    items, _total = selectors.inbox(approver)
    html = str(approval_items(items, None, "tok"))
    assert f'title="{run_id}"' in html
    shown = html.split(f'title="{run_id}">', 1)[1].split("</a>", 1)[0]
    assert shown.endswith("…") and len(shown) <= 32


HIDDEN = ["\u202e", "\u2066", "\u200b", "\u200f", "\ufeff", "\n", "\x1b", "\u2028"]


@pytest.mark.parametrize("char", HIDDEN)
def test_identifiers_and_names_that_would_not_read_as_themselves_are_refused(char):
    bad = f"invoice{char}fdp"
    with pytest.raises(InvalidIdentifier) as caught:
        durable.start("dash.echo", {}, tags=["ok", bad])
    assert f"U+{ord(char):04X}" in str(caught.value) and "tag" in str(caught.value)
    assert "character 8" in str(caught.value)
    with pytest.raises(InvalidIdentifier, match="name of who acts"):
        durable.start("dash.echo", {}, started_by=bad)
    assert not Run.objects.exists()  # nothing was written
    run = durable.start("dash.echo", {}, tags=["plain", "café", "日本"], started_by="os:zoë")
    with pytest.raises(InvalidIdentifier, match="signal name"):
        durable.signal(run.id, bad, {})
    with pytest.raises(InvalidIdentifier, match="name of who acts"):
        actor_of(bad)
    with pytest.raises(ValueError):
        durable.cancel(run.id, reason="no", by=bad)
    assert Run.objects.get(pk=run.id).status != RunStatus.CANCELLED


def test_hidden_character_finds_the_first_one_and_lets_letters_of_any_script_pass():
    assert hidden_character("plain-ascii_1.2") is None
    assert hidden_character("café 日本 עברית العربية") is None  # right-to-left letters are fine
    assert hidden_character("a\tb") == (1, "\t")
    assert hidden_character("ab\u202ec\u2066") == (2, "\u202e")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 ms"),
        (0.000216, "0.22 ms"),  # a no-op step: not "0 ms"
        (0.0045, "4.5 ms"),
        (0.85, "850 ms"),
        (0.9996, "1.0 s"),  # not "1000 ms"
        (4.2, "4.2 s"),
        (75, "1 min 15 s"),
        (timedelta(microseconds=90), "0.09 ms"),
    ],
)
def test_durations_under_a_millisecond_are_shown_as_such(seconds, shown):
    from dashboard.templatetags.dashboard_tags import duration

    assert duration(seconds) == shown
