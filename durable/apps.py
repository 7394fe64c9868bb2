from __future__ import annotations

from django.apps import AppConfig


class DurableConfig(AppConfig):
    name = "durable"
    verbose_name = "Durable"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from durable import checks  # noqa: F401  (system checks; Tool rows on migrate)
        from durable.registry import discover_later
        from durable.services import toolsync  # noqa: F401  (system checks; Tool rows on migrate)

        discover_later()  # the workflow modules are imported at the registry's first lookup
        from durable.observability import otel

        otel.connect()  # OpenTelemetry, when DURABLE['OTEL'] is set
        from durable.observability import metrics_server

        metrics_server.connect()  # a worker's metrics port, when DURABLE['METRICS_PORT'] is set
