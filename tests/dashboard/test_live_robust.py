"""The live sockets survive malformed parameters and frames, and always let go of the
trace-event follower, however a socket ends (channels' WebsocketCommunicator)."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

import durable
from dashboard import consumers, live
from dashboard.routing import websocket_urlpatterns
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)

app = URLRouter(websocket_urlpatterns)


async def _open(path, user):
    ws = WebsocketCommunicator(app, path)
    ws.scope["user"] = user
    connected, _ = await ws.connect(timeout=5)
    return ws, connected


@pytest.mark.parametrize("since", ["²", "1²", "-1", "9" * 40, "%00", "x", "", "1e3"])
def test_a_malformed_since_is_ignored(viewer, since):
    async def scenario():
        ws, connected = await _open(f"/ws/runs/?since={since}", viewer)
        assert connected
        assert live.follower.subscribers == 1
        await ws.send_json_to({"type": "ping"})
        answer = await ws.receive_json_from(timeout=5)  # still open and answering
        await ws.disconnect()
        return answer

    assert async_to_sync(scenario)() == {"type": "pong"}
    assert live.follower.subscribers == 0 and not live.follower.running


def test_malformed_frames_are_ignored_and_the_socket_stays_open(viewer):
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)

    async def scenario():
        ws, connected = await _open(f"/ws/runs/{run.id}/", viewer)
        assert connected
        for frame in (
            "not json",
            "{",
            "[" * 100_000,
            '{"type": "ping"' + " " * 5000 + "}",
            "\x00",
            '"ping"',
            "null",
            "[]",
            '{"type": ["ping"]}',
        ):
            await ws.send_to(text_data=frame)
        await ws.send_to(bytes_data=b"\x00\xff binary")
        assert await ws.receive_nothing(timeout=0.3)  # nothing answered, nothing closed
        await ws.send_json_to({"type": "ping"})
        answer = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return answer

    assert async_to_sync(scenario)() == {"type": "pong"}
    assert live.follower.subscribers == 0


def test_subscriptions_are_released_after_crashes(viewer, monkeypatch):
    """A consumer whose connect or handler raises still gives its subscription back,
    so the follower does not poll for sockets that are gone."""

    def broken(since, run_id):
        raise RuntimeError("the database went away")

    async def crash_on_connect():
        monkeypatch.setattr(consumers, "_changed_since", broken)
        ws = WebsocketCommunicator(app, "/ws/runs/?since=1")
        ws.scope["user"] = viewer
        connected, _ = await ws.connect(timeout=5)  # accepted, then connect() raises
        assert connected
        with pytest.raises(RuntimeError):
            await ws.wait(timeout=5)
        monkeypatch.undo()

    async def crash_in_handler():
        ws, connected = await _open("/ws/runs/some-run/", viewer)
        assert connected

        async def boom(self, event):
            raise RuntimeError("a bug in a handler")

        # the run page's consumer (the keeper below follows the list: it must not crash)
        monkeypatch.setattr(consumers.RunConsumer, "run_changed", boom)
        await ws.send_input({"type": "websocket.receive", "text": '{"type": "ping"}'})
        await ws.receive_output(timeout=5)  # pong
        from channels.layers import get_channel_layer

        await get_channel_layer().group_send(
            live.run_group("some-run"), {"type": "run.changed", "run": "some-run"}
        )
        with pytest.raises(RuntimeError):
            await ws.wait(timeout=5)
        monkeypatch.undo()

    async def scenario():
        keeper, connected = await _open("/ws/runs/", viewer)  # one socket stays open
        assert connected
        for _ in range(3):
            await crash_on_connect()
            assert live.follower.subscribers == 1
            await crash_in_handler()
            assert live.follower.subscribers == 1
        assert live.follower.running
        await keeper.disconnect()
        return live.follower.subscribers, live.follower.running

    assert async_to_sync(scenario)() == (0, False)
