"""A trial of the reads compiled once a process (``api/compiled.py``) against the ORM's,
each case drawn from a public bug report of a similar tool: a session whose time zone is
not Django's, a database time zone with DST folds and seconds in its offsets, ``USE_TZ``
off, a token whose user changes after its SQL was cached, a starter deleted after the
run's SQL was cached, a run deleted between reads, the JSON scanner's edges, and the
steps page's keyset edges."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

import durable
from api import auth as api_auth
from api import runs as api_runs
from api.models import ApiToken, digest_of, token_create
from durable.models import Run, Step, Wait
from tests.api.conftest import Api, api_for
from tests.api.test_read_cost import _add_steps, _succeeded_run, read_through_the_orm
from tests.dashboard.conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)


def _orm_rows(run: Run) -> list[tuple]:
    return list(
        run.steps.order_by("position").values_list(*api_runs.STEP_COLUMNS)[
            : api_runs.STEPS_SHOWN + 1
        ]
    )


def _detail_both_ways(run_id: str, monkeypatch) -> tuple[bytes, bytes]:
    """The detail's bytes by the compiled reads, then by the ORM's queries (as
    tests/api/test_read_cost.py reads them)."""
    request = RequestFactory().get("/")
    compiled = api_runs._answer(request, api_runs._detail(run_id)).content
    with monkeypatch.context() as m:
        read_through_the_orm(m)
        through_orm = api_runs._answer(request, api_runs._detail(run_id)).content
    return compiled, through_orm


def _set_step_times(run: Run, moments: list[datetime]) -> None:
    for n, step in enumerate(run.steps.order_by("position")):
        Step.objects.filter(pk=step.pk).update(
            started_at=moments[n % len(moments)],
            finished_at=moments[(n + 1) % len(moments)],
        )


# -- 1. django/django#15687 (review of BaseTzLoader: ``replace(tzinfo=...)`` reads a
# session in another zone as a different instant) ----------------------------------


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_session_zone_changed_by_hand_keeps_django_s_loader(monkeypatch):
    """After ``SET TIME ZONE`` on Django's connection the session's zone is no longer
    Django's: the compiled reads must give exactly what the ORM gives (Django's loader,
    with its ``replace``), not psycopg's own conversion."""
    run = _succeeded_run(4)
    _set_step_times(
        run,
        [
            datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC),
            datetime(2026, 7, 1, 23, 30, tzinfo=UTC),
        ],
    )
    api_runs._SHOWN_STEPS.rows(run.pk)  # compiled while the session is Django's
    with connection.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'Asia/Kolkata'")
    try:
        expected = _orm_rows(run)
        assert repr(api_runs._SHOWN_STEPS.rows(run.pk)) == repr(expected)
        found = api_runs._RUN.get(run.pk)
        orm = Run.objects.select_related("started_by").get(pk=run.pk)
        for field in ("created_at", "started_at", "finished_at"):
            assert repr(getattr(found, field)) == repr(getattr(orm, field)), field
        compiled, through_orm = _detail_both_ways(run.pk, monkeypatch)
        assert compiled == through_orm
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")


# -- 2. psycopg/psycopg2#1394 (DST fold with a session in Europe/Paris) and
# psycopg/psycopg2#1272 (offsets with seconds: Paris before 1911) ---------------------


def _database_zone(zone: str | None) -> None:
    """The default database's ``TIME_ZONE``, on a new connection of this thread (Django
    then sets the session to it, and ``connection.timezone`` is its ZoneInfo)."""
    wrapper = connections[connection.alias]  # not the proxy: its cached properties
    wrapper.close()
    wrapper.settings_dict["TIME_ZONE"] = zone
    for name in ("timezone", "timezone_name"):
        wrapper.__dict__.pop(name, None)
    assert (wrapper.timezone_name, str(wrapper.timezone)) == (zone or "UTC", zone or "UTC")


@pytest.fixture
def paris_database():
    _database_zone("Europe/Paris")
    yield
    _database_zone(None)


def test_a_database_in_paris_reads_folds_and_seconds_offsets_as_the_orm(
    paris_database, monkeypatch
):
    """Both sides of the 2013-10-27 fold (02:00 Paris twice, ``fold`` 0 and 1), an 1800
    date whose Paris offset is +00:09:21, microseconds and the far years: the compiled
    rows (psycopg's C loader, as the session's zone is Django's ZoneInfo) are the ORM's
    to the ``fold`` and the offset, and the detail the same bytes."""
    run = _succeeded_run(6)
    moments = [
        datetime(2013, 10, 27, 0, 0, tzinfo=UTC),
        datetime(2013, 10, 27, 1, 0, tzinfo=UTC),
        datetime(1800, 1, 1, 0, 0, 0, 500, tzinfo=UTC),
        datetime(2026, 12, 6, 1, 2, 3, 999999, tzinfo=UTC),
        datetime(1900, 6, 1, 12, 0, tzinfo=UTC),
        datetime(2013, 10, 27, 0, 30, 0, 1000, tzinfo=UTC),
    ]
    _set_step_times(run, moments)
    expected = _orm_rows(run)
    found = api_runs._SHOWN_STEPS.rows(run.pk)
    assert repr(found) == repr(expected)
    assert [(r[7].fold, r[7].utcoffset()) for r in found] == [
        (r[7].fold, r[7].utcoffset()) for r in expected
    ]
    if connection.vendor == "postgresql":  # SQLite stores local text: the fold is lost
        starts = {r[7].astimezone(UTC) for r in found}
        assert starts == set(moments)  # the same instants, whatever the zone
    compiled, through_orm = _detail_both_ways(run.pk, monkeypatch)
    assert compiled == through_orm


# -- 3. vitalik/django-ninja#759 (datetimes must honour USE_TZ=False) ----------------


def test_with_use_tz_off_the_compiled_reads_are_naive_as_the_orm(monkeypatch):
    """``USE_TZ`` turned off after the SQL was compiled: the ORM reads naive datetimes
    (Django's loader chops the zone; SQLite's converter makes none), the compiled reads
    must too, and the detail's text carries no ``Z``."""
    run = _succeeded_run(3)
    _set_step_times(run, [datetime(2026, 5, 4, 3, 2, 1, 654321, tzinfo=UTC)])
    Run.objects.filter(pk=run.pk).update(
        started_at=datetime(2026, 5, 4, 3, 2, 0, tzinfo=UTC),
        finished_at=datetime(2026, 5, 4, 3, 2, 2, tzinfo=UTC),
    )
    api_runs._SHOWN_STEPS.rows(run.pk)
    api_runs._RUN.get(run.pk)
    with override_settings(USE_TZ=False):
        expected = _orm_rows(run)
        found = api_runs._SHOWN_STEPS.rows(run.pk)
        assert repr(found) == repr(expected)
        assert all(r[7].tzinfo is None for r in found)
        got = api_runs._RUN.get(run.pk)
        assert got.started_at.tzinfo is None and got.created_at.tzinfo is None
        compiled, through_orm = _detail_both_ways(run.pk, monkeypatch)
        assert compiled == through_orm
        assert json.loads(compiled)["steps"][0]["started_at"] == "2026-05-04T03:02:01.654"


# -- 4. riparias/gbif-alert#427 (tokens of a deactivated owner kept working) and
# jazzband/djangorestframework-simplejwt#193 (a deleted user's token still verified) --


def test_a_token_is_refused_once_its_user_changes_after_its_sql_was_cached(operator):
    """The token's SQL is compiled at its first request; then its user is made
    inactive (401), active again (200), the token revoked (401) and, with a second
    token, its user deleted (401, no error). At each state the compiled read is the
    ORM's ``select_related`` and ``live()`` answer."""
    token, text = token_create(user=operator, name="ci", scopes=["runs:read"])
    api = Api(text)
    digest = digest_of(text)

    def same_as_orm():
        orm = ApiToken.objects.select_related("user").filter(digest=digest).first()
        found = api_auth._by_digest(digest)
        assert (found is None) == (orm is None)
        if orm is not None:
            for f in ApiToken._meta.concrete_fields:
                assert repr(getattr(found, f.attname)) == repr(getattr(orm, f.attname))
            assert found.user.is_active == orm.user.is_active
        live = ApiToken.objects.live().filter(digest=digest).first()
        assert (api_auth._live_by_digest(digest) is None) == (live is None)

    assert api.get("/runs").status_code == 200
    same_as_orm()
    type(operator).objects.filter(pk=operator.pk).update(is_active=False)
    assert api.get("/runs").status_code == 401
    same_as_orm()
    type(operator).objects.filter(pk=operator.pk).update(is_active=True)
    assert api.get("/runs").status_code == 200
    same_as_orm()
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api.get("/runs").status_code == 401
    same_as_orm()
    ApiToken.objects.filter(pk=token.pk).update(expires_at=None, revoked_at=timezone.now())
    assert api.get("/runs").status_code == 401
    same_as_orm()

    doomed = make_user("dora", "viewer")
    other = api_for(doomed)
    assert other.get("/runs").status_code == 200
    doomed.delete()  # its tokens go with it (CASCADE)
    assert other.get("/runs").status_code == 401
    assert api_auth._by_digest(digest_of(other.headers["Authorization"][7:])) is None


# -- 5. Suor/django-cacheops#348 (a cached get after the SET_NULL target was deleted
# raised DoesNotExist) ------------------------------------------------------------


def test_a_run_whose_starter_is_deleted_after_its_sql_was_cached(viewer_api, monkeypatch):
    """The detail is read (its SQL compiled) while the run's starter exists; the
    account is then renamed, then deleted (``started_by`` set null): each later detail
    shows what the ORM shows (the new name, then ``unknown``), with no extra query
    for the starter and the same count of queries as before."""
    starter = make_user("sam", "viewer")
    run = _succeeded_run(3)
    Run.objects.filter(pk=run.pk).update(started_by=starter, started_by_name="")
    first = viewer_api.get(f"/runs/{run.pk}")
    assert first.status_code == 200 and first.json()["started_by"] == "sam"
    with CaptureQueriesContext(connection) as before:
        viewer_api.get(f"/runs/{run.pk}")
    type(starter).objects.filter(pk=starter.pk).update(username="samuel")
    assert viewer_api.get(f"/runs/{run.pk}").json()["started_by"] == "samuel"
    starter.delete()
    assert Run.objects.get(pk=run.pk).started_by_id is None
    with CaptureQueriesContext(connection) as after:
        response = viewer_api.get(f"/runs/{run.pk}")
    assert response.status_code == 200, response.content
    assert response.json()["started_by"] == "unknown"
    assert len(after) == len(before)
    compiled, through_orm = _detail_both_ways(run.pk, monkeypatch)
    assert compiled == through_orm


def test_a_run_deleted_between_reads_is_a_404_on_both_pages(viewer_api):
    """A run read once (its SQL compiled), then deleted with its steps and waits: its
    detail and its steps page are 404 problems, not a page of stale rows."""
    run = _succeeded_run(3)
    Wait.objects.create(run=run, wait_id="w1", position=1, kind="signal", key="k", status="pending")
    assert viewer_api.get(f"/runs/{run.pk}").json()["waiting_on"]["key"] == "k"
    assert viewer_api.get(f"/runs/{run.pk}/steps").status_code == 200
    Run.objects.filter(pk=run.pk).delete()
    assert api_runs._RUN.get(run.pk) is None
    assert api_runs._SHOWN_STEPS.rows(run.pk) == [] and api_runs._PENDING_WAIT.rows(run.pk) == []
    for path in (f"/runs/{run.pk}", f"/runs/{run.pk}/steps"):
        response = viewer_api.get(path)
        assert response.status_code == 404, path


# -- 6. python/cpython#150861 (the same whitespace skip in json.loads) and
# simplejson/simplejson#372 (error parity of the C and Python scanners) ------------


def test_the_codec_s_scan_is_decode_s_on_odd_stored_text():
    """Text a database or an older writer may hold: ``\\u`` escapes (a surrogate pair,
    a lone one, an escaped NUL), a form feed or a no-break space after the value (not
    JSON whitespace: extra data), whitespace of every JSON kind after, a value of
    digits past Python's limit (a ``ValueError``, not a ``JSONDecodeError``), nesting,
    NaN inside, truncated strings and numbers, bytes with a UTF-8 BOM. The fast scan
    answers as ``JSONDecoder.decode`` does: the same value, or the same exception type,
    message and position."""
    from durable.values import decoder

    texts = [
        '"\\ud83d\\ude00"',
        '"\\ud83d"',
        '"\\u0000x"',
        '{"a": "\\u00e9\\n"}',
        '{"a": 1}\x0c',
        '{"a": 1}\u00a0',
        '{"a": 1} \t\r\n',
        "1" * 5000,
        "[" + "1" * 5000 + "]",
        "[" * 50 + "]" * 50,
        '{"x": NaN, "y": [Infinity, -Infinity]}',
        '"abc',
        '"abc\\',
        "-",
        "1.",
        "12 34",
        "truex",
        "null ",
        "0123",
        '{"a": 1,}',
        b'\xef\xbb\xbf{"a": 1}',
        "\u2028{}",
        "{}\u2028",
    ]

    def outcome(call):
        try:
            return ("value", repr(call()))
        except (ValueError, RecursionError) as exc:
            return (type(exc).__name__, str(exc), getattr(exc, "pos", None))

    for made in (decoder._DECODER, decoder._DISPLAY_DECODER, decoder._PLAIN_DECODER):
        for text in texts:
            as_str = text if isinstance(text, str) else text.decode(json.detect_encoding(text))
            expected = outcome(lambda made=made, s=as_str: made.decode(s))
            found = outcome(lambda made=made, t=text: decoder._loads(made, t))
            assert found == expected, text[:40]


# -- 7. ulule/paging#9 and #11 (a keyset page's next cursor on the last page: fetch
# limit + 1) -------------------------------------------------------------------------


def test_the_steps_page_s_keyset_edges_are_the_dict_reads(viewer_api):
    """The steps page against the previous dict-based reading (``.values()``), for
    positions with gaps: ``after`` before, inside, on the last and past the end,
    ``limit`` 1, one short, exactly the count and more; ``next_after`` is null on the
    last page even when it holds exactly ``limit``; walking the pages gives every step
    once."""
    run = _succeeded_run(0)
    _add_steps(run, 7)
    Step.objects.filter(run=run, position__in=(3, 5)).delete()  # gaps
    positions = list(run.steps.order_by("position").values_list("position", flat=True))
    n = len(positions)

    def reference(after: int, limit: int) -> dict:
        steps = list(
            Step.objects.filter(run_id=run.pk, position__gt=after)
            .order_by("position")
            .values(*api_runs.STEP_COLUMNS)[: limit + 1]
        )
        shown = steps[:limit]
        items = [api_runs._step_out(tuple(s[c] for c in api_runs.STEP_COLUMNS)) for s in shown]
        return json.loads(
            json.dumps(
                {
                    "items": items,
                    "next_after": shown[-1]["position"] if len(steps) > limit else None,
                }
            )
        )

    for after in (-1, 0, positions[0], 3, positions[-2], positions[-1], 10_000):
        for limit in (1, n - 1, n, n + 1, 1000):
            response = viewer_api.get(f"/runs/{run.pk}/steps?after={after}&limit={limit}")
            assert response.status_code == 200, response.content
            assert response.json() == reference(after, limit), (after, limit)
    page = viewer_api.get(f"/runs/{run.pk}/steps?limit={n}").json()
    assert page["next_after"] is None and len(page["items"]) == n
    seen, after = [], -1
    while after is not None:
        page = viewer_api.get(f"/runs/{run.pk}/steps?after={after}&limit=2").json()
        seen += [s["position"] for s in page["items"]]
        after = page["next_after"]
    assert seen == positions


def test_a_started_run_with_a_wait_in_paris_is_the_orm_s_detail(paris_database, monkeypatch):
    """The pending wait's ``created_at`` (the third compiled read) in a non-UTC
    database, on the fold: ``waiting_on.since`` the ORM's text."""
    run = durable.start("dash.echo", {"n": 1})
    wait = Wait.objects.create(
        run=run, wait_id="w1", position=1, kind="signal", key="k", status="pending"
    )
    Wait.objects.filter(pk=wait.pk).update(
        created_at=datetime(2013, 10, 27, 1, 0, 0, 250000, tzinfo=UTC)
    )
    now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: now)
    compiled, through_orm = _detail_both_ways(run.pk, monkeypatch)
    assert compiled == through_orm
    if connection.vendor == "postgresql":  # SQLite stores local text: the fold is lost
        since = json.loads(compiled)["waiting_on"]["since"]
        assert since == "2013-10-27T02:00:00.250+01:00"


# -- 8. django/django#15687 again (``BaseTzLoader`` is bound to one connection's zone)
# and psycopg/psycopg2#1394: a converter must follow the connection it reads from ---


def test_rows_compiled_in_another_thread_convert_with_this_thread_s_connection():
    """``CompiledRows`` compiled (and first run) in another thread, as the first request
    of a threaded server would: later, in this thread, whose connection's zone differs
    (the database's ``TIME_ZONE`` changed, as a test's override does for this thread's
    connections only), its rows are converted as the ORM converts them here, not with
    the zone of the compiling thread's connection (SQLite's datetime converter is a
    method of that connection's ``ops`` and reads its ``timezone``)."""
    import threading

    from api.compiled import CompiledRows

    run = _succeeded_run(2)
    _set_step_times(run, [datetime(2026, 1, 15, 12, 0, 0, 5000, tzinfo=UTC)])
    rows = CompiledRows(Step, api_runs._SHOWN_STEPS.build)

    def first_request():
        try:
            assert repr(rows.rows(run.pk)) == repr(_orm_rows(run))
        finally:
            connections.close_all()

    thread = threading.Thread(target=first_request)
    thread.start()
    thread.join()
    assert rows.compiled[connection.alias] is not None
    _database_zone("Europe/Paris")
    try:
        assert repr(rows.rows(run.pk)) == repr(_orm_rows(run))
    finally:
        _database_zone(None)
