from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    verbose_name = "JSON API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (system checks of the webhook allow-list)
        from .retention import register

        register()  # retention keeps runs whose webhook events are not delivered yet
