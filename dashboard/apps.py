from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals.roles import ensure_roles_after_migrate

        post_migrate.connect(
            ensure_roles_after_migrate, sender=self, dispatch_uid="dashboard.ensure_roles"
        )
