"""What reading runs costs the API, and that the cheap answers keep the schema's shape.

The runs list, a run's detail and its steps page are answered as plain dicts rendered
by ninja's renderer, without validating them against the response models first
(``api.runs._answer``): these tests hold each answer equal to what the validated model
would have made of it, and the number of queries independent of the number of steps
and of the page size.
"""

from __future__ import annotations

import json
from datetime import UTC

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from ninja.responses import NinjaJSONEncoder

import durable
from api import runs as api_runs
from api.compiled import CompiledRows
from api.schemas import RunDetailOut, RunsPageOut, StepsPageOut
from durable.models import Run, Step, StepKind, StepStatus, Wait
from durable.services.forks import COMPENSATION_PREFIX, fork_points
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)


def _add_steps(run: Run, n: int, *, kind: str = StepKind.STEP, prefix: str = "s") -> None:
    start = (run.steps.order_by("-position").values_list("position", flat=True).first() or 0) + 1
    now = timezone.now()
    Step.objects.bulk_create(
        Step(
            run_id=run.id,
            step_id=f"{prefix}{start + i}",
            position=start + i,
            kind=kind,
            status=StepStatus.SUCCEEDED,
            input=json.dumps({"i": i}),
            output=json.dumps({"answer": i}),
            error={"type": "Transient", "message": "once"} if i % 7 == 0 else None,
            attempts=1 + i % 3,
            started_at=now,
            finished_at=now,
        )
        for i in range(n)
    )


def _succeeded_run(n_steps: int) -> Run:
    run = drive(durable.start("dash.echo", {"n": n_steps}).id)
    assert run.status == "succeeded"
    _add_steps(run, n_steps)
    return run


def _queries(api, path: str) -> tuple[int, dict]:
    api.get(path)  # the token's last_used_at is written at most once a minute: not here
    with CaptureQueriesContext(connection) as queries:
        response = api.get(path)
    assert response.status_code == 200, response.content
    return len(queries), response.json()


def _as_validated(model, body: dict) -> dict:
    """``body`` as ninja answered before: validated by ``model``, dumped, rendered."""
    return json.loads(json.dumps(model.model_validate(body).model_dump(), cls=NinjaJSONEncoder))


def test_a_runs_detail_costs_the_same_queries_for_250_and_450_steps(viewer_api):
    """Past the 200 steps shown, more steps cost no query; a run whose steps are all
    shown reads its fork points from them (one query fewer)."""
    few = _succeeded_run(20)
    more = _succeeded_run(250)
    most = _succeeded_run(450)
    n_few, body_few = _queries(viewer_api, f"/runs/{few.id}")
    n_more, body_more = _queries(viewer_api, f"/runs/{more.id}")
    n_most, body_most = _queries(viewer_api, f"/runs/{most.id}")
    assert n_more == n_most
    assert n_few == n_more - 1
    assert body_few["steps_truncated"] is False and body_most["steps_truncated"] is True
    assert len(body_most["steps"]) == api_runs.STEPS_SHOWN
    assert body_most["fork_points"] == list(
        most.steps.order_by("position").values_list("step_id", flat=True)
    )
    assert body_few["fork_points"] == list(
        few.steps.order_by("position").values_list("step_id", flat=True)
    )


def test_a_run_that_may_not_be_forked_reads_no_fork_points(viewer_api):
    run = durable.start("dash.echo", {"n": 1})  # pending: a fork needs a finished run
    _add_steps(run, 250)
    n_pending, body = _queries(viewer_api, f"/runs/{run.id}")
    assert body["fork_points"] == [] and body["steps_truncated"] is True
    done = _succeeded_run(250)
    n_done, _ = _queries(viewer_api, f"/runs/{done.id}")
    # the succeeded run also asks why it is kept (one query when nothing keeps it)
    assert n_pending == n_done - 2


def test_fork_points_from_the_shown_steps_equal_those_from_the_rows():
    """A compensated write ends the fork points (a failed compensation does not): read
    from the steps shown, from all the run's rows or from its models, the same list."""
    run = _succeeded_run(5)
    compensated = run.steps.order_by("position").values_list("step_id", flat=True)[3]
    Step.objects.create(
        run=run,
        step_id=f"{COMPENSATION_PREFIX}{compensated}",
        position=100,
        kind=StepKind.COMPENSATION,
        status=StepStatus.SUCCEEDED,
    )
    first = run.steps.order_by("position").values_list("step_id", flat=True)[1]
    Step.objects.create(  # a compensation that failed undid nothing
        run=run,
        step_id=f"{COMPENSATION_PREFIX}{first}",
        position=101,
        kind=StepKind.COMPENSATION,
        status=StepStatus.FAILED,
    )
    rows = list(run.steps.order_by("position").values_list(*api_runs.STEP_COLUMNS))
    from_shown = api_runs._fork_points(run, rows, complete=True)
    from_rows = api_runs._fork_points(run, rows, complete=False)
    assert from_shown == from_rows
    assert from_shown[-1] == compensated and len(from_shown) == 4
    # the models, as the dashboard passes them (their kinds the enum's members)
    models = list(run.steps.order_by("position"))
    for step in models:
        step.kind = StepKind(step.kind)
    assert fork_points(models) == from_shown


def test_the_runs_list_costs_the_same_queries_for_2_and_40_runs(viewer_api):
    for n in range(40):
        run = durable.start("dash.echo", {"n": n})
        if n % 3 == 0:
            Wait.objects.create(run=run, wait_id=f"w{n}", position=1, kind="signal", key=f"k{n}")
    n_small, small = _queries(viewer_api, "/runs?limit=2")
    n_large, large = _queries(viewer_api, "/runs?limit=40")
    assert len(small["items"]) == 2 and len(large["items"]) == 40
    assert any(item["waiting_on"] for item in large["items"])
    assert n_small == n_large


def test_the_cheap_answers_are_the_validated_ones(viewer_api):
    """Each field has its model's type: validating the answer and rendering it again,
    as ninja did, gives it back (an extra, a missing or a mistyped field would not)."""
    run = _succeeded_run(230)
    Wait.objects.create(run=run, wait_id="w", position=1, kind="signal", key="go")
    detail = viewer_api.get(f"/runs/{run.id}")
    assert detail["Content-Type"] == "application/json; charset=utf-8"
    # the cheap answers are rendered as the API object renders the others
    from api.main import api as the_api

    assert type(the_api.renderer) is type(api_runs._RENDERER)
    assert the_api.get_content_type() == api_runs._CONTENT_TYPE
    assert detail.json() == _as_validated(RunDetailOut, detail.json())
    assert detail.json() == _as_validated(RunDetailOut, api_runs._detail(run.id))
    assert detail.json()["waiting_on"]["key"] == "go"
    page = viewer_api.get("/runs?limit=5").json()
    assert page["items"] and page == _as_validated(RunsPageOut, page)
    steps = viewer_api.get(f"/runs/{run.id}/steps?after=3&limit=7").json()
    assert len(steps["items"]) == 7 and steps == _as_validated(StepsPageOut, steps)
    assert any(s["error"] for s in steps["items"]) and steps["next_after"] is not None


def test_the_runs_list_reads_four_queries_and_a_detail_six(viewer_api):
    """The permission check is one query (approvals/backends.py), not ModelBackend's two."""
    run = _succeeded_run(20)
    n_list, _ = _queries(viewer_api, "/runs")
    n_detail, _ = _queries(viewer_api, f"/runs/{run.id}")
    # the token, the user's permissions, the page, the pending waits of its runs
    assert n_list == 4
    # the token, the permissions, the run, its steps, its pending wait, why it is kept
    assert n_detail == 6


def test_the_datetimes_are_the_text_the_renderer_made_of_them():
    """``api.runs._iso`` turns a datetime into the text ninja's encoder
    (``DjangoJSONEncoder.default``) would make of it: milliseconds, none when there are
    no microseconds, ``Z`` for UTC, an offset for another zone, none for a naive one."""
    from datetime import datetime, timedelta
    from datetime import timezone as tz

    encoder = NinjaJSONEncoder()
    zones = [UTC, tz(timedelta(hours=5, minutes=30)), tz(timedelta(hours=-8)), None]
    for zone in zones:
        for micro in (0, 1, 999, 1000, 123456, 999999):
            value = datetime(2026, 12, 6, 1, 2, 3, micro, tzinfo=zone)
            assert api_runs._iso(value) == encoder.default(value), value
    assert api_runs._iso(None) is None


def _full_answer(run_id: str) -> dict:
    """The runs list's item for ``run_id`` from the run read whole (every column)."""
    run = Run.objects.select_related("started_by").get(pk=run_id)
    wait = run.waits.filter(status="pending").order_by("position").first()
    item = api_runs._run_out(run, wait=wait)
    return json.loads(json.dumps(item, cls=NinjaJSONEncoder))


def test_the_runs_list_reads_only_the_columns_it_answers_with(viewer_api, viewer):
    """The list reads a dozen of the run's columns (``runs_page(columns=...)``): its
    items are those of the runs read whole, for runs with a starter account, a recorded
    name, tags, an error, a fork's source and pending waits, and no column left out is
    read back (the same four queries for 2 and 12 runs)."""
    source = _succeeded_run(3)
    for n in range(12):
        run = durable.start("dash.echo", {"n": n}, tags=[f"t{n}"], started_by=viewer)
        changes: dict = (
            {"forked_from_id": source.id, "started_by_name": ""}  # the account's name
            if n % 2
            else {"started_by_name": "os:bob"}
        )
        if n % 3 == 0:
            changes.update(status="failed", error={"type": "Boom", "message": f"no {n}"})
        Run.objects.filter(pk=run.pk).update(**changes)
        if n % 4 == 0:
            for position in (7, 2):
                Wait.objects.create(
                    run=run,
                    wait_id=f"w{n}-{position}",
                    position=position,
                    kind="signal",
                    key=f"k{n}-{position}",
                )
    n_small, _ = _queries(viewer_api, "/runs?limit=2")
    n_large, page = _queries(viewer_api, "/runs?limit=13")
    assert n_small == n_large == 4
    items = page["items"]
    assert {i["started_by"] for i in items} >= {"os:bob", viewer.username}
    assert any(i["forked_from"] for i in items) and any(i["error"] for i in items)
    assert {i["waiting_on"]["key"] for i in items if i["waiting_on"]} == {"k0-2", "k4-2", "k8-2"}
    for item in items:
        expected = _full_answer(item["id"])
        expected["duration_seconds"] = item["duration_seconds"]  # measured up to now
        assert item == expected


def test_a_page_s_first_pending_waits_are_those_the_prefetch_read():
    """``_first_pending_waits``: each run's pending wait of the lowest position (a
    resolved one is not pending), its ``run`` the page's run object (no query)."""
    from django.db.models import Prefetch, prefetch_related_objects

    from durable.queries import runs as selectors

    runs = [durable.start("dash.echo", {"n": n}) for n in range(4)]
    for n, run in enumerate(runs[:3]):
        for position in (5, 3, 9):
            Wait.objects.create(
                run=run,
                wait_id=f"w{n}-{position}",
                position=position,
                kind="signal",
                key=f"{n}-{position}",
                status="resolved" if (n, position) == (1, 3) else "pending",
            )
    found = selectors._first_pending_waits(runs)
    prefetch_related_objects(
        runs,
        Prefetch(
            "waits",
            queryset=Wait.objects.filter(status="pending").order_by("position"),
            to_attr="pending",
        ),
    )
    assert {r.pk: (r.pending[0].pk if r.pending else None) for r in runs} == {
        r.pk: (found[r.pk].pk if r.pk in found else None) for r in runs
    }
    assert found[runs[1].pk].key == "1-5" and runs[3].pk not in found
    with CaptureQueriesContext(connection) as queries:
        assert found[runs[0].pk].run is runs[0]
    assert len(queries) == 0
    assert selectors._first_pending_waits([]) == {}


def test_display_text_without_a_tag_decodes_as_with_the_hook():
    """``decode_for_display`` skips its object hook for text in which no object can
    carry the tag (``"$t"`` nowhere, no ``\\u`` escape): the same values as the
    hook gives, for plain text, tagged values, and a tag spelled with escapes."""
    import datetime as dt
    from decimal import Decimal

    from durable.values import codec, decoder

    values = [
        {"kwargs": {"query": "order status"}, "n": [1, 2.5, None, True]},
        {"answer": 'quote " and \\ backslash', "nested": [{"a": {"b": []}}]},
        {"when": dt.datetime(2026, 12, 6, 1, 2, 3, tzinfo=dt.UTC), "raw": b"\x00\x01"},
        {"d": Decimal("1.10"), "t": (1, 2), 3: "int key", "$t": "a key like the tag"},
        "caf\u00e9 \u2603",
    ]
    texts = [codec.encode(v) for v in values] + [
        '{"\\u0024t": "bytes", "v": "AAAA"}',  # the tag, escaped: still shown as bytes
        '{"$\\u0074": "tuple", "v": [1]}',
        '{"plain": "\\u00e9"}',
        '"$t"',
    ]
    for text in texts:
        with_hook = decoder._loads(decoder._DISPLAY_DECODER, text)
        assert codec.decode_for_display(text) == with_hook, text
    assert codec.decode_for_display('{"\\u0024t": "bytes", "v": "AAAA"}') == "<3 bytes>"


def test_the_compiled_step_queries_read_the_rows_the_orm_reads():
    """``_SHOWN_STEPS`` and ``_FORK_ROWS`` (SQL compiled once) give the ORM's rows for
    each run, converted as it converts them (the error's JSON, the datetimes), each with
    its own run's id, and the ORM's when the SQL cannot be reused."""
    runs = [_succeeded_run(n) for n in (3, 230)]
    for run in runs:
        steps = run.steps.order_by("position")
        expected = list(steps.values_list(*api_runs.STEP_COLUMNS)[: api_runs.STEPS_SHOWN + 1])
        assert api_runs._SHOWN_STEPS.rows(run.pk) == expected
        assert api_runs._FORK_ROWS.rows(run.pk) == list(
            steps.values_list("step_id", "kind", "status")
        )
    errors = [row[-1] for row in api_runs._SHOWN_STEPS.rows(runs[1].pk)]
    assert {"type": "Transient", "message": "once"} in errors  # a dict, not JSON text
    assert api_runs._SHOWN_STEPS.rows("no-such-run") == []
    uncompiled = CompiledRows(Step, api_runs._FORK_ROWS.build)
    uncompiled.compiled["default"] = None  # as when two builds of the SQL differ
    assert uncompiled.rows(runs[0].pk) == api_runs._FORK_ROWS.rows(runs[0].pk)


def test_the_compiled_rows_datetimes_are_the_orm_s_to_the_time_zone():
    """On PostgreSQL the compiled queries load their datetimes with psycopg's loader
    (``api.compiled._load_datetimes_in_c``): the same values as Django's loader, their
    ``tzinfo`` the same object (``repr`` shows it; ``==`` would not), microseconds or
    none, and no other cursor's loader is changed."""
    from datetime import datetime

    run = _succeeded_run(5)
    moments = [
        datetime(2026, 12, 6, 1, 2, 3, tzinfo=UTC),
        datetime(2026, 12, 6, 1, 2, 3, 999999, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    ]
    for n, step in enumerate(run.steps.order_by("position")):
        finished = None if n % 2 else moments[(n + 1) % len(moments)]
        Step.objects.filter(pk=step.pk).update(
            started_at=moments[n % len(moments)], finished_at=finished
        )
    expected = list(
        run.steps.order_by("position").values_list(*api_runs.STEP_COLUMNS)[
            : api_runs.STEPS_SHOWN + 1
        ]
    )
    found = api_runs._SHOWN_STEPS.rows(run.pk)
    assert repr(found) == repr(expected)
    assert {type(row[7].tzinfo) for row in found} == {type(UTC)}
    if connection.vendor == "postgresql":
        from api.compiled import _load_datetimes_in_c

        with connection.cursor() as cursor:
            _load_datetimes_in_c(connection, cursor)
            ours = cursor.cursor.adapters.get_loader(1184, 0)  # timestamptz, as text
        with connection.cursor() as cursor:
            theirs = cursor.cursor.adapters.get_loader(1184, 0)
        assert ours is not theirs and "django" in theirs.__module__


def _runs_of_every_kind(user) -> list[Run]:
    """A run started by an account (its username shown) with pending waits, one by an
    account under a recorded name, forked, failed and tagged, and one by nobody known
    with no wait and no step."""
    from datetime import timedelta

    shown = _succeeded_run(230)
    Run.objects.filter(pk=shown.pk).update(
        started_by=user, started_by_name="", deadline_at=timezone.now() + timedelta(days=1)
    )
    for position, status in ((7, "pending"), (2, "pending"), (1, "resolved")):
        Wait.objects.create(
            run=shown,
            wait_id=f"w{position}",
            position=position,
            kind="signal",
            key=f"k{position}",
            status=status,
        )
    named = durable.start("dash.echo", {"n": 2}, tags=["a", "b"], started_by=user)
    Run.objects.filter(pk=named.pk).update(
        started_by_name="os:bob",
        forked_from_id=shown.pk,
        status="failed",
        error={"type": "Boom", "message": "no"},
    )
    _add_steps(named, 3)
    nobody = durable.start("dash.echo", {"n": 3})
    Run.objects.filter(pk=nobody.pk).update(started_by=None, started_by_name="")
    return [shown, named, nobody]


def test_the_compiled_run_is_the_one_select_related_reads(viewer):
    """``api.runs._RUN`` (its SQL compiled once) builds the run and its starter as
    ``select_related("started_by")`` does: every field the same (``repr``: the
    datetimes' zones too), the starter read with it or cached as none, no query after."""
    labels = set()
    for run in _runs_of_every_kind(viewer):
        expected = Run.objects.select_related("started_by").get(pk=run.pk)
        found = api_runs._RUN.get(run.pk)
        with CaptureQueriesContext(connection) as queries:
            for field in Run._meta.concrete_fields:
                assert repr(getattr(found, field.attname)) == repr(
                    getattr(expected, field.attname)
                ), field.name
            starter = found.started_by
            labels.add(found.starter_label)
            assert found.starter_label == expected.starter_label
        assert len(queries) == 0
        if expected.started_by is None:
            assert starter is None
        else:
            for field in type(starter)._meta.concrete_fields:
                assert repr(getattr(starter, field.attname)) == repr(
                    getattr(expected.started_by, field.attname)
                ), field.name
        assert found._state.db == expected._state.db and not found._state.adding
    assert labels == {"vera", "os:bob", "unknown"}
    assert api_runs._RUN.get("no-such-run") is None
    assert api_runs._RUN.rows.compiled["default"] is not None  # the compiled query ran


def read_through_the_orm(m) -> None:
    """Have the detail read as it did before its reads were compiled (``m``: a
    monkeypatch): the run and its pending wait by the ORM's queries, its steps and fork
    points by the ORM, their ``CompiledRows`` told the SQL cannot be reused."""
    m.setattr(
        api_runs._RUN,
        "get",
        lambda pk: Run.objects.select_related("started_by").filter(pk=pk).first(),
    )
    m.setattr(
        api_runs._PENDING_WAIT,
        "rows",
        lambda pk: [
            (w.kind, w.key, w.created_at)
            for w in Run.objects.get(pk=pk).waits.filter(status="pending").order_by("position")[:1]
        ],
    )
    for rows in (api_runs._SHOWN_STEPS, api_runs._FORK_ROWS):
        m.setitem(rows.compiled, connection.alias, None)


def test_a_detail_is_the_same_bytes_compiled_or_through_the_orm(viewer, monkeypatch):
    """Each detail read by the SQL compiled once (the run and its starter, its pending
    wait, its steps, its fork points; psycopg's datetime loader on PostgreSQL) is the
    very bytes of the same detail read by the ORM (the run and its wait by the queries
    the detail made before, the steps' ``CompiledRows`` told their SQL cannot be
    reused): a starter account or none, a recorded name, pending waits or none, a
    failed fork with an error."""
    from django.test import RequestFactory

    runs = _runs_of_every_kind(viewer)
    request = RequestFactory().get("/")
    now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: now)  # the unfinished runs' durations
    compiled = [api_runs._answer(request, api_runs._detail(r.pk)).content for r in runs]
    read_through_the_orm(monkeypatch)
    with CaptureQueriesContext(connection) as queries:
        through_orm = [api_runs._answer(request, api_runs._detail(r.pk)).content for r in runs]
    assert compiled == through_orm
    assert len(queries) > 0 and all("\x00" not in q["sql"] for q in queries)
    details = [json.loads(body) for body in compiled]
    assert details[0]["waiting_on"]["key"] == "k2" and details[0]["started_by"] == "vera"
    assert details[0]["steps_truncated"] and len(details[0]["fork_points"]) > 200
    assert details[1]["started_by"] == "os:bob" and details[1]["error"]["type"] == "Boom"
    assert details[1]["forked_from"] == runs[0].pk and details[1]["waiting_on"] is None
    assert details[2]["started_by"] == "unknown" and details[2]["waiting_on"] is None


def test_a_step_s_answer_takes_each_column_by_its_name():
    """``_step_out`` unpacks a row of ``STEP_COLUMNS`` by position: each field of the
    answer is its own column's value (two datetimes, two texts and the error apart)."""
    from datetime import datetime, timedelta

    run = _succeeded_run(1)
    start = datetime(2026, 12, 6, 1, 2, 3, 4000, tzinfo=UTC)
    Step.objects.filter(run=run).update(
        started_at=start,
        finished_at=start + timedelta(seconds=1),
        input=json.dumps({"in": 1}),
        output=json.dumps({"out": 2}),
        error={"type": "E", "message": "m"},
        tool_name="a-tool",
        durability="batched",
    )
    for row in run.steps.order_by("position").values_list(*api_runs.STEP_COLUMNS):
        by_name = dict(zip(api_runs.STEP_COLUMNS, row, strict=True))
        out = api_runs._step_out(row)
        assert list(out) == list(api_runs.STEP_COLUMNS)
        for name in ("step_id", "position", "kind", "tool_name", "status", "attempts"):
            assert out[name] == by_name[name], name
        assert out["durability"] == by_name["durability"] == "batched"
        assert (out["started_at"], out["finished_at"]) == (
            "2026-12-06T01:02:03.004Z",
            "2026-12-06T01:02:04.004Z",
        )
        assert (out["input"], out["output"]) == ({"in": 1}, {"out": 2})
        assert out["error"] == {"type": "E", "message": "m"}


def test_the_codec_s_json_reading_is_json_s_to_the_error():
    """``durable.values.decoder._loads`` checks the C scanner's end itself rather than
    through ``JSONDecoder.decode``'s whitespace matches: the same value, or the same
    error at the same position, for text with whitespace before or after, extra data,
    text that is not JSON, a BOM, bytes, and tagged objects through the hook."""
    from durable.values import codec, decoder

    texts = [
        '{"a": [1, 2.5, null, true], "b": "c"}',
        ' {"a": 1}',
        '{"a": 1} \n',
        '\t"text"\r\n',
        '{"a": 1} x',
        '{"a": 1}{"b": 2}',
        "[1, 2",
        "",
        "   ",
        "nope",
        "\ufeff{}",
        "NaN",
        "-Infinity",
        "1e400",
        '"\\ud800"',
        codec.encode({"when": (1, 2), "raw": b"\x00"}),
        codec.encode({"when": (1, 2), "raw": b"\x00"}) + "  ",
        b'{"bytes": 1} ',
        '{"utf-16": 1}'.encode("utf-16"),
    ]
    for made in (decoder._DECODER, decoder._DISPLAY_DECODER, decoder._PLAIN_DECODER):
        for text in texts:
            expected: object
            try:
                as_str = text if isinstance(text, str) else text.decode(json.detect_encoding(text))
                if as_str.startswith("\ufeff") and isinstance(text, str):
                    raise json.JSONDecodeError(
                        "Unexpected UTF-8 BOM (decode using utf-8-sig)", as_str, 0
                    )
                expected = made.decode(as_str)
            except json.JSONDecodeError as exc:
                expected = ("error", exc.msg, exc.pos)
            try:
                found: object = decoder._loads(made, text)
            except json.JSONDecodeError as exc:
                found = ("error", exc.msg, exc.pos)
            assert repr(found) == repr(expected), text
