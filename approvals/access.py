"""Who may do what: login for every page, a named permission for every action, for the
dashboard's pages and the API's (both web apps reach it here, neither imports the other).

A refusal is a 403 whose page names the missing permission (``403.html`` shows the
``PermissionDenied`` message), so the user knows what to ask an administrator for.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect

from approvals.roles import DECIDE_APPROVAL, OPERATE_RUN, VIEW_RUN

#: permission -> (what it allows, the group that grants it)
DESCRIPTIONS = {
    VIEW_RUN: ("see runs", "viewer"),
    OPERATE_RUN: ("cancel, compensate, resume, fork and reconcile runs", "operator"),
    DECIDE_APPROVAL: ("approve or reject pending actions", "approver"),
}


def missing_message(perm: str) -> str:
    what, group = DESCRIPTIONS.get(perm, ("do this", "admin"))
    return (
        f"You are missing the permission “{perm}”, needed to {what}. Ask an "
        f"administrator to add you to the “{group}” group."
    )


def check_perm(user: Any, perm: str) -> None:
    """Raise ``PermissionDenied`` naming ``perm`` unless ``user`` holds it."""
    if not user.has_perm(perm):
        raise PermissionDenied(missing_message(perm))


def login_redirect(request: HttpRequest) -> HttpResponse:
    if getattr(request, "htmx", False):
        # an expired session during an HTMX request: send the whole page to the login
        login = resolve_url(settings.LOGIN_URL)
        current = urlsplit(request.headers.get("HX-Current-URL") or "/")
        path = current.path + (f"?{current.query}" if current.query else "")
        return HttpResponseClientRedirect(f"{login}?{urlencode({'next': path or '/'})}")
    return redirect_to_login(request.get_full_path())


def require_perm(perm: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Login required, then ``perm`` (403 naming it otherwise)."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return login_redirect(request)
            check_perm(request.user, perm)
            return view(request, *args, **kwargs)

        return wrapper

    return decorator
