"""Run ids that name a dashboard page under ``/runs/`` (``new``, ``compare``, ``bulk``)
are refused wherever a run id is chosen -- the SDK, the API, a fork -- since such a run
would have no page of its own (the outside trial of issue 31: temporalio/ui#1084); and
every fixed page under ``/runs/`` is one of them, so a new page cannot hide a run."""

from __future__ import annotations

import pytest
from django.urls import URLPattern, URLResolver

import durable
from dashboard import urls as dashboard_urls
from durable.models import RESERVED_RUN_IDS, Run
from durable.services.forks import run_fork
from durable.testing import drive


def _fixed_run_pages(patterns, prefix: str = "") -> set[str]:
    found = set()
    for p in patterns:
        route = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            found |= _fixed_run_pages(p.url_patterns, route)
        elif isinstance(p, URLPattern) and route.startswith("runs/"):
            segment = route.split("/")[1]
            if segment and "<" not in segment:
                found.add(segment)
    return found


def test_every_fixed_page_under_runs_is_a_reserved_run_id():
    pages = _fixed_run_pages(dashboard_urls.urlpatterns)
    assert pages, "the dashboard has fixed pages under runs/"
    assert pages <= RESERVED_RUN_IDS, pages - RESERVED_RUN_IDS


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("run_id", sorted(RESERVED_RUN_IDS))
def test_a_reserved_run_id_is_refused_by_the_sdk_the_api_and_a_fork(operator_api, run_id):
    with pytest.raises(ValueError, match=f"run id '{run_id}' is reserved"):
        durable.start("dash.echo", {"n": 1}, run_id=run_id)
    answer = operator_api.post("/runs", {"workflow": "dash.echo", "input": 1, "run_id": run_id})
    assert answer.status_code == 422, answer.content
    assert "reserved" in answer.json()["detail"]
    source = drive(durable.start("dash.echo", {"n": 1}).id)
    with pytest.raises(ValueError, match="reserved"):
        run_fork(run_id=source.id, from_step="echo", new_run_id=run_id)
    assert not Run.objects.filter(pk=run_id).exists()
    # a name that only starts like one is a run id as any other
    assert durable.start("dash.echo", {"n": 1}, run_id=f"{run_id}-1").id == f"{run_id}-1"
