"""URLs of the dashboard (mounted at the site root by ``config/urls.py``).

Path parameters use the strict converters of :mod:`durable.queries.parsing`: a run id outside
the run-id alphabet or a number that is not 1-18 ASCII digits does not match (404).
"""

from __future__ import annotations

from django.urls import path, register_converter

from durable.queries.parsing import PayloadKeyConverter, PositiveIntConverter, RunIdConverter

from . import (
    actions,
    bulk,
    compare,
    deploy,
    exports,
    overview,
    saved_views,
    schedules,
    start,
    streams,
    views,
)

app_name = "dashboard"

register_converter(PositiveIntConverter, "id")
register_converter(RunIdConverter, "run_id")
register_converter(PayloadKeyConverter, "payload_key")

urlpatterns = [
    path("", views.runs, name="runs"),
    # before runs/<run_id>/, whose converter would take "new"
    path("runs/new/", start.start_run, name="start_run"),
    path("runs/compare/", compare.compare_runs, name="compare"),
    path("runs/bulk/", bulk.bulk_action, name="bulk"),
    path("views/save/", saved_views.save_view, name="save_view"),
    path("views/<int:pk>/rename/", saved_views.rename_view, name="rename_view"),
    path("views/<int:pk>/delete/", saved_views.delete_view, name="delete_view"),
    path("runs/<run_id:run_id>/", views.run_detail, name="run"),
    path("runs/<run_id:run_id>/steps/", views.run_steps, name="steps"),
    path(
        "runs/<run_id:run_id>/payload/<slug:kind>/<payload_key:pk>/",
        views.run_payload,
        name="payload",
    ),
    path("runs/<run_id:run_id>/stream/", streams.run_stream, name="run_stream"),
    path("runs/<run_id:run_id>/signal/", actions.run_signal_view, name="run_signal"),
    # before run_action, whose <slug:action> would take "export"
    path("runs/<run_id:run_id>/export/", exports.run_export, name="run_export"),
    path("runs/<run_id:run_id>/export.json", exports.run_export_json, name="run_export_json"),
    path("runs/<run_id:run_id>/<slug:action>/", actions.run_action, name="run_action"),
    path(
        "operations/<id:operation_id>/reconcile/",
        actions.operation_reconcile_view,
        name="reconcile",
    ),
    path(
        "operations/<id:operation_id>/lookup/",
        actions.operation_lookup_view,
        name="lookup",
    ),
    path("approvals/", views.approvals, name="approvals"),
    path("approvals/<id:request_id>/decide/", actions.approval_decide_view, name="decide"),
    path("approvals/approve-identical/", actions.approve_identical_view, name="decide_many"),
    path("attention/", views.attention, name="attention"),
    path("overview/", overview.overview, name="overview"),
    path("schedules/", schedules.schedules, name="schedules"),
    path("deploy/", deploy.deploy_check, name="deploy"),
    path("deploy/check/", deploy.deploy_check_run, name="deploy_check"),
    path(
        "schedules/<run_id:name>/<slug:action>/",
        schedules.schedule_action,
        name="schedule_action",
    ),
]
