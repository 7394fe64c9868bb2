"""Websocket URLs: one live feed per page (``config/asgi.py`` mounts them)."""

from __future__ import annotations

from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/runs/", consumers.RunsConsumer.as_asgi(), name="ws-runs"),
    path("ws/runs/<str:run_id>/", consumers.RunConsumer.as_asgi(), name="ws-run"),
]
