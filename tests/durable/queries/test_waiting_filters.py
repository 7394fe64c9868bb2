"""The runs list's "waiting for approval" and "waiting for a limit" filters: the same runs
as the plain EXISTS, in a query PostgreSQL walks in the list's order (issue 31's bench:
as a semi-join the page read every waiting run at 1M runs, 120 ms; see
``durable.queries.runs._kept_as_filter``)."""

from __future__ import annotations

import pytest
from django.db import connection

from durable.models import Run, RunStatus, Wait
from durable.queries.filters import STATUS_APPROVAL, STATUS_LIMIT, RunFilters
from durable.queries.runs import filter_runs

pytestmark = pytest.mark.django_db


def _run(status: str, *waits: tuple[str, str]) -> Run:
    run = Run.objects.create(workflow_name="w", workflow_version="1", status=status)
    for n, (kind, wait_status) in enumerate(waits):
        Wait.objects.create(
            run=run, wait_id=f"{kind}:{n}", position=n, kind=kind, key=str(n), status=wait_status
        )
    return run


def test_the_filters_keep_exactly_the_runs_with_such_a_pending_wait():
    approval = _run(RunStatus.WAITING, ("approval", "pending"), ("signal", "pending"))
    decided = _run(RunStatus.WAITING, ("approval", "resolved"), ("signal", "pending"))
    limit = _run(RunStatus.WAITING, ("limit", "pending"))
    _run(RunStatus.PENDING, ("approval", "pending"))  # not waiting (yet): not listed
    _run(RunStatus.WAITING)
    assert set(filter_runs(RunFilters(status=STATUS_APPROVAL))) == {approval}
    assert set(filter_runs(RunFilters(status=STATUS_LIMIT))) == {limit}
    assert decided not in filter_runs(RunFilters(status=STATUS_APPROVAL))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_postgresql_checks_the_pending_wait_per_run_and_never_as_a_semi_join():
    for status in (STATUS_APPROVAL, STATUS_LIMIT):
        qs = filter_runs(RunFilters(status=status)).order_by("-created_at", "-id")[:51]
        sql, params = qs.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "Semi Join" not in plan, plan
        assert "SubPlan" in plan, plan
