"""The runs list's indexed paths (migration durable.0009): the duration sort over finished
and unfinished runs, text search, and that PostgreSQL's planner can use the indexes."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard import selectors
from durable.models import Run, RunStatus
from durable.queries.runs import RunFilters, runs_page

pytestmark = pytest.mark.django_db(transaction=True)

INDEXES = {
    "run_search_id_trgm",
    "run_search_tags_trgm",
    "run_search_input_trgm",
    "run_search_output_trgm",  # 0020: search in outputs too
    "run_duration_idx",
    "run_unfinished_start_idx",
    "run_failed_finished_idx",
}


def make_run(rid: str, *, start, end=None, status=None, created=None, **fields) -> Run:
    status = status or (RunStatus.SUCCEEDED if end else RunStatus.WAITING)
    return Run.objects.create(
        id=rid,
        workflow_name="dash.echo",
        workflow_version="1",
        status=status,
        input=fields.pop("input", '{"n": 1}'),
        input_hash="h",
        created_at=created or start or timezone.now(),
        started_at=start,
        finished_at=end,
        **fields,
    )


@pytest.fixture
def timed_runs():
    """Finished and unfinished runs at a fixed ``now``, with ties across the two sets."""
    now = timezone.now().replace(microsecond=250_000)
    hour = timedelta(hours=1)
    # finished: duration = finished_at - started_at
    make_run("f-10h", start=now - 20 * hour, end=now - 10 * hour)
    make_run("f-3h", start=now - 30 * hour, end=now - 27 * hour)
    make_run("f-2h-a", start=now - 5 * hour, end=now - 3 * hour)
    make_run("f-1s", start=now - hour, end=now - hour + timedelta(seconds=1))
    # a finished run never started (cancelled while pending): from its creation
    make_run("f-nostart-4h", start=None, created=now - 9 * hour, end=now - 5 * hour)
    # unfinished: duration = now - COALESCE(started_at, created_at)
    make_run("u-2d", start=now - 48 * hour, status=RunStatus.RUNNING, **_lease(now))
    make_run("u-2h-b", start=now - 2 * hour)  # ties with f-2h-a on the duration
    make_run("u-5m", start=now - timedelta(minutes=5))
    make_run("u-pending-7h", start=None, created=now - 7 * hour, status=RunStatus.PENDING)
    expected = [
        "u-2d",
        "f-10h",
        "u-pending-7h",
        "f-nostart-4h",
        "f-3h",
        "u-2h-b",
        "f-2h-a",
        "u-5m",
        "f-1s",
    ]
    return now, expected


def _lease(now):
    return {"lease_token": "t" * 32, "lease_expires_at": now + timedelta(hours=1)}


def walk(sort: str, now, page_size: int) -> list[list[str]]:
    pages, after = [], ""
    while True:
        page = runs_page(RunFilters(sort=sort), after=after, page_size=page_size, now=now)
        pages.append([row.run.id for row in page.rows])
        if not page.next_cursor:
            return pages
        after = page.next_cursor


@pytest.mark.parametrize("page_size", [1, 2, 4, 50])
def test_duration_sort_orders_finished_and_unfinished_runs_together(timed_runs, page_size):
    """Longest first: finished runs by finished_at - start, unfinished ones by how long
    they have run until now; the same order page after page, in both directions."""
    now, expected = timed_runs
    longest = walk("-duration", now, page_size)
    assert [rid for page in longest for rid in page] == expected
    assert all(len(page) == page_size for page in longest[:-1])
    shortest = walk("duration", now, page_size)
    assert [rid for page in shortest for rid in page] == list(reversed(expected))


def test_duration_sort_walks_back_with_previous(timed_runs):
    now, expected = timed_runs
    first = runs_page(RunFilters(sort="-duration"), page_size=3, now=now)
    second = runs_page(RunFilters(sort="-duration"), after=first.next_cursor, page_size=3, now=now)
    third = runs_page(RunFilters(sort="-duration"), after=second.next_cursor, page_size=3, now=now)
    assert [r.run.id for r in third.rows] == expected[6:]
    back = runs_page(RunFilters(sort="-duration"), before=third.prev_cursor, page_size=3, now=now)
    assert [r.run.id for r in back.rows] == expected[3:6]
    back = runs_page(RunFilters(sort="-duration"), before=back.prev_cursor, page_size=3, now=now)
    assert [r.run.id for r in back.rows] == expected[:3]
    assert back.prev_cursor == ""


def test_duration_sort_keeps_filters(timed_runs):
    now, _ = timed_runs
    page = runs_page(RunFilters(sort="-duration", status="waiting"), now=now)
    assert [r.run.id for r in page.rows] == ["u-2h-b", "u-5m"]
    page = runs_page(RunFilters(sort="duration", q="f-"), now=now)
    assert [r.run.id for r in page.rows] == ["f-1s", "f-2h-a", "f-3h", "f-nostart-4h", "f-10h"]


def test_duration_sort_page_costs_three_queries(timed_runs, django_assert_num_queries):
    now, _ = timed_runs
    with django_assert_num_queries(3):  # finished runs, unfinished runs, their waits
        runs_page(RunFilters(sort="-duration"), page_size=4, now=now)


SEARCH_CASES = [
    ("ORDER-77", ["case-id-Order-77"]),  # the id, any case
    ("order-77", ["case-id-Order-77"]),
    ("Refund", ["case-tag", "case-input"]),  # a tag and an input's text
    ("50%", ["percent"]),  # LIKE's wildcards are literal characters
    ("a_b", ["underscore"]),
    ("ab", ["case-input"]),  # shorter than a trigram
    ("zz-none", []),
]


@pytest.fixture
def search_runs():
    start = timezone.now() - timedelta(hours=1)
    make_run("case-id-Order-77", start=start, end=start, input='{"text": "plain"}')
    make_run("case-tag", start=start, end=start, tags=["refund", "nightly"])
    make_run("case-input", start=start, end=start, input='{"why": "a REFUND, about 2 days"}')
    make_run("percent", start=start, end=start, input='{"discount": "50%"}')
    make_run("fifty", start=start, end=start, input='{"discount": "50 percent"}')
    make_run("underscore", start=start, end=start, input='{"key": "a_b"}')
    make_run("no-underscore", start=start, end=start, input='{"key": "axb"}')


@pytest.mark.parametrize("term,names", SEARCH_CASES)
def test_search_matches_the_same_rows_on_every_database(search_runs, term, names):
    """The search's rows do not depend on the database (the same cases run on SQLite and
    on PostgreSQL, where the trigram indexes answer them)."""
    page = runs_page(RunFilters(q=term, sort="created"))
    found = sorted(row.run.id for row in page.rows)
    assert found == sorted(names)


def _index_names() -> set[str]:
    with connection.cursor() as cursor:
        return {
            index
            for index, info in connection.introspection.get_constraints(
                cursor, "durable_run"
            ).items()
            if info.get("index")
        }


def _plans(fn, *off: str) -> str:
    """The plans PostgreSQL chooses for the queries ``fn`` runs with sequential scans
    (and the ``off`` plan types) disabled, as a tiny table would be scanned anyway: can
    the planner use the indexes at all?"""
    with CaptureQueriesContext(connection) as queries:
        fn()
    plans = []
    with connection.cursor() as cursor:
        for setting in ("enable_seqscan", *off):
            cursor.execute(f"SET {setting} = off")
        try:
            for query in queries.captured_queries:
                if 'FROM "durable_run"' in query["sql"]:
                    cursor.execute("EXPLAIN " + query["sql"])
                    plans.append("\n".join(row[0] for row in cursor.fetchall()))
        finally:
            for setting in ("enable_seqscan", *off):
                cursor.execute(f"RESET {setting}")
    return "\n\n".join(plans)


def test_indexes_exist_on_postgresql_and_are_used_and_are_a_no_op_elsewhere(timed_runs):
    names = _index_names()
    if connection.vendor != "postgresql":
        assert not names & INDEXES  # the embedded default migrates without them
        return
    assert INDEXES <= names
    with connection.cursor() as cursor:  # a short pending list: searches stay fast
        cursor.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relname LIKE 'run_search_%%_trgm'"
        )
        options = dict(cursor.fetchall())
    assert options == {
        name: ["gin_pending_list_limit=256"] for name in INDEXES if name.endswith("_trgm")
    }
    now, _ = timed_runs
    # without plain index scans (the created_at index + a filter, a fine plan for a
    # tiny table): the trigram indexes answer the four LIKEs
    search = _plans(lambda: runs_page(RunFilters(q="refund")), "enable_indexscan")
    for index in sorted(name for name in INDEXES if name.startswith("run_search_")):
        assert index in search, search
    # read in index order (no sort of every run) when sorting is the costly way
    by_duration = _plans(
        lambda: runs_page(RunFilters(sort="-duration"), now=now), "enable_bitmapscan", "enable_sort"
    )
    assert "run_duration_idx" in by_duration and "run_unfinished_start_idx" in by_duration
    assert "Sort" not in by_duration, by_duration
    failed = _plans(selectors.failed_runs, "enable_bitmapscan", "enable_sort")
    assert "run_failed_finished_idx" in failed and "Sort" not in failed, failed


def test_migration_explains_a_missing_pg_trgm():
    """Without pg_trgm and without the right to create it, migrating stops with a message
    that says what to run."""
    migration = importlib.import_module("durable.migrations.0010_dashboard_indexes")

    class Cursor:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def execute(self, sql, *args):
            if sql.startswith("CREATE EXTENSION"):
                raise PermissionError("permission denied to create extension")

        def fetchone(self):
            return None

    class Editor:
        class connection:
            vendor = "postgresql"

            @staticmethod
            def cursor():
                return Cursor()

    with pytest.raises(migration.TrigramExtensionMissing, match="CREATE EXTENSION pg_trgm;"):
        migration.create_indexes(None, Editor())
