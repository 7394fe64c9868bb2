from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from durable.models import WaitKind
        from durable.waits.closing import register_expiry_handler

        from . import receivers, services

        receivers.connect()
        register_expiry_handler(WaitKind.APPROVAL, services.approval_expire_txn)
