"""Websocket consumers of the live pages: ``/ws/runs/`` and ``/ws/runs/<id>/``.

A socket only receives hints (``{"type": "refresh", ...}``); the page then re-fetches
its fragment over HTTP, where the usual permission checks apply. A socket is accepted
for an active user holding ``durable.view_run``; anyone else is closed with code
4403 right after the handshake, so the page's script knows not to reconnect.

``?since=<event id>``: the newest event the page was rendered with. If the run (or any
run, for the list) changed between the render and the connection, a refresh is sent at
once, so nothing is missed in between (nor while a dropped socket reconnects). A
malformed ``since`` (``²``, ``-1``, 40 digits) is ignored, like a missing one.

Frames from the client are hints too: anything but a JSON ``{"type": "ping"}`` (text
that is not JSON, binary frames, huge or deeply nested JSON) is ignored, never an error
that closes the socket. Every socket that subscribed to the live follower unsubscribes
exactly once, however its connect or its life ends (``_subscribed``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from approvals.roles import VIEW_RUN
from durable.queries.parsing import BadParameter, parse_int

from . import live

FORBIDDEN = 4403
#: frames longer than this are ignored unread (clients only ever send a ping)
MAX_FRAME_CHARS = 1024


def _may_view(user: Any) -> bool:
    return bool(
        user is not None and user.is_authenticated and user.is_active and user.has_perm(VIEW_RUN)
    )


def _changed_since(since: int, run_id: str | None) -> int:
    """Id of the newest event after ``since`` (of one run, if given); 0 if none."""
    from durable.models import TraceEvent

    qs = TraceEvent.objects.filter(id__gt=since)
    if run_id is not None:
        qs = qs.filter(run_id=run_id)
    return qs.order_by("-id").values_list("id", flat=True).first() or 0


class _LiveConsumer(AsyncJsonWebsocketConsumer):
    group: str = ""
    #: whether this socket holds one subscription of ``live.follower``
    _subscribed: bool = False

    def group_name(self) -> str:  # pragma: no cover - every consumer below defines it
        raise TypeError(f"{type(self).__name__} must say which live group it follows")

    def run_id(self) -> str | None:
        return None

    def since(self) -> int | None:
        """The ``since`` query parameter, or None when it is missing or malformed."""
        raw = self.scope.get("query_string", b"")
        query = parse_qs(raw.decode("latin-1") if isinstance(raw, bytes) else "")
        try:
            return parse_int((query.get("since") or [""])[0], what="since")
        except BadParameter:
            return None

    async def connect(self) -> None:
        if not await database_sync_to_async(_may_view)(self.scope.get("user")):
            # accept, then close with 4403: the browser sees the code and stops retrying
            # (a refused handshake would only show 1006, like a network error)
            await self.accept()
            await self.close(code=FORBIDDEN)
            return
        self.group = self.group_name()
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        # from here on, _release() gives the subscription back, whatever happens next
        self._subscribed = True
        try:
            await live.follower.subscribe()
            since = self.since()
            if since is not None:
                newest = await database_sync_to_async(_changed_since)(since, self.run_id())
                if newest:
                    await self.send_json(
                        {
                            "type": "refresh",
                            "last": newest,
                            "runs": [self.run_id()] if self.run_id() else [],
                        }
                    )
        except BaseException:
            await self._release()
            raise

    async def disconnect(self, code: int) -> None:
        await self._release()

    async def _release(self) -> None:
        """Leave the group and give back the follower subscription (idempotent)."""
        try:
            if self.group:
                group, self.group = self.group, ""
                await self.channel_layer.group_discard(group, self.channel_name)
        finally:
            if self._subscribed:
                self._subscribed = False
                await live.follower.unsubscribe()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # a handler that raised ends the consumer without websocket.disconnect: release
        # here too, or the follower would poll for a socket that is gone
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """Ignore anything but small JSON text frames (never close the socket for them)."""
        if text_data is None or len(text_data) > MAX_FRAME_CHARS:
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients have nothing to say; a ping is answered so proxies keep the socket."""
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})


class RunsConsumer(_LiveConsumer):
    """Pages that list runs: told which runs changed."""

    def group_name(self) -> str:
        return live.runs_group()

    async def runs_changed(self, event: dict[str, Any]) -> None:
        await self.send_json(
            {"type": "refresh", "runs": event.get("runs", []), "last": event.get("last")}
        )


class RunConsumer(_LiveConsumer):
    """One run's page: told when that run changed."""

    def run_id(self) -> str:
        return str(self.scope["url_route"]["kwargs"]["run_id"])

    def group_name(self) -> str:
        return live.run_group(self.run_id())

    async def run_changed(self, event: dict[str, Any]) -> None:
        await self.send_json(
            {"type": "refresh", "runs": [event.get("run")], "last": event.get("last")}
        )
