"""The API's pages in the dashboard: the user's API tokens (make, revoke) and the log of
outgoing webhook deliveries. Thin views over ``api/models.py`` and the delivery runs."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals.access import require_perm
from approvals.roles import OPERATE_RUN, VIEW_RUN
from durable.models import Run
from durable.values import codec

from .models import ApiToken, WebhookAnswer, WebhookSubscription, token_create, token_revoke
from .scopes import SCOPES
from .webhooks_out import DELIVERY_WORKFLOW

DELIVERIES_SHOWN = 200


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(
        choices=[(s, f"{s}: {what}") for s, (what, _) in SCOPES.items()],
        widget=forms.CheckboxSelectMultiple,
    )


@require_http_methods(["GET", "POST"])
@require_perm(VIEW_RUN)
def tokens_page(request: HttpRequest) -> HttpResponse:
    """List the user's tokens; POST makes one and shows its secret once."""
    form = TokenForm(request.POST or None)
    made = ""
    status = 200
    if request.method == "POST":
        if form.is_valid():
            _, made = token_create(
                user=request.user,
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
            )
            form = TokenForm()
        else:
            status = 422
    tokens = ApiToken.objects.filter(user=request.user)[:200]
    context = {"form": form, "tokens": tokens, "made": made, "nav": "tokens"}
    return render(request, "api/tokens.html", context, status=status)


@require_POST
@require_perm(VIEW_RUN)
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    token = token_revoke(token_id=token_id, user=request.user)
    if token is None:
        messages.error(request, f"You have no token {token_id}.")
    else:
        messages.success(request, f"Revoked the token “{token.name}”.")
    return redirect("api_tokens")


def _delivery_row(run: Run, urls: dict[int, str]) -> dict[str, Any]:
    data = codec.decode_for_display(run.input) or {}
    event = data.get("event") or {} if isinstance(data, dict) else {}
    sub = data.get("subscription") if isinstance(data, dict) else None
    step = next(iter(run.steps.all()), None)
    return {
        "run": run,
        "event_type": event.get("type", "?"),
        "event_id": event.get("id", ""),
        "about": (event.get("data") or {}).get("run_id", ""),
        "url": urls.get(sub, "(deleted)") if isinstance(sub, int) else "?",
        "attempts": step.attempts if step else 0,
        "error": _error_text(run.error),
    }


def _error_text(error: Any) -> str:
    """A delivery's error: its message and, for a failure for good, the rule that made it
    final (the error's ``reason``, docs/architecture.md#failures-and-retries)."""
    if not isinstance(error, dict):
        return ""
    reason = error.get("reason")
    return str(error.get("message", "")) + (f" (failed for good: {reason})" if reason else "")


@require_GET
@require_perm(VIEW_RUN)
def deliveries_page(request: HttpRequest) -> HttpResponse:
    """The newest outgoing webhook deliveries: event, subscriber, status, attempts; to
    those who may operate runs, also what the receiver answered a failed attempt."""
    runs = (
        Run.objects.filter(workflow_name=DELIVERY_WORKFLOW)
        .prefetch_related("steps")
        .order_by("-created_at", "-id")[:DELIVERIES_SHOWN]
    )
    urls = {sub.pk: sub.display_url for sub in WebhookSubscription.objects.only("pk", "url")}
    rows = [_delivery_row(run, urls) for run in runs]
    # what the receivers answered is their words, not ours: for operators only
    may_operate = request.user.has_perm(OPERATE_RUN)
    if may_operate:
        answers = WebhookAnswer.objects.in_bulk([row["run"].pk for row in rows])
        for row in rows:
            row["answer"] = answers.get(row["run"].pk)
    context = {"rows": rows, "nav": "webhooks", "may_operate": may_operate}
    return render(request, "api/deliveries.html", context)
