"""A run's lanes: its own steps on one lane, each call of a parallel group and each child
run on a lane of its own, on one time axis (issue 31, item 3)."""

from __future__ import annotations

import importlib
import re

import pytest
from django.db.models import Q

import durable
from dashboard import selectors
from durable.models import Run, RunStatus, Step
from durable.testing import drive
from tests.durable.runtime import child_workflows as cwf

pytestmark = pytest.mark.django_db(transaction=True)
#: the module that draws the lanes
run_detail_module = importlib.import_module("dashboard.selectors.trace")


def _lanes(page: str) -> list[tuple[str, str, int]]:
    """(kind, label text, bars) of each lane drawn."""
    section = page.split('id="lanes-title"', 1)[1].split("</section>", 1)[0]
    out = []
    for kind, body in re.findall(r'<li class="lane lane-(\w+)">(.*?)</li>', section, re.S):
        label = re.sub(r"<[^>]+>", "", body.split("</span>", 1)[0]).strip()
        out.append((kind, label, body.count("<rect ")))
    return out


def test_a_parallel_run_draws_a_lane_per_call(viewer_client):
    run = drive(durable.start("dash.parallel", {}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    lanes = _lanes(viewer_client.get(f"/runs/{run.id}/").content.decode())
    calls = sorted(
        Step.objects.filter(run=run, step_id__contains="[").values_list("step_id", flat=True)
    )
    assert sorted(label for kind, label, _ in lanes if kind == "call") == calls
    assert all(bars == 1 for kind, _, bars in lanes if kind == "call")
    # every step of this workflow is a call of a group: no lane of its own steps
    assert not Step.objects.filter(run=run).exclude(step_id__contains="[").exists()
    assert [kind for kind, _, _ in lanes] == ["call"] * len(calls)


def test_a_parent_draws_its_children_as_linked_lanes():
    cwf.reset()
    run = durable.start(
        "tests.children.parent",
        {"items": [{"n": 1, "id": "first"}, {"n": 2, "id": "second", "fail": True}]},
    )
    for _ in range(5):
        for r in Run.objects.filter(Q(pk=run.id) | Q(parent_run=run.id)):
            if r.status in (RunStatus.PENDING, RunStatus.RETRYING):
                drive(r.id)
    parent = Run.objects.get(pk=run.id)
    detail = selectors.run_detail(parent)
    assert detail.lanes is not None
    children = [lane for lane in detail.lanes.lanes if lane.kind == "child"]
    assert {lane.href for lane in children} == {f"{run.id}.first", f"{run.id}.second"}
    statuses = {lane.href: lane.segments[0].status for lane in children}
    assert statuses[f"{run.id}.second"] == RunStatus.FAILED
    for lane in detail.lanes.lanes:
        for seg in lane.segments:
            assert 0 <= seg.left <= 100 and 0 < seg.width and seg.left + seg.width <= 100.01
    cwf.reset()


def test_a_plain_run_has_no_lanes_and_many_lanes_are_capped(viewer_client, monkeypatch):
    plain = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    assert 'id="lanes-title"' not in viewer_client.get(f"/runs/{plain.id}/").content.decode()
    run = drive(durable.start("dash.parallel", {}).id)
    monkeypatch.setattr(run_detail_module, "LANES_SHOWN", 2)
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert len(_lanes(page)) == 2
    total = Step.objects.filter(run=run, step_id__contains="[").count()
    assert f"{total - 2} more lane" in page
