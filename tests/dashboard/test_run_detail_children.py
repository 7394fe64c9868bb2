"""The run page shows a run's tree: a child's parent, a parent's children, and the child
a ``ctx.start_child`` step started (a link in its step row)."""

from __future__ import annotations

import pytest
from django.db.models import Q

import durable
from dashboard import selectors
from dashboard.templatetags.dashboard_rows import step_rows
from durable.models import Run, RunStatus
from durable.testing import drive
from tests.durable.runtime import child_workflows as cwf

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def family():
    """A parent with two children, one of which failed (the parent caught nothing)."""
    cwf.reset()
    run = durable.start(
        "tests.children.parent",
        {"items": [{"n": 1, "id": "first"}, {"n": 2, "id": "second", "fail": True}]},
    )
    for _ in range(5):
        for r in Run.objects.filter(Q(pk=run.id) | Q(parent_run=run.id)):
            if r.status in (RunStatus.PENDING, RunStatus.RETRYING):
                drive(r.id)
    yield Run.objects.get(pk=run.id)
    cwf.reset()


def test_a_parent_page_lists_its_children_and_links_them_from_the_steps(viewer_client, family):
    first, second = f"{family.id}.first", f"{family.id}.second"
    assert family.status == RunStatus.FAILED
    page = viewer_client.get(f"/runs/{family.id}/").content.decode()
    assert "Child runs" in page
    section = page.split('id="children-title"', 1)[1].split("</section>", 1)[0]
    for child, status in ((first, "Succeeded"), (second, "Failed")):
        row = section.split(f'id="child-{child}"', 1)[1].split("</tr>", 1)[0]
        assert f'href="/runs/{child}/"' in row and "tests.children.leaf" in row and status in row
    # the start steps link their children
    assert page.count('class="mono child-run"') == 4  # two step rows, two table rows
    assert f'title="Child run">{first}</a>' in page


def test_a_child_page_links_its_parent(viewer_client, family):
    page = viewer_client.get(f"/runs/{family.id}.first/").content.decode()
    assert "Parent run" in page
    assert f'<a class="mono parent-run" href="/runs/{family.id}/">' in page
    assert "Child runs" not in page


def test_child_step_rows_link_their_children(family):
    detail = selectors.run_detail(family)
    rows = detail.steps + detail.tail
    assert [row.child for row in rows if row.child] == [f"{family.id}.first", f"{family.id}.second"]
    html = str(step_rows(rows, family))
    for child in (f"{family.id}.first", f"{family.id}.second"):
        link = f'<a class="mono child-run" href="/runs/{child}/" title="Child run">{child}</a>'
        assert link in html
