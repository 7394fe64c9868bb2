"""URLs of the dashboard (mounted at the site root by ``config/urls.py``)."""

from __future__ import annotations

from django.urls import path

from . import actions, views

app_name = "dashboard"

urlpatterns = [
    path("", views.runs, name="runs"),
    path("runs/<str:run_id>/", views.run_detail, name="run"),
    path("runs/<str:run_id>/steps/", views.run_steps, name="steps"),
    path("runs/<str:run_id>/payload/<slug:kind>/<str:pk>/", views.run_payload, name="payload"),
    path("runs/<str:run_id>/signal/", actions.run_signal_view, name="run_signal"),
    path("runs/<str:run_id>/<slug:action>/", actions.run_action, name="run_action"),
    path("operations/<int:operation_id>/reconcile/", actions.operation_reconcile_view,
         name="reconcile"),
    path("approvals/", views.approvals, name="approvals"),
    path("approvals/<int:request_id>/decide/", actions.approval_decide_view, name="decide"),
    path("attention/", views.attention, name="attention"),
]
