"""Celery tasks of the API: the outgoing webhooks' outbox tick (thin: one call)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="api.emit_webhooks", ignore_result=True, max_retries=0)
def emit_webhooks_task() -> dict[str, int]:
    from .webhooks_out import emit_webhooks

    return emit_webhooks()
