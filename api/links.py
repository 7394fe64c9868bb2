"""Approve or reject from a signed link: one-time, expiring, never deciding on a GET.

A link names one approval request and one decision, signed with the secret key
(``django.core.signing``, salted for this use) and dated: it expires after
``DURABLE_APPROVAL_LINK_SECONDS`` (default 3 days) or at the request's deadline,
whichever comes first. Opening it (GET) shows a confirmation page and changes nothing,
so a mail scanner that follows links cannot decide. The page shows the arguments as
JSON, takes a comment, and offers the other decision as well (reading the arguments is
when a person changes their mind). The POST from that page needs a
logged-in user and goes through :func:`approvals.services.approval_decide`, the inbox's
service: authority, four-eyes, N-of-M and the deadline are checked exactly as there. The
link's nonce is recorded in the same transaction as the decision, so a link decides once.

A link minted for a ``recipient`` (the approval emails, ``GET /api/v1/approvals``) is
bound to that user: only they may decide with it, and its decision is theirs. So with
N-of-M each approver gets links of their own, an approver's vote counts once however many
of their links they follow (the service counts people, not links), and nobody else's
link adds to it. The page shows the action's arguments only to a user who may decide the
request (:func:`approvals.services.authority_problems`); others see it without them.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, NamedTuple

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core import signing
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from approvals.models import ApprovalRequest
from approvals.services import (
    ApprovalExpired,
    NotAllowed,
    approval_decide,
    authority_problems,
)
from durable.exceptions import DurableError, IllegalTransition

from .models import ApprovalLinkUse

SALT = "durable.client.approval-link"
DECISIONS = ("approve", "reject")


def link_seconds() -> int:
    return int(getattr(settings, "DURABLE_APPROVAL_LINK_SECONDS", 3 * 86_400))


def approval_link(
    request_id: int, decision: str, *, recipient: Any = None, base_url: str | None = None
) -> str:
    """An absolute URL that approves or rejects ``request_id`` after a confirmation.

    ``decision``: ``"approve"`` or ``"reject"`` (``ValueError`` otherwise). Each call
    makes a new link (its own nonce). ``recipient``: the user (or their primary key) the
    link is bound to: only they may decide with it; ``None`` makes an unbound link, which
    decides as whoever logs in (the outgoing webhooks' payload). ``base_url``: default
    ``DURABLE_BASE_URL``.
    """
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {DECISIONS}, got {decision!r}")
    data: dict[str, Any] = {"r": int(request_id), "d": decision, "n": secrets.token_urlsafe(16)}
    if recipient is not None:
        data["u"] = int(getattr(recipient, "pk", recipient))
    token = signing.dumps(data, salt=SALT)
    base = (base_url or getattr(settings, "DURABLE_BASE_URL", "")).rstrip("/")
    return base + reverse("approval_link", args=[token])


def approval_links(
    request_id: int, *, recipient: Any = None, base_url: str | None = None
) -> dict[str, str]:
    """``{"approve": url, "reject": url}`` for an email or a webhook payload, bound to
    ``recipient`` when given (:func:`approval_link`)."""
    return {
        d: approval_link(request_id, d, recipient=recipient, base_url=base_url) for d in DECISIONS
    }


class LinkRefused(Exception):
    def __init__(self, message: str, status: int):
        self.status = status
        super().__init__(message)


class Link(NamedTuple):
    """What a valid link names: the request, ``"approve"``/``"reject"``, its nonce, and
    the primary key of the user it is bound to (``None``: unbound)."""

    req: ApprovalRequest
    decision: str
    nonce: str
    recipient_id: int | None


def read_link(token: str) -> Link:
    """The :class:`Link` a token names; :class:`LinkRefused` (410 expired or used, 404
    forged or unknown) otherwise."""
    try:
        data = signing.loads(token, salt=SALT, max_age=link_seconds())
    except signing.SignatureExpired:
        raise LinkRefused("This link has expired. Decide in the approvals inbox.", 410) from None
    except (signing.BadSignature, ValueError, TypeError):
        raise LinkRefused("This link is not valid.", 404) from None
    if not isinstance(data, dict) or data.get("d") not in DECISIONS:
        raise LinkRefused("This link is not valid.", 404)
    recipient = data.get("u")
    if recipient is not None and not isinstance(recipient, int):
        raise LinkRefused("This link is not valid.", 404)
    req = (
        ApprovalRequest.objects.select_related("run", "arguments", "approver_group")
        .filter(pk=data.get("r"))
        .first()
    )
    if req is None:
        raise LinkRefused("The approval request of this link no longer exists.", 404)
    nonce = str(data.get("n", ""))[:64]
    if ApprovalLinkUse.objects.filter(nonce=nonce).exists():
        raise LinkRefused("This link was already used; a link decides only once.", 410)
    return Link(req, data["d"], nonce, recipient)


def _not_the_recipient(user: Any, link: Link) -> str:
    """Why ``user`` may not decide with ``link`` although they may decide the request
    (empty: they may)."""
    if link.recipient_id is None or link.recipient_id == user.pk:
        return ""
    return (
        "this link was sent to another approver and decides only as them; "
        "decide in the approvals inbox or with your own link"
    )


def _other(decision: str) -> str:
    return "reject" if decision == "approve" else "approve"


class ConfirmForm(forms.Form):
    comment = forms.CharField(required=False, max_length=4000, widget=forms.Textarea)


def _page(request: HttpRequest, status: int = 200, **context: Any) -> HttpResponse:
    return render(request, "api/approval_link.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def approval_link_view(request: HttpRequest, token: str) -> HttpResponse:
    """GET: the confirmation page (no change). POST: the decision, once: the link's,
    or the other one when the form's ``decision`` asks for it (a comment is required to
    reject)."""
    try:
        link = read_link(token)
    except LinkRefused as exc:
        return _page(request, exc.status, refused=str(exc))
    req, decision, nonce = link.req, link.decision, link.nonce
    if request.method == "POST" and request.POST.get("decision") in DECISIONS:
        # the page offers the other decision too: a person who opened "approve" and
        # read the arguments may reject instead (the same checks; the link is used up)
        decision = request.POST["decision"]
    context: dict[str, Any] = {"req": req, "decision": decision, "other": _other(decision)}
    problems = authority_problems(request.user, req)
    if not problems:  # the arguments only to who may decide (the recipient among them)
        context["show_arguments"] = True
        arguments = (
            req.arguments.value_for_display() if req.arguments else req.payload_for_display()
        )
        context["arguments"] = json.dumps(arguments, indent=2, ensure_ascii=False, default=str)
    elsewhere = _not_the_recipient(request.user, link)
    if request.method == "GET":
        context["problems"] = problems
        context["elsewhere"] = elsewhere
        return _page(request, form=ConfirmForm(), **context)
    if elsewhere:
        return _page(request, 403, refused=f"Not allowed: {elsewhere}.")
    form = ConfirmForm(request.POST)
    comment = form.data.get("comment", "") if form.is_valid() else ""
    if not form.is_valid() or (decision == "reject" and not comment.strip()):
        context["error"] = "Say why you reject it: the agent receives this comment."
        return _page(request, 422, form=form, **context)
    expired: ApprovalExpired | None = None
    try:
        with transaction.atomic():
            ApprovalLinkUse.objects.create(
                nonce=nonce, request_id=req.pk, user=request.user, decision=decision
            )
            try:
                approval_decide(
                    request_id=req.pk,
                    user=request.user,
                    approve=decision == "approve",
                    comment=comment,
                )
            except ApprovalExpired as exc:
                # the service applied the timeout's outcome (here a savepoint): it must
                # commit, as it would outside this block; the link is used up with it
                expired = exc
    except IntegrityError:
        return _page(request, 410, refused="This link was already used.")
    except NotAllowed as exc:
        return _page(request, 403, refused=f"Not allowed: {exc}.")
    except IllegalTransition as exc:  # already decided, expired, the run finished
        return _page(request, 409, refused=f"Nothing changed: {exc}.")
    except (DurableError, ValueError) as exc:
        return _page(request, 422, refused=str(exc))
    if expired is not None:
        return _page(request, 409, refused=f"Nothing changed: {expired}.")
    req.refresh_from_db()
    return _page(request, done=True, **context)
