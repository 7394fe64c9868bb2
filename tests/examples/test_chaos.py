"""The chaos audit (``manage.py durable_chaos``) as a test: runs on workers SIGKILLed at
random must leave zero duplicate refunds, tickets, orders and emails, lose no run and end
as their kind expects.

The CI-sized audit runs 24 runs of the eight kinds (support, invoice, procurement, and
examples/chaos_agents.py's fanout, family, limited, scheduled and cascade: a parallel
group of writes, a parent with two child runs, calls under a shared limit, runs started by
a schedule, a parent cancelled mid-flight and compensated) with a kill about every 2 s and
5 % of the payments service's writes answered with 429, 503 or commit-then-drop; every
run's end is also delivered as a webhook to the payments service's receiver, and the
shared limit is measured at the service. The 200-run
audit is ``@pytest.mark.slow``. Restarting PostgreSQL and Redis half way is opt-in
(``DURABLE_CHAOS_RESTART_SERVICES=1``): it restarts the machine's services, which only
CI owns.
"""

from __future__ import annotations

import contextlib
import os
import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from durable.models import Run
from examples.chaos import restart_services, run_chaos


def assert_clean(report) -> None:
    """No duplicate, loss or failed check, and every run ended as its kind expects
    (``report.failed`` lists the others; a cascade ends cancelled or compensated)."""
    assert report.ok, report.table()
    assert not report.failed, report.table()
    assert report.kills > 0, report.table()


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
@pytest.mark.timeout(240)
def test_chaos_audit_of_24_runs_with_kills_is_clean(proc_env):
    out = StringIO()
    with contextlib.suppress(CommandError):  # the table says what failed
        call_command(
            "durable_chaos",
            "--runs",
            "24",
            "--kill-every",
            "2",
            "--workers",
            "3",
            "--timeout",
            "170",
            "--seed",
            "5",
            "--service-faults",
            "0.05",
            stdout=out,
        )
    text = out.getvalue()
    print(text)
    assert "AUDIT CLEAN: zero duplicates, zero losses" in text, text
    assert "FAIL" not in text, text
    # of the 24: 3 of each of the 8 kinds; 3 examples.scheduled runs are the schedule's
    # slots, the 3 examples.cascade runs are cancelled (2 compensated after), the other 18
    # succeed; each family run is the parent of two child runs, each cascade too
    top = Run.objects.filter(id__startswith="chaos-", parent_run__isnull=True)
    assert top.filter(status="succeeded").count() == 18, text
    cascades = top.filter(workflow_name="examples.cascade")
    assert sorted(cascades.values_list("status", flat=True)) == [
        "cancelled",
        "compensated",
        "compensated",
    ], text
    assert Run.objects.filter(id__startswith="schedule.chaos-", status="succeeded").count() == 3
    family = Run.objects.filter(parent_run__workflow_name="examples.family")
    assert family.filter(status="succeeded").count() == 6, text
    assert re.search(r"schedule slots fired / expected +3 / 3  ok", text), text


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_chaos_audit_of_200_runs_with_kills_is_clean(proc_env, request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("a 200-run soak: opt-in with pytest -m slow")
    report = run_chaos(
        runs=200, kill_every=3.0, workers=4, timeout=1500, seed=200, service_faults=0.05
    )
    print(report.table())
    assert_clean(report)


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
@pytest.mark.skipif(
    os.environ.get("DURABLE_CHAOS_RESTART_SERVICES") != "1",
    reason="restarts the machine's PostgreSQL and Redis: opt-in with "
    "DURABLE_CHAOS_RESTART_SERVICES=1 (CI)",
)
@pytest.mark.timeout(600)
def test_chaos_audit_survives_postgres_and_redis_restarts(proc_env, settings):
    if connection.vendor != "postgresql" or not str(settings.CELERY_BROKER_URL).startswith(
        "redis://"
    ):
        pytest.skip("needs the PostgreSQL + Redis configuration")
    report = run_chaos(
        runs=24, kill_every=2.0, workers=3, timeout=480, seed=7, midway=restart_services
    )
    print(report.table())
    assert report.restarts == 1
    assert_clean(report)


def test_the_audit_fails_on_a_duplicate_or_a_lost_run():
    from examples.chaos import Report

    clean = Report(runs={"r1": "support"}, kills=3)
    clean.statuses["succeeded"] = 1
    assert clean.ok and "AUDIT CLEAN" in clean.table()

    dup = Report(runs={"r1": "support"})
    dup.duplicates["refund"].append("r1 x2")
    assert not dup.ok
    assert "AUDIT FAILED: duplicate refund: r1 x2" in dup.table()

    lost = Report(runs={"r1": "support", "r2": "invoice"}, lost=["r2"], not_terminal=["r1"])
    assert not lost.ok
    table = lost.table()
    assert "lost: r2" in table and "not terminal: r1" in table

    over = Report(runs={"r1": "limited"}, limit=(3, 2, 9))
    over.violations["shared limit exceeded"].append("3 limited calls in flight at once")
    assert not over.ok
    table = over.table()
    assert "AUDIT FAILED: shared limit exceeded: 3 limited calls" in table
    assert re.search(r"shared limit: max in flight / max per second +3 / 2  FAIL", table)


def test_the_limit_check_counts_requests_in_flight_and_per_second_at_the_service():
    from examples.chaos import Report
    from examples.chaos_checks import check_limit

    def request(arrived, ended, subject="r1 limited 0"):
        return {"path": "/v1/tickets", "subject": subject, "arrived": arrived, "ended": ended}

    held = Report()
    # three overlapping at 0.5 s; a ticket that is not a limited call does not count
    check_limit(
        held,
        [request(0.0, 1.0), request(0.2, 0.6), request(0.5, 0.7), request(0.5, 0.9, "r1 x")],
    )
    assert held.limit == (3, 3, 3)
    assert held.violations["shared limit exceeded"]
    spread = Report()
    check_limit(spread, [request(t, t + 0.1) for t in (0.0, 0.4, 0.8, 1.2, 1.6, 2.0)])
    assert spread.limit == (1, 3, 6) and not spread.violations["shared limit exceeded"]
    burst = Report()
    four = [request(t, t + 0.01) for t in (0.0, 0.3, 0.6, 0.9)]
    check_limit(burst, four)
    assert burst.limit[1] == 4 and burst.violations["shared limit exceeded"]
    # the engine admitted them 1.1 s apart: the calls reached the service late
    late = Report()
    check_limit(late, four, admissions=[-0.3, 0.2, 0.6, 0.85])
    assert late.limit_admitted == 3 and not late.violations["shared limit exceeded"]
    assert late.limit_late and "late limited calls" in late.table()
    # the engine admitted four within the window: its fault
    over = Report()
    check_limit(over, four, admissions=[0.0, 0.3, 0.6, 0.9])
    assert over.limit_admitted == 4 and over.violations["shared limit exceeded"]


def test_every_kind_has_its_expected_effects_and_a_child_counts_for_its_parent():
    from examples.chaos import EXPECTED, KINDS
    from examples.chaos_audit import root_run_id
    from examples.chaos_checks import expected_end

    assert set(KINDS) == set(EXPECTED)
    assert {"fanout", "family", "limited", "scheduled", "cascade"} <= set(KINDS)
    assert root_run_id("chaos-20261204-004-family.a") == "chaos-20261204-004-family"
    assert root_run_id("chaos-20261204-000-support") == "chaos-20261204-000-support"
    slot = "schedule.chaos-20261204.20261204T0801Z"
    assert root_run_id(slot) == slot
    assert expected_end("support", {}) == "succeeded"
    assert expected_end("cascade", {"cancel": True}) == "cancelled"
    assert expected_end("cascade", {"cancel": True, "compensate": True}) == "compensated"
