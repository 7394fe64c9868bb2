"""Websocket consumers of the live pages: ``/ws/runs/`` and ``/ws/runs/<id>/``.

A socket only receives hints (``{"type": "refresh", ...}``); the page then re-fetches
its fragment over HTTP, where the usual permission checks apply. A socket is accepted
for an active user holding ``durable.view_run``; anyone else is closed with code
4403 right after the handshake, so the page's script knows not to reconnect.

``?since=<event id>``: the newest event the page was rendered with. If the run (or any
run, for the list) changed between the render and the connection, a refresh is sent at
once, so nothing is missed in between (nor while a dropped socket reconnects).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from . import live
from .roles import VIEW_RUN

FORBIDDEN = 4403


def _may_view(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active
                and user.has_perm(VIEW_RUN))


def _changed_since(since: int, run_id: str | None) -> int:
    """Id of the newest event after ``since`` (of one run, if given); 0 if none."""
    from durable.models import TraceEvent

    qs = TraceEvent.objects.filter(id__gt=since)
    if run_id is not None:
        qs = qs.filter(run_id=run_id)
    return qs.order_by("-id").values_list("id", flat=True).first() or 0


class _LiveConsumer(AsyncJsonWebsocketConsumer):
    group: str = ""

    def group_name(self) -> str:  # pragma: no cover - every consumer below defines it
        raise TypeError(f"{type(self).__name__} must say which live group it follows")

    def run_id(self) -> str | None:
        return None

    def since(self) -> int | None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        value = (query.get("since") or [""])[0]
        return int(value) if value.isdigit() else None

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
        await live.follower.subscribe()
        since = self.since()
        if since is not None:
            newest = await database_sync_to_async(_changed_since)(since, self.run_id())
            if newest:
                await self.send_json({"type": "refresh", "last": newest,
                                      "runs": [self.run_id()] if self.run_id() else []})

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            await live.follower.unsubscribe()
            self.group = ""

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients have nothing to say; a ping is answered so proxies keep the socket."""
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})


class RunsConsumer(_LiveConsumer):
    """Pages that list runs: told which runs changed."""

    def group_name(self) -> str:
        return live.runs_group()

    async def runs_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "refresh", "runs": event.get("runs", []),
                              "last": event.get("last")})


class RunConsumer(_LiveConsumer):
    """One run's page: told when that run changed."""

    def run_id(self) -> str:
        return str(self.scope["url_route"]["kwargs"]["run_id"])

    def group_name(self) -> str:
        return live.run_group(self.run_id())

    async def run_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "refresh", "runs": [event.get("run")],
                              "last": event.get("last")})
