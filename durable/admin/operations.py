"""Admin of the operation ledger: read-only, with the operator's reconcile actions.

An operation whose outcome is unknown is settled here by an action (it did not happen:
retry the write with the same key; or abort the run), each through
:func:`durable.services.runs.operation_reconcile` and only with the ``change_operation``
permission. Apart because it is the one history admin that changes state.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from durable.admin.base import ReadOnlyAdmin, shown
from durable.exceptions import IllegalTransition
from durable.models import Operation
from durable.services import runs as services


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = (
        "idempotency_key",
        "tool_name",
        "safety",
        "status",
        "external_id",
        "attempts",
        "run_link",
        "resolution",
        "updated_at",
    )
    list_filter = ("status", "safety", "tool_name")
    search_fields = ("=idempotency_key", "^run__id", "external_id")
    fields = (
        "idempotency_key",
        "run",
        "owner_run",
        "owners",
        "step_id",
        "tool_name",
        "safety",
        "status",
        "external_id",
        "attempts",
        "params_display",
        "result_display",
        "error_display",
        "params_hash",
        "resolution",
        "resolved_by",
        "created_at",
        "updated_at",
    )
    readonly_fields = ("params_display", "result_display", "error_display")
    actions = ("reconcile_not_happened", "reconcile_abort")

    params_display = shown("params")
    result_display = shown("result")
    error_display = shown("error", json_field=True)

    def has_reconcile_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durable.change_operation")

    @admin.action(
        description="Unknown outcome: it did not happen — retry the write",
        permissions=["reconcile"],
    )
    def reconcile_not_happened(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._reconcile(request, queryset, "not_happened")

    @admin.action(description="Unknown outcome: abort the run", permissions=["reconcile"])
    def reconcile_abort(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._reconcile(request, queryset, "abort")

    def _reconcile(
        self, request: HttpRequest, queryset: QuerySet, outcome: services.ReconcileOutcome
    ) -> None:
        done = []
        for op in queryset.order_by("pk"):
            try:
                services.operation_reconcile(
                    operation_id=op.pk, outcome=outcome, by=request.user, reason="admin action"
                )
            except (IllegalTransition, services.OperationNotFound) as exc:
                self.message_user(
                    request,
                    f"Operation {op.pk} ({op.idempotency_key}) was not changed: {exc}",
                    level=messages.ERROR,
                )
            else:
                done.append(op)
        if done:
            what = (
                "will be called again with the same idempotency key"
                if outcome == "not_happened"
                else "aborted: its run failed"
            )
            keys = ", ".join(op.idempotency_key for op in done)
            self.message_user(
                request, f"{len(done)} operation(s) {what}: {keys}", level=messages.SUCCESS
            )
