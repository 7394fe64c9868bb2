"""Finding one's way in a run's trace: filter the steps by status and kind, jump to the
failure, and repeated alike steps folded behind "N more like this" (issue 31)."""

from __future__ import annotations

import re

import pytest

import durable
from dashboard import selectors
from dashboard.selectors.trace import group_of
from durable.models import Step
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)

STEP_ROW = re.compile(r'<li class="step step-[a-z_]+" id="step-(\d+)"')


def _run_with(steps: list[tuple[str, str, str]]):
    """A run of ``dash.echo`` followed by ``steps`` as (step id, kind, status)."""
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    first = Step.objects.filter(run=run).count()
    Step.objects.bulk_create(
        [
            Step(
                run=run,
                step_id=sid,
                position=first + i,
                status=status,
                kind=kind,
                tool_name="dash.lookup" if kind == "tool" else "",
                attempts=1,
                input="{}",
                output="{}" if status == "succeeded" else None,
                error={"type": "ValueError", "message": "no"} if status == "failed" else None,
            )
            for i, (sid, kind, status) in enumerate(steps)
        ]
    )
    return run


def _shown(page: str) -> list[str]:
    pks = [int(pk) for pk in STEP_ROW.findall(page)]
    ids = dict(Step.objects.filter(pk__in=pks).values_list("pk", "step_id"))
    return [ids[pk] for pk in pks]


def _loop(n: int) -> list[tuple[str, str, str]]:
    return [("search" if i == 0 else f"search#{i + 1}", "tool", "succeeded") for i in range(n)]


def test_the_steps_are_filtered_by_status_and_kind(viewer_client):
    run = _run_with([*_loop(3), ("think", "llm", "succeeded"), ("charge", "tool", "failed")])
    page = viewer_client.get(f"/runs/{run.id}/?step_status=failed").content.decode()
    assert _shown(page) == ["charge"]
    total = Step.objects.filter(run=run).count()
    assert f"1 of {total} match" in page
    page = viewer_client.get(f"/runs/{run.id}/?step_kind=llm").content.decode()
    assert _shown(page) == ["think"]
    page = viewer_client.get(f"/runs/{run.id}/?step_kind=wait").content.decode()
    assert _shown(page) == [] and "No step matches these filters." in page
    # the live refresh asks for the same filtered page
    assert f'hx-get="/runs/{run.id}/?step_kind=wait"' in page


@pytest.mark.parametrize(
    "query,named", [("step_status=broken", "step_status"), ("step_kind=%3Cx%3E", "step_kind")]
)
def test_a_filter_value_that_is_not_a_status_or_kind_is_a_400_naming_it(
    viewer_client, query, named
):
    run = _run_with([])
    response = viewer_client.get(f"/runs/{run.id}/?{query}")
    assert response.status_code == 400
    assert named in response.content.decode()
    assert viewer_client.get(f"/runs/{run.id}/steps/?after=0&{query}").status_code == 400


def test_alike_repeated_steps_are_folded_and_can_all_be_shown(viewer_client):
    run = _run_with([*_loop(6), ("charge", "tool", "succeeded")])
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    folded = re.search(
        r'<li class="repeats"><details id="repeats-\d+">(.*?)</ol></details></li>', page, re.S
    )
    assert folded is not None
    assert "5 more tool calls like" in folded.group(1)
    inside = _shown(folded.group(1))
    assert inside == [f"search#{i}" for i in range(2, 7)]
    assert "search" in _shown(page.replace(folded.group(0), ""))  # the first stays out
    everything = viewer_client.get(f"/runs/{run.id}/?repeats=all").content.decode()
    assert 'class="repeats"' not in everything
    assert _shown(everything)[-7:] == [s for s, _, _ in _loop(6)] + ["charge"]


def test_failures_groups_and_short_repeats_are_never_folded():
    def row(sid: str, status: str = "succeeded") -> selectors.StepRow:
        step = Step(step_id=sid, kind="tool", status=status, position=0)
        group = group_of(sid)
        return selectors.StepRow(
            step, None, "", None, None, None, 0, 0, [], group=group, group_size=3 if group else 0
        )

    rows = selectors.fold_repeats([row("a"), row("a#2"), row("b"), row("b#2"), row("b#3")])
    assert [(r.repeats_from, r.repeats_end) for r in rows] == [
        (0, False),
        (0, False),
        (0, False),
        (2, False),
        (0, True),
    ]
    failed = selectors.fold_repeats(
        [row("c", "failed"), row("c#2", "failed"), row("c#3", "failed")]
    )
    assert all(not r.repeats_from for r in failed)
    grouped = [row(f"parallel[{i}]") for i in range(3)]
    assert all(not r.repeats_from for r in selectors.fold_repeats(grouped))


def test_jump_to_the_failure_links_to_it_even_when_the_page_leaves_it_out(viewer_client):
    steps = [(f"s{i}", "tool", "succeeded") for i in range(150)]
    steps[70] = ("charge", "tool", "failed")  # between the first and the last steps shown
    run = _run_with(steps)
    failed = Step.objects.get(run=run, step_id="charge")
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert "charge" not in _shown(page)
    assert f'href="/runs/{run.id}/?step_status=failed#step-{failed.pk}"' in page
    assert f"Jump to the failure (#{failed.position} charge)" in page
    filtered = viewer_client.get(f"/runs/{run.id}/?step_status=failed").content.decode()
    assert _shown(filtered) == ["charge"]
    assert f'href="#step-{failed.pk}"' in filtered  # shown now: a link within the page


def test_load_more_keeps_the_filter(viewer_client):
    steps = [(f"s{i}", "tool" if i % 2 else "llm", "succeeded") for i in range(300)]
    run = _run_with(steps)
    page = viewer_client.get(f"/runs/{run.id}/?step_kind=llm").content.decode()
    gap = re.search(r'hx-get="(/runs/[^"]+/steps/\?[^"]+)"', page)
    assert gap is not None and "step_kind=llm" in gap.group(1)
    more = viewer_client.get(gap.group(1).replace("&amp;", "&"), HTTP_HX_REQUEST="true")
    ids = _shown(more.content.decode())
    assert ids and all(int(sid[1:]) % 2 == 0 for sid in ids)
