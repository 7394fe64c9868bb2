"""The runs API: start (idempotent), list, read, and every run action, including the
refusals: a missing scope or permission (403), an illegal transition (409), invalid
input (422) -- each as a problem details document."""

from __future__ import annotations

import pytest

import durable
from durable.models import Operation, Run, Signal, TraceEvent
from durable.testing import drive
from tests.api.conftest import api_for
from tests.dashboard import dash_workflows as dw

pytestmark = pytest.mark.django_db(transaction=True)

PROBLEM = "application/problem+json"


def assert_problem(response, status: int, *words: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["status"] == status and body["type"].startswith("urn:durable:problem:")
    for word in words:
        assert word in body["detail"], body["detail"]
    return body


# --- start ---------------------------------------------------------------------------


def test_start_creates_a_run_started_by_the_token_user(operator_api, operator):
    response = operator_api.post("/runs", {"workflow": "dash.echo", "input": {"a": 1}})
    assert response.status_code == 201
    body = response.json()
    run = Run.objects.get(pk=body["id"])
    assert run.started_by == operator and body["started_by"] == "otto"
    assert body["status"] == "pending" and body["input"] == {"a": 1}


def test_start_is_idempotent_on_run_id(operator_api):
    first = operator_api.post("/runs", {"workflow": "dash.echo", "input": 1, "run_id": "r-1"})
    again = operator_api.post("/runs", {"workflow": "dash.echo", "input": 1, "run_id": "r-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert Run.objects.filter(pk="r-1").count() == 1
    other = operator_api.post("/runs", {"workflow": "dash.echo", "input": 2, "run_id": "r-1"})
    assert_problem(other, 409, "r-1")


def test_idempotency_key_header_returns_the_same_run(operator_api, admin_api):
    key = {"Idempotency-Key": "order-42"}
    first = operator_api.post("/runs", {"workflow": "dash.echo", "input": 1}, headers=key)
    again = operator_api.post("/runs", {"workflow": "dash.echo", "input": 1}, headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Run.objects.count() == 1
    # another body under the same key is refused, naming the key; nothing new is made
    assert_problem(
        operator_api.post("/runs", {"workflow": "dash.echo", "input": 2}, headers=key),
        409,
        "Idempotency-Key 'order-42'",
        "different input",
    )
    # a run_id besides the key: two keys for one request, refused
    both = {"workflow": "dash.echo", "input": 1, "run_id": "r-9"}
    assert_problem(operator_api.post("/runs", both, headers=key), 422, "not both")
    # keys are per user: someone else's "order-42" is another run
    theirs = admin_api.post("/runs", {"workflow": "dash.echo", "input": 1}, headers=key)
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]


@pytest.mark.parametrize(
    "body, words",
    [
        ({"workflow": "no.such"}, ["not registered"]),
        ({"workflow": "dash.echo", "run_id": "bad id!"}, ["run_id"]),
        ({"workflow": "dash.echo", "max_steps": 0}, ["max_steps"]),
        ({"input": 1}, ["workflow"]),
        ({"workflow": "dash.echo", "tags": ["sk-abcdefghijklmnopqrstuvwxyz123456"]}, []),
        ({"workflow": "dash.echo", "tags": ["invoice\u202efdp.exe"]}, ["U+202E", "tag"]),
    ],
)
def test_start_with_invalid_input_is_a_422_and_makes_nothing(operator_api, body, words):
    assert_problem(operator_api.post("/runs", body), 422, *words)
    assert not Run.objects.exists()


def test_a_body_that_is_not_json_or_too_deep_is_a_400(operator_api):
    bad = operator_api.client.post(
        "/api/v1/runs", "{nope", content_type="application/json", headers=operator_api.headers
    )
    assert_problem(bad, 400, "not valid JSON")
    deep = '{"workflow": "dash.echo", "input": ' + "[" * 5000 + "]" * 5000 + "}"
    response = operator_api.client.post(
        "/api/v1/runs", deep, content_type="application/json", headers=operator_api.headers
    )
    assert_problem(response, 400, "nested deeper")


def test_start_needs_the_scope_and_the_permission(operator, viewer):
    narrow = api_for(operator, scopes=["runs:read"])
    assert_problem(narrow.post("/runs", {"workflow": "dash.echo"}), 403, "runs:start")
    # a viewer's token with every scope still acts as the viewer
    assert_problem(
        api_for(viewer).post("/runs", {"workflow": "dash.echo"}), 403, "durable.operate_run"
    )
    assert not Run.objects.exists()


# --- read ----------------------------------------------------------------------------


def test_get_a_run_with_its_steps(viewer_api):
    run = drive(durable.start("dash.fail", {}).id)
    body = viewer_api.get(f"/runs/{run.id}").json()
    assert body["status"] == "failed" and body["needs_attention"] is True
    assert [s["step_id"] for s in body["steps"]] == ["first", "boom"]
    assert body["steps"][1]["error"]["type"] and body["fork_points"] == ["first", "boom"]
    assert_problem(viewer_api.get("/runs/nope"), 404, "nope")


def test_s35_a_run_and_its_step_say_why_they_failed_for_good(viewer_api):
    """S35: a 429 with ``Retry-After: inf``: the run detail says which rule made it final."""
    from tests.durable.reason_workflows import S35_WHY, s35_run

    run = s35_run()
    body = viewer_api.get(f"/runs/{run.id}").json()
    assert S35_WHY in body["error"]["reason"]
    assert body["error"]["message"].startswith("429 Too Many Requests")
    assert S35_WHY in body["steps"][0]["error"]["reason"]


def test_list_runs_filters_and_pages_by_keyset(viewer_api):
    ids = [durable.start("dash.echo", i, run_id=f"run-{i}").id for i in range(5)]
    drive(durable.start("dash.fail", {}, run_id="run-failed").id)
    failed = viewer_api.get("/runs?status=failed").json()
    assert [r["id"] for r in failed["items"]] == ["run-failed"]
    seen, cursor = [], ""
    for _ in range(10):
        page = viewer_api.get(f"/runs?workflow=dash.echo&limit=2&after={cursor}").json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))
    oldest = viewer_api.get("/runs?workflow=dash.echo&sort=created&limit=2").json()
    assert [r["id"] for r in oldest["items"]] == ids[:2]


@pytest.mark.parametrize(
    "query, word",
    [
        ("status=nope", "status"),
        ("created_from=2026-13-40", "created_from"),
        ("after=not-a-cursor", "after"),
        ("limit=0", "limit"),
        ("waiting_minutes=x", "waiting_minutes"),
    ],
)
def test_list_runs_refuses_invalid_filters(viewer_api, query, word):
    assert_problem(viewer_api.get(f"/runs?{query}"), 422, word)


def test_reading_needs_runs_read(viewer):
    assert_problem(api_for(viewer, scopes=["runs:signal"]).get("/runs"), 403, "runs:read")


# --- actions -------------------------------------------------------------------------


def test_cancel_then_cancel_again_is_a_409(operator_api):
    run = drive(durable.start("tests.signal", {}).id)
    response = operator_api.post(f"/runs/{run.id}/cancel", {"reason": "not needed"})
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    event = TraceEvent.objects.get(run=run, kind="cancelled")
    assert event.actor == "otto" and "not needed" in event.message
    body = assert_problem(operator_api.post(f"/runs/{run.id}/cancel"), 409, "it is cancelled")
    assert body["current_status"] == "cancelled"


def test_actions_need_runs_operate_and_the_permission(operator, viewer_api):
    run = drive(durable.start("tests.signal", {}).id)
    assert_problem(viewer_api.post(f"/runs/{run.id}/cancel"), 403, "durable.operate_run")
    narrow = api_for(operator, scopes=["runs:read", "runs:signal"])
    assert_problem(narrow.post(f"/runs/{run.id}/cancel"), 403, "runs:operate")
    assert Run.objects.get(pk=run.id).status == "waiting"


def test_resume_a_failed_run_and_refuse_a_waiting_one(operator_api):
    failed = drive(durable.start("dash.fail", {}).id)
    response = operator_api.post(f"/runs/{failed.id}/resume", {"extra_steps": 5})
    assert response.status_code == 200 and response.json()["status"] == "pending"
    assert response.json()["max_steps"] == 10005
    waiting = drive(durable.start("tests.signal", {}).id)
    assert_problem(operator_api.post(f"/runs/{waiting.id}/resume"), 409, "resume")
    assert_problem(operator_api.post(f"/runs/{failed.id}/resume", {"extra_steps": -1}), 422)


def test_compensate_a_cancelled_run_and_refuse_a_succeeded_one(operator_api):
    waiting = drive(durable.start("tests.signal", {}).id)
    operator_api.post(f"/runs/{waiting.id}/cancel")
    response = operator_api.post(f"/runs/{waiting.id}/compensate", {"reason": "undo"})
    assert response.status_code == 200 and response.json()["status"] == "compensating"
    done = drive(durable.start("dash.echo", 1).id)
    assert done.status == "succeeded"
    assert_problem(operator_api.post(f"/runs/{done.id}/compensate"), 409, "compensate")


def test_fork_a_finished_run(operator_api):
    failed = drive(durable.start("dash.fail", {}).id)
    response = operator_api.post(
        f"/runs/{failed.id}/fork", {"from_step": "boom", "new_run_id": "the-fork"}
    )
    assert response.status_code == 201
    assert response.json()["id"] == "the-fork" and response.json()["forked_from"] == failed.id
    assert_problem(operator_api.post(f"/runs/{failed.id}/fork", {"from_step": "nope"}), 422)
    waiting = drive(durable.start("tests.signal", {}).id)
    assert_problem(operator_api.post(f"/runs/{waiting.id}/fork", {"from_step": "go"}), 409, "fork")


def test_a_fork_run_id_reused_returns_the_fork_or_is_a_409(operator_api):
    """new_run_id is a key: the same fork again is a 200 with it; another source or step
    under the id, or the id of a run that is no fork, is a 409 naming the id."""
    failed = drive(durable.start("dash.fail", {}, run_id="src").id)
    body = {"from_step": "boom", "new_run_id": "the-fork"}
    first = operator_api.post(f"/runs/{failed.id}/fork", body)
    again = operator_api.post(f"/runs/{failed.id}/fork", body)
    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json()["id"] == "the-fork"
    other_step = operator_api.post(f"/runs/{failed.id}/fork", {**body, "from_step": "first"})
    assert_problem(other_step, 409, "fork run id 'the-fork'", "different from_step")
    taken = operator_api.post(f"/runs/{failed.id}/fork", {**body, "new_run_id": "src"})
    assert_problem(taken, 409, "fork run id 'src'", "different source run")
    assert Run.objects.filter(forked_from=failed).count() == 1


def test_signal_is_delivered_once_per_dedupe_key(operator_api):
    run = drive(durable.start("tests.signal", {}).id)
    body = {"name": "go", "payload": {"ok": True}, "dedupe_key": "evt_1"}
    first = operator_api.post(f"/runs/{run.id}/signals", body)
    assert first.status_code == 200 and first.json()["delivery"] == "delivered"
    again = operator_api.post(f"/runs/{run.id}/signals", body)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert Signal.objects.filter(run=run).count() == 1
    assert drive(run.id).output_value() == {"got": {"ok": True}}
    # the run has finished: signals are refused
    assert_problem(operator_api.post(f"/runs/{run.id}/signals", {"name": "go"}), 409)


def test_s33_a_dedupe_key_reused_with_another_payload_is_a_409(operator_api):
    """evt-1 with {"amount": 10}, then evt-1 with {"amount": 99}: a conflict naming the
    key, and the one signal stored keeps the 10."""
    run = durable.start("tests.signal", {})
    body = {"name": "go", "payload": {"amount": 10}, "dedupe_key": "evt-1"}
    assert operator_api.post(f"/runs/{run.id}/signals", body).status_code == 200
    other = operator_api.post(f"/runs/{run.id}/signals", {**body, "payload": {"amount": 99}})
    assert_problem(other, 409, "'evt-1'", "different payload")
    assert Signal.objects.filter(run=run).count() == 1
    assert drive(run.id).output_value() == {"got": {"amount": 10}}


@pytest.mark.parametrize(
    ("first", "again", "status"),
    [
        ({"a": 1, "b": [2, 3]}, {"b": [2, 3], "a": 1}, 200),  # key order does not count
        ({"amount": 10}, {"amount": 10.0}, 409),  # types do, as the codec stores them
        ({"ok": True}, {"ok": 1}, 409),
        (None, None, 200),
    ],
)
def test_a_dedupe_key_compares_json_payloads_as_they_are_stored(operator_api, first, again, status):
    run = durable.start("tests.signal", {})
    body = {"name": "go", "dedupe_key": "k"}
    assert (
        operator_api.post(f"/runs/{run.id}/signals", {**body, "payload": first}).status_code == 200
    )
    response = operator_api.post(f"/runs/{run.id}/signals", {**body, "payload": again})
    assert response.status_code == status, response.content
    assert Signal.objects.filter(run=run).count() == 1


def test_signal_needs_runs_signal(operator):
    run = drive(durable.start("tests.signal", {}).id)
    narrow = api_for(operator, scopes=["runs:operate"])
    assert_problem(narrow.post(f"/runs/{run.id}/signals", {"name": "go"}), 403, "runs:signal")


def test_reconcile_an_unknown_outcome(operator_api):
    dw.KNOBS["unknown"] = 1
    run = drive(durable.start("dash.transfer", {"amount": 5}).id)
    op = Operation.objects.get(run=run)
    response = operator_api.post(
        f"/operations/{op.pk}/reconcile",
        {"outcome": "happened", "result": {"transfer": "tr_5"}, "external_id": "tr_5"},
    )
    assert response.status_code == 200, response.content
    assert response.json()["run_status"] == "pending"
    assert_problem(operator_api.post(f"/operations/{op.pk}/reconcile", {"outcome": "abort"}), 409)
    assert_problem(operator_api.post("/operations/999999/reconcile", {"outcome": "abort"}), 404)
    assert_problem(operator_api.post(f"/operations/{op.pk}/reconcile", {"outcome": "maybe"}), 422)


def test_lookup_asks_the_reconcile_hook_again_and_changes_nothing(operator_api, viewer_api):
    dw.KNOBS["unknown"] = 1  # the write times out while the provider's lookup is down
    run = drive(durable.start("dash.payout", {"amount": 4}).id)
    op = Operation.objects.get(run=run)
    response = operator_api.post(f"/operations/{op.pk}/lookup", {})
    assert response.status_code == 200, response.content
    assert response.json()["found"] is None
    assert "lookup API is down" in response.json()["error"]
    dw.provider_records(op.idempotency_key, {"payment": "pay_x", "amount": 4})
    found = operator_api.post(f"/operations/{op.pk}/lookup", {}).json()
    assert found == {
        "operation_id": op.pk,
        "tool_name": "dash.pay",
        "found": True,
        "result": {"payment": "pay_x", "amount": 4},
        "external_id": "pay_x",
        "error": "",
    }
    op.refresh_from_db()
    assert op.status == "unknown"
    assert_problem(viewer_api.post(f"/operations/{op.pk}/lookup", {}), 403, "operate_run")
    assert_problem(operator_api.post("/operations/999999/lookup", {}), 404)
    operator_api.post(f"/operations/{op.pk}/reconcile", {"outcome": "not_happened"})
    assert_problem(operator_api.post(f"/operations/{op.pk}/lookup", {}), 409)


def test_a_wrong_method_is_a_405_problem_with_its_allow_header(admin_api):
    response = admin_api.delete("/runs")
    body = assert_problem(response, 405, "DELETE", "GET")
    assert body["instance"] == "/api/v1/runs"
    assert set(response["Allow"].replace(" ", "").split(",")) == {"GET", "POST"}
    assert_problem(admin_api.get("/runs/some-run/cancel"), 405, "POST")


def test_a_runs_detail_reads_its_steps_in_a_few_queries_whatever_their_number(
    operator_api, django_assert_max_num_queries
):
    """The fork points read the steps as rows of three columns, not models (models with a
    deferred run_id once cost one query a step: 508 queries, 180 ms, for a run of 500
    steps; 500 models built for three fields, a third of the rest)."""
    from django.utils import timezone

    from durable.models import Step, StepStatus

    run = durable.start("dash.echo", {"n": 1})
    Step.objects.bulk_create(
        Step(
            run_id=run.id,
            step_id=f"s{i}",
            position=i,
            status=StepStatus.SUCCEEDED,
            finished_at=timezone.now(),
        )
        for i in range(120)
    )
    with django_assert_max_num_queries(15):
        response = operator_api.get(f"/runs/{run.id}")
    assert response.status_code == 200 and len(response.json()["steps"]) == 120
