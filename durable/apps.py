from __future__ import annotations

from django.apps import AppConfig


class DurableConfig(AppConfig):
    name = "durable"
    verbose_name = "Durable"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers system checks)
        from .registry import autodiscover

        autodiscover()
