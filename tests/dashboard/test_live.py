"""Live updates: the trace-event follower and the websocket consumers."""

from __future__ import annotations

import asyncio
import socket

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

import durable
from dashboard import live
from dashboard.routing import websocket_urlpatterns
from durable.models import TraceEvent
from durable.testing import drive
from tests.dashboard.conftest import login, make_user

pytestmark = pytest.mark.django_db(transaction=True)

app = URLRouter(websocket_urlpatterns)


def add_event(run, kind="note"):
    return database_sync_to_async(TraceEvent.objects.create)(run=run, kind=kind, message="x")


async def connect(path, user, headers=None, application=None):
    communicator = WebsocketCommunicator(application or app, path, headers=headers or [])
    if user is not None:
        communicator.scope["user"] = user
    connected, _ = await communicator.connect(timeout=5)
    return communicator, connected


def test_list_socket_gets_a_refresh_when_an_event_is_inserted(viewer):
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)

    async def scenario():
        ws, connected = await connect("/ws/runs/", viewer)
        assert connected
        assert await ws.receive_nothing(timeout=0.8)  # nothing changed: nothing sent
        await add_event(run)
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return message

    message = async_to_sync(scenario)()
    assert message["type"] == "refresh" and message["runs"] == [run.id]
    assert message["last"] == TraceEvent.objects.order_by("-id").first().id
    assert not live.follower.running  # the last socket closed: the follower stopped


def test_run_socket_only_hears_about_its_run(viewer):
    mine = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    other = drive(durable.start("dash.echo", {"b": 2}, version="1").id)

    async def scenario():
        ws, connected = await connect(f"/ws/runs/{mine.id}/", viewer)
        assert connected
        await add_event(other)
        assert await ws.receive_nothing(timeout=1.2)
        await add_event(mine)
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return message

    assert async_to_sync(scenario)()["runs"] == [mine.id]


def test_a_real_state_change_reaches_the_run_page(viewer):
    run = drive(durable.start("tests.signal", {}).id)

    async def scenario():
        ws, connected = await connect(f"/ws/runs/{run.id}/", viewer)
        assert connected
        await database_sync_to_async(durable.cancel)(run.id, by="ops")
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return message

    assert async_to_sync(scenario)()["type"] == "refresh"


def test_since_sends_a_refresh_for_what_happened_before_connecting(viewer):
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    rendered_at = TraceEvent.objects.order_by("-id").first().id
    TraceEvent.objects.create(run=run, kind="note")  # between the render and the socket

    async def scenario():
        ws, _ = await connect(f"/ws/runs/{run.id}/?since={rendered_at}", viewer)
        first = await ws.receive_json_from(timeout=2)
        ws2, _ = await connect(f"/ws/runs/?since={rendered_at + 1}", viewer)
        quiet = await ws2.receive_nothing(timeout=0.3)
        await ws.disconnect()
        await ws2.disconnect()
        return first, quiet

    first, quiet = async_to_sync(scenario)()
    assert first["type"] == "refresh" and first["last"] == rendered_at + 1
    assert quiet


@pytest.mark.parametrize("who", ["anonymous", "no role"])
def test_sockets_refuse_users_who_may_not_view_runs(who):
    user = AnonymousUser() if who == "anonymous" else make_user("nobody")

    async def scenario():
        ws, connected = await connect("/ws/runs/", user)
        output = await ws.receive_output(timeout=2)
        await ws.wait()
        return connected, output

    _connected, output = async_to_sync(scenario)()
    assert output == {"type": "websocket.close", "code": 4403}
    assert not live.follower.running


def test_full_asgi_application_uses_the_session_and_checks_the_origin(viewer):
    from config.asgi import application

    client = login(viewer)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)

    async def scenario():
        ws, connected = await connect(
            "/ws/runs/",
            None,
            application=application,
            headers=[
                (b"cookie", cookie),
                (b"origin", b"http://testserver"),
                (b"host", b"testserver"),
            ],
        )
        assert connected
        await add_event(run)
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        _evil, evil_connected = await connect(
            "/ws/runs/",
            None,
            application=application,
            headers=[(b"cookie", cookie), (b"origin", b"http://evil.example")],
        )
        return message, evil_connected

    message, evil_connected = async_to_sync(scenario)()
    assert message["runs"] == [run.id]
    assert not evil_connected


def _redis_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not _redis_up(), reason="no Redis on 127.0.0.1:6379")
def test_works_with_the_redis_channel_layer(viewer, settings):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": ["redis://127.0.0.1:6379/13"], "prefix": "dash-test"},
        }
    }
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)

    async def scenario():
        ws, connected = await connect(f"/ws/runs/{run.id}/", viewer)
        assert connected
        await add_event(run)
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        from channels.layers import get_channel_layer

        await get_channel_layer().close_pools()
        return message

    assert async_to_sync(scenario)()["runs"] == [run.id]


def test_ping_is_answered(viewer):
    async def scenario():
        ws, _ = await connect("/ws/runs/", viewer)
        await ws.send_json_to({"type": "ping"})
        answer = await ws.receive_json_from(timeout=2)
        await ws.disconnect()
        return answer

    assert async_to_sync(scenario)() == {"type": "pong"}


# --- the follower's cursor --------------------------------------------------------------


def test_cursor_waits_for_a_gap_then_gives_up(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    f = live.Follower()
    f.cursor = 10
    f._advance([11, 13, 14])  # 12 is missing: maybe a transaction that has not committed
    assert f.cursor == 11 and set(f.gaps) == {12}
    f._advance([12, 13, 14, 15])  # 12 committed late: picked up, cursor moves on
    assert f.cursor == 15 and not f.gaps
    f._advance([17])  # 16 never commits (rolled back)
    assert f.cursor == 15
    clock[0] += live.GAP_GRACE_SECONDS + 0.1
    f._advance([17])
    assert f.cursor == 17 and not f.gaps
    f._advance([17 + live.MAX_GAP_SPAN + 10])  # a jump of ids is not tracked as gaps
    assert f.cursor == 17 + live.MAX_GAP_SPAN + 10


def test_poll_reports_a_late_commit_once(viewer):
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    a = TraceEvent.objects.create(run=run, kind="a")
    b = TraceEvent.objects.create(run=run, kind="b")
    c = TraceEvent.objects.create(run=run, kind="c")
    f = live.Follower()
    f.cursor = a.id - 1
    sent = []

    class Layer:
        async def group_send(self, group, message):
            sent.append((group, message))

    b_id = b.id
    b.delete()  # as if b had not committed yet
    changed = async_to_sync(f.poll)(Layer())
    assert changed == [run.id] and f.cursor == a.id and b_id in f.gaps
    assert async_to_sync(f.poll)(Layer()) == []  # a and c are not reported twice
    TraceEvent.objects.create(id=b_id, run=run, kind="b")  # b commits
    assert async_to_sync(f.poll)(Layer()) == [run.id]
    assert f.cursor == c.id
    assert {g for g, _ in sent} == {live.runs_group(), live.run_group(run.id)}


def test_group_names_are_valid_for_any_run_id():
    name = live.run_group("a" * 128)
    assert len(name) < 100 and name.isascii()
    assert asyncio.iscoroutinefunction(live.follower.subscribe)
