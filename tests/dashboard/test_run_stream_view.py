"""``GET /runs/<id>/stream/``: the run page's live output as server-sent events
(dashboard/streams.py), under the page's own session and permission."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

import durable
from durable.models import StreamEvent
from durable.testing import drive
from tests.dashboard.conftest import login

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def streamed_run(transactional_db):
    run = drive(durable.start("dash.echo", {"n": 1}, version="1").id)
    now = timezone.now()
    StreamEvent.objects.bulk_create(
        StreamEvent(run_id=run.id, seq=i, step_id="llm", kind=k, data=d, created_at=now)
        for i, (k, d) in enumerate(
            [
                ("step_started", {"model": "m"}),
                ("token", {"delta": "hel"}),
                ("token", {"delta": "lo"}),
                ("step_ended", {"finish_reason": "stop", "usage": None, "cost_usd": None}),
            ],
            start=1,
        )
    )
    return run


def body(response) -> str:
    return b"".join(response.streaming_content).decode()


def test_the_stream_is_sent_to_a_viewer_and_ends_with_the_run(viewer_client, streamed_run):
    response = viewer_client.get(f"/runs/{streamed_run.id}/stream/")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    text = body(response)
    assert text.count("event: token") == 2 and '"delta":"hel"' in text
    assert text.rstrip().endswith('event: end\ndata: {"status": "succeeded"}')


def test_after_and_last_event_id_resume_after_that_event(viewer_client, streamed_run):
    url = f"/runs/{streamed_run.id}/stream/"
    assert "id: 1\n" not in body(viewer_client.get(url + "?after=2"))
    resumed = body(viewer_client.get(url, headers={"Last-Event-ID": "3"}))
    assert resumed.startswith("id: 4\nevent: step_ended")


@pytest.mark.parametrize("bad", ["-1", "²", "1" * 19, "x"])
def test_a_malformed_position_is_a_400_that_names_it(viewer_client, streamed_run, bad):
    response = viewer_client.get(f"/runs/{streamed_run.id}/stream/", {"after": bad})
    assert response.status_code == 400
    assert "after" in response.content.decode()


def test_an_unknown_run_is_a_404(viewer_client):
    assert viewer_client.get("/runs/no-such-run/stream/").status_code == 404


def test_it_needs_a_session_and_the_view_permission(streamed_run):
    url = f"/runs/{streamed_run.id}/stream/"
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    nobody = login(User.objects.create_user("nemo", password="x"))
    assert nobody.get(url).status_code == 403


def test_the_run_page_offers_its_stream_only_when_there_is_one(viewer_client, streamed_run):
    page = viewer_client.get(f"/runs/{streamed_run.id}/").content.decode()
    assert f'data-stream-url="/runs/{streamed_run.id}/stream/"' in page
    other = drive(durable.start("dash.echo", {"n": 2}, version="1").id)
    assert "data-stream-url" not in viewer_client.get(f"/runs/{other.id}/").content.decode()
