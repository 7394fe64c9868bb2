"""Deciding approval requests (ARCHITECTURE.md: one service, one transaction).

Authority is checked when the person acts, not when the request was made: the user must
still be active and still hold ``approvals.decide_approval`` (and be in the request's
approver group), since a decision may come days after the request.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from durable import codec, requesters, transitions
from durable.exceptions import DurableError, IllegalTransition
from durable.models import Run, TraceEvent, Wait, WaitStatus
from durable.types import Decision
from durable.waits import close_wait_txn

from .models import ApprovalDecision, ApprovalRequest, ApprovalStatus

PERMISSION = "approvals.decide_approval"


class ApprovalNotFound(DurableError):
    """No approval request has that id (or the run has not reached its wait yet)."""

    def __init__(self, request_id: Any):
        self.request_id = request_id
        super().__init__(f"approval request {request_id} does not exist; if its run was just "
                         "started it may not have reached the wait yet: try again shortly")


class AlreadyDecided(IllegalTransition):
    """The request (or this user's part of it) was already decided; nothing changed."""


class NotAllowed(DurableError):
    """The user may not make this decision; ``missing`` says what they lack."""

    def __init__(self, message: str, *, missing: list[str]):
        self.missing = missing
        super().__init__(message)


def authority_problems(user: Any, request: ApprovalRequest) -> list[str]:
    """What ``user`` lacks to decide ``request`` (empty: nothing). Reads fresh from the DB."""
    problems: list[str] = []
    if user is None or not getattr(user, "is_active", False):
        return ["an active account"]
    if not user.has_perm(PERMISSION):
        problems.append(f"the permission {PERMISSION}")
    if (request.approver_group_id and not user.is_superuser
            and not user.groups.filter(pk=request.approver_group_id).exists()):
        problems.append(f"membership of the group {request.approver_group.name!r}")
    return problems


def own_request(user: Any, req: ApprovalRequest) -> str:
    """Whether ``user`` asked for ``req``, for the four-eyes rule: ``"starter"`` (they
    started its run), ``"requester"`` (they forked it, started a run it was forked from,
    or the workflow named them) or ``""`` (they did not ask). See :mod:`durable.requesters`.
    """
    if user is None or getattr(user, "pk", None) is None:
        return ""
    asked = list(req.requesters or [])
    if requesters.includes(user, asked[:1]) or (
            req.requested_by_id is not None and req.requested_by_id == user.pk):
        return "starter"
    if requesters.includes(user, asked[1:]):
        return "requester"
    return ""


def _describe(req: ApprovalRequest) -> str:
    when = req.decided_at.isoformat(timespec="seconds") if req.decided_at else "?"
    return f"already {req.status} by {req.decided_by or 'the system'} at {when}"


def approval_decide(*, request_id: int, user: Any, approve: bool, comment: str = "",
                    edited: Any = None) -> ApprovalRequest:
    """Approve or reject an approval request; with N-of-M, count this user's approval.

    ``edited``: new parameters (a dict), only where the request allows editing. A
    rejection's ``comment`` reaches the agent as a model-recoverable message.

    Raises :class:`ApprovalNotFound`, :class:`AlreadyDecided` ("already decided by X at
    T"; nothing changes), :class:`~durable.IllegalTransition` (the run was cancelled or
    has finished), :class:`NotAllowed` (inactive user, missing permission or group,
    four-eyes, editing not allowed), ``ValueError`` (bad ``edited``).
    """
    User = get_user_model()
    now = timezone.now()
    comment = (comment or "").strip()[:4000]
    with transaction.atomic():
        run_id = (ApprovalRequest.objects.filter(pk=request_id)
                  .values_list("run_id", flat=True).first())
        if run_id is None:
            raise ApprovalNotFound(request_id)
        # lock order: the run first, then its rows -- as run_cancel, run_signal and the
        # sweeper do; locking the request first deadlocks against a concurrent cancel
        run = Run.objects.select_for_update().get(pk=run_id)
        req = (ApprovalRequest.objects.select_for_update(of=("self",))
               .select_related("approver_group").get(pk=request_id))
        if req.status != ApprovalStatus.PENDING:
            raise AlreadyDecided(f"approval {req.pk} ({req.title}): {_describe(req)}",
                                 current=req.status)
        if not transitions.can("decide", run):
            raise IllegalTransition(
                f"approval {req.pk}: run {run.id} is {run.status}; decisions on cancelled or "
                "finished runs are refused", current=run.status)
        wait = Wait.objects.select_for_update().get(pk=req.wait_id)
        if wait.status != WaitStatus.PENDING:
            raise AlreadyDecided(f"approval {req.pk}: its wait is already {wait.status}",
                                 current=wait.status)
        fresh = User.objects.filter(pk=getattr(user, "pk", None)).first()
        problems = authority_problems(fresh, req)
        if problems:
            raise NotAllowed(f"{getattr(user, 'username', user)} may not decide approval "
                             f"{req.pk}: missing {', '.join(problems)}", missing=problems)
        own = own_request(fresh, req) if approve and req.four_eyes else ""
        if own:
            what = (f"started run {run.id}" if own == "starter" else
                    f"asked for run {run.id} (forked it, started a run it was forked from, "
                    "or is named as its requester)")
            raise NotAllowed(f"four-eyes rule: {fresh.get_username()} {what} and cannot "
                             "approve their own request; another approver must",
                             missing=["a different approver than the run's starter"
                                      if own == "starter" else
                                      "a different approver than those who asked for it"])
        edited_text = None
        if edited is not None:
            if not req.allow_edit:
                raise NotAllowed(f"approval {req.pk} does not allow editing the parameters",
                                 missing=["a policy that allows editing"])
            if not isinstance(edited, dict):
                raise ValueError("edited parameters must be a JSON object (a dict)")
            edited_text = codec.dumps_checked(edited, what="edited parameters")
        previous = req.decisions.filter(user=fresh).first()
        if previous is not None:
            raise AlreadyDecided(
                f"approval {req.pk}: {fresh.get_username()} already "
                f"{'approved' if previous.approved else 'rejected'} at "
                f"{previous.created_at.isoformat(timespec='seconds')}", current=req.status)
        ApprovalDecision.objects.create(request=req, user=fresh, approved=bool(approve),
                                        comment=comment, edited=edited_text, created_at=now)
        username = fresh.get_username()
        if approve:
            approvers = list(req.decisions.filter(approved=True).order_by("created_at")
                             .values_list("user__username", flat=True))
            if len(approvers) < req.required_approvals:
                TraceEvent.objects.create(
                    run=run, kind="approval_recorded", step_id=wait.wait_id, actor=username,
                    message=f"approved by {username} ({len(approvers)} of "
                            f"{req.required_approvals})")
                return req
            decision = Decision(approved=True, decided_by=tuple(approvers),
                                decided_at=now.isoformat(), comment=comment,
                                edited=edited if edited is not None else None)
            req.status = ApprovalStatus.APPROVED
            req.decided_by = ", ".join(approvers)[:400]
        else:
            decision = Decision(approved=False, decided_by=(username,),
                                decided_at=now.isoformat(), comment=comment)
            req.status = ApprovalStatus.REJECTED
            req.decided_by = username
        req.decided_at = now
        req.comment = comment
        req.save(update_fields=["status", "decided_by", "decided_at", "comment"])
        close_wait_txn(wait, status=WaitStatus.RESOLVED, result=decision.to_dict(), by=username,
                       now=now, reason=f"{req.status} by {req.decided_by}"
                       + (f": {comment}" if comment else ""))
    return req


def approval_expire_txn(wait: Wait, now: datetime) -> bool:
    """The sweeper's handler for an approval wait whose time ran out.

    ``on_timeout="escalate"`` (first expiry): the request moves to the ``escalate_to``
    group and gets the same timeout again; returns False (still pending). Otherwise the
    request expires as a rejection; returns True.
    """
    req = ApprovalRequest.objects.select_for_update().filter(wait=wait).first()
    if req is None or req.status != ApprovalStatus.PENDING:
        close_wait_txn(wait, status=WaitStatus.EXPIRED,
                       result=Decision(False, ("timeout",), now.isoformat(), "expired",
                                       expired=True).to_dict(), by="timeout", now=now)
        return True
    if req.on_timeout == "escalate" and req.escalated_at is None and req.escalate_to_id:
        req.escalated_at = now
        req.approver_group_id = req.escalate_to_id
        req.expires_at = now + timedelta(seconds=req.timeout_seconds) if req.timeout_seconds else None
        req.save(update_fields=["escalated_at", "approver_group", "expires_at"])
        wait.wake_at = req.expires_at
        wait.save(update_fields=["wake_at"])
        TraceEvent.objects.create(run_id=wait.run_id, kind="approval_escalated",
                                  step_id=wait.wait_id, actor="timeout",
                                  message=f"no decision in time; escalated to "
                                          f"{req.escalate_to.name if req.escalate_to else '?'}")
        return False
    req.status = ApprovalStatus.EXPIRED
    req.decided_at = now
    req.decided_by = "timeout"
    req.save(update_fields=["status", "decided_at", "decided_by"])
    close_wait_txn(wait, status=WaitStatus.EXPIRED,
                   result=Decision(False, ("timeout",), now.isoformat(),
                                   "no decision before the deadline", expired=True).to_dict(),
                   by="timeout", now=now, reason="approval expired: rejected")
    return True
