"""Deciding approval requests: one service, one transaction (docs/approvals.md).

Authority is checked when the person acts, not when the request was made: the user must
still be active and still hold ``approvals.decide_approval`` (and be in the request's
approver group), since a decision may come days after the request.

Deadlines are exact. A decision counts at the instant read *after* the run, request and
wait rows are locked (the clock that set the deadline and that the sweeper reads); at or after
``expires_at`` it is refused with :class:`ApprovalExpired`, and the timeout's outcome is
applied in its place, as of the deadline, if the sweeper has not applied it yet. The
sweeper takes the same locks, so a decision racing the timeout has exactly one outcome.

A decision binds to one version of the arguments (:class:`ApprovalArguments`): an edit
makes a new version, approvals of the old one stop counting (those approvers are asked
again), and the run receives only a version that ``required_approvals`` distinct people
approved.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from durable import requesters
from durable.exceptions import DurableError, IllegalTransition
from durable.models import Run, TraceEvent, Wait, WaitStatus, transitions
from durable.types import Decision
from durable.values import codec
from durable.vocabulary import EventKind
from durable.waits.closing import close_wait_txn

from . import edits
from .edits import InvalidEdit
from .models import ApprovalArguments, ApprovalDecision, ApprovalRequest, ApprovalStatus

__all__ = [
    "AlreadyDecided",
    "ApprovalExpired",
    "ApprovalNotFound",
    "ArgumentsChanged",
    "InvalidEdit",
    "NotAllowed",
    "approval_decide",
    "approval_expire_txn",
    "authority_problems",
]

PERMISSION = "approvals.decide_approval"


class ApprovalNotFound(DurableError):
    """No approval request has that id (or the run has not reached its wait yet)."""

    def __init__(self, request_id: Any):
        self.request_id = request_id
        super().__init__(
            f"approval request {request_id} does not exist; if its run was just "
            "started it may not have reached the wait yet: try again shortly"
        )


class AlreadyDecided(IllegalTransition):
    """The request (or this user's part of it) was already decided; nothing changed."""


class ApprovalExpired(AlreadyDecided):
    """A decision came at or after the request's deadline; the timeout decided instead.

    ``expired_at``: the deadline; ``outcome``: ``"rejected"`` or ``"escalated"``;
    ``escalated_to``: the group now asked (escalation only).
    """

    def __init__(self, req: ApprovalRequest, *, expired_at: datetime, outcome: str):
        self.request_id = req.pk
        self.expired_at = expired_at
        self.outcome = outcome
        self.escalated_to = req.escalate_to.name if req.escalate_to is not None else ""
        when = expired_at.isoformat(timespec="seconds")
        if outcome == "escalated":
            then = (
                f"; they decide by {req.expires_at.isoformat(timespec='seconds')}"
                if req.expires_at
                else ""
            )
            what = f"it was escalated to the group {self.escalated_to!r}, who are asked now{then}"
        else:
            what = (
                "the timeout rejected it: the run receives approved=False, decided by the timeout"
            )
        super().__init__(
            f"approval {req.pk} ({req.title}): this request expired at {when}; {what}",
            current=ApprovalStatus.EXPIRED if outcome != "escalated" else ApprovalStatus.PENDING,
        )


class ArgumentsChanged(AlreadyDecided):
    """The arguments were edited since the decider loaded them; nothing was recorded."""

    def __init__(self, req: ApprovalRequest, *, seen: int, current: ApprovalArguments):
        self.request_id = req.pk
        self.seen = seen
        self.version = current.number
        by = current.created_by.get_username() if current.created_by else "the run"
        super().__init__(
            f"approval {req.pk} ({req.title}): the arguments changed since you "
            f"loaded them (you saw version {seen}; version {current.number} is "
            f"by {by}); review the new version and decide again",
            current=req.status,
        )


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
    if (
        request.approver_group_id
        and not user.is_superuser
        and not user.groups.filter(pk=request.approver_group_id).exists()
    ):
        group = request.approver_group
        problems.append(f"membership of the group {group.name if group else '?'!r}")
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
        req.requested_by_id is not None and req.requested_by_id == user.pk
    ):
        return "starter"
    if requesters.includes(user, asked[1:]):
        return "requester"
    return ""


def _describe(req: ApprovalRequest) -> str:
    when = req.decided_at.isoformat(timespec="seconds") if req.decided_at else "?"
    return f"already {req.status} by {req.decided_by or 'the system'} at {when}"


def _display(text: str | None) -> Any:
    return codec.decode_for_display(text) if text else None


def _first_version_txn(req: ApprovalRequest) -> ApprovalArguments:
    """Version 1 of a request made before versions existed (or without one)."""
    shown = codec.decode(req.payload) if req.payload else None
    value = (
        (shown.get("params") if req.tool_name else shown.get("payload"))
        if isinstance(shown, dict)
        else None
    )
    version = ApprovalArguments.objects.create(
        request=req,
        number=1,
        created_at=req.created_at,
        value=None if value is None else codec.encode(value),
        digest=codec.fingerprint(value),
    )
    req.arguments = version
    req.save(update_fields=["arguments"])
    return version


def approval_decide(
    *,
    request_id: int,
    user: Any,
    approve: bool,
    comment: str = "",
    edited: Any = None,
    version: int | None = None,
) -> ApprovalRequest:
    """Approve or reject an approval request; with N-of-M, count this user's approval.

    ``edited``: new arguments (a dict), only where the request allows editing; it is an
    approval of a new version of the arguments. Secret parameters are kept: leave them
    out (or send ``"[REDACTED]"`` unchanged) and the stored values are merged back.
    ``version``: the version number the decider saw; when given and no longer current,
    nothing is recorded (:class:`ArgumentsChanged`). A rejection's ``comment`` reaches
    the agent as a model-recoverable message.

    Raises :class:`ApprovalNotFound`; :class:`ApprovalExpired` (at or after the deadline:
    the timeout's outcome is applied and committed instead); :class:`AlreadyDecided`
    ("already decided by X at T"; nothing changes); :class:`ArgumentsChanged`;
    :class:`~durable.IllegalTransition` (the run was cancelled or has finished);
    :class:`NotAllowed` (inactive user, missing permission or group, four-eyes, editing
    not allowed); :class:`InvalidEdit` (a ``ValueError``: the edit does not fit the
    tool's signature, or is not a bounded JSON object; ``errors`` by field).
    """
    comment = (comment or "").strip()[:4000]
    if edited is not None and not approve:
        raise InvalidEdit(
            {"": [("an edit approves the edited arguments; a rejection takes no arguments")]}
        )
    expired: ApprovalExpired | None = None
    with transaction.atomic():
        run_id = (
            ApprovalRequest.objects.filter(pk=request_id).values_list("run_id", flat=True).first()
        )
        if run_id is None:
            raise ApprovalNotFound(request_id)
        # lock order: the run first, then its rows -- as run_cancel, run_signal and the
        # sweeper do; locking the request first deadlocks against a concurrent cancel
        run = Run.objects.select_for_update().get(pk=run_id)
        req = (
            ApprovalRequest.objects.select_for_update(of=("self",))
            .select_related("approver_group", "escalate_to")
            .get(pk=request_id)
        )
        if req.status == ApprovalStatus.EXPIRED:
            raise ApprovalExpired(
                req,
                expired_at=req.decided_at or req.expires_at or timezone.now(),
                outcome="rejected",
            )
        if req.status != ApprovalStatus.PENDING:
            raise AlreadyDecided(
                f"approval {req.pk} ({req.title}): {_describe(req)}", current=req.status
            )
        if not transitions.can("decide", run):
            raise IllegalTransition(
                f"approval {req.pk}: run {run.id} is {run.status}; decisions on cancelled or "
                "finished runs are refused",
                current=run.status,
            )
        wait = Wait.objects.select_for_update().get(pk=req.wait_id)
        if wait.status != WaitStatus.PENDING:
            raise AlreadyDecided(
                f"approval {req.pk}: its wait is already {wait.status}", current=wait.status
            )
        # the instant this decision counts: read while holding the locks, after which
        # nothing else can change this request before the commit
        now = timezone.now()
        if req.is_expired(now):
            deadline = req.expires_at
            outcome = _apply_timeout_txn(req, wait, now)
            assert deadline is not None
            expired = ApprovalExpired(req, expired_at=deadline, outcome=outcome)
        else:
            _decide_txn(
                run,
                req,
                wait,
                user=user,
                approve=approve,
                comment=comment,
                edited=edited,
                version=version,
                now=now,
            )
    if expired is not None:  # raised after the commit: the timeout's outcome stays
        raise expired
    return req


def _decide_txn(
    run: Run,
    req: ApprovalRequest,
    wait: Wait,
    *,
    user: Any,
    approve: bool,
    comment: str,
    edited: Any,
    version: int | None,
    now: datetime,
) -> None:
    User = get_user_model()
    user_pk = getattr(user, "pk", None)
    fresh = User.objects.filter(pk=user_pk).first() if user_pk is not None else None
    problems = authority_problems(fresh, req)
    if problems:
        if req.escalated_at is not None and not [
            p for p in problems if not p.startswith("membership")
        ]:
            # a click meant for the first group, after the request moved on
            raise ApprovalExpired(req, expired_at=req.escalated_at, outcome="escalated")
        raise NotAllowed(
            f"{getattr(user, 'username', user)} may not decide approval "
            f"{req.pk}: missing {', '.join(problems)}",
            missing=problems,
        )
    assert fresh is not None
    own = own_request(fresh, req) if approve and req.four_eyes else ""
    if own:
        what = (
            f"started run {run.id}"
            if own == "starter"
            else f"asked for run {run.id} (forked it, started a run it was forked from, "
            "or is named as its requester)"
        )
        raise NotAllowed(
            f"four-eyes rule: {fresh.get_username()} {what} and cannot "
            "approve their own request; another approver must",
            missing=[
                "a different approver than the run's starter"
                if own == "starter"
                else "a different approver than those who asked for it"
            ],
        )
    current = (
        ApprovalArguments.objects.select_related("created_by").filter(pk=req.arguments_id).first()
        if req.arguments_id is not None
        else None
    ) or _first_version_txn(req)
    if version is not None and version != current.number:
        raise ArgumentsChanged(req, seen=version, current=current)
    username = fresh.get_username()
    edited_text = None
    if edited is not None:
        if not req.allow_edit:
            raise NotAllowed(
                f"approval {req.pk} does not allow editing the parameters",
                missing=["a policy that allows editing"],
            )
        prepared = edits.prepare(edited=edited, stored=current.value, tool_name=req.tool_name)
        if prepared.digest != current.digest:
            current = _new_version_txn(req, wait, current, prepared, fresh, comment, now)
            edited_text = prepared.text
    previous = req.decisions.filter(user=fresh, arguments=current).first()
    if previous is not None:
        raise AlreadyDecided(
            f"approval {req.pk}: {username} already "
            f"{'approved' if previous.approved else 'rejected'} version {current.number} at "
            f"{previous.created_at.isoformat(timespec='seconds')}",
            current=req.status,
        )
    ApprovalDecision.objects.create(
        request=req,
        user=fresh,
        approved=bool(approve),
        comment=comment,
        edited=edited_text,
        arguments=current,
        arguments_digest=current.digest,
        created_at=now,
    )
    if approve:
        approvers = list(
            req.decisions.filter(approved=True, arguments=current)
            .order_by("created_at", "id")
            .values_list("user__username", flat=True)
        )
        if len(approvers) < req.required_approvals:
            TraceEvent.objects.create(
                run=run,
                kind=EventKind.APPROVAL_RECORDED,
                step_id=wait.wait_id,
                actor=username,
                message=f"approved by {username} ({len(approvers)} of "
                f"{req.required_approvals})"
                + (f", arguments version {current.number}" if current.number > 1 else ""),
            )
            return
        decision = Decision(
            approved=True,
            decided_by=tuple(approvers),
            decided_at=now.isoformat(),
            comment=comment,
            edited=codec.decode(current.value)
            if current.number > 1 and current.value is not None
            else None,
        )
        req.status = ApprovalStatus.APPROVED
        req.decided_by = ", ".join(approvers)[:400]
    else:
        decision = Decision(
            approved=False, decided_by=(username,), decided_at=now.isoformat(), comment=comment
        )
        req.status = ApprovalStatus.REJECTED
        req.decided_by = username
    req.decided_at = now
    req.comment = comment
    req.save(update_fields=["status", "decided_by", "decided_at", "comment"])
    binding = f" (arguments version {current.number}, sha256 {current.digest[:12]})"
    close_wait_txn(
        wait,
        status=WaitStatus.RESOLVED,
        result=decision.to_dict(),
        by=username,
        now=now,
        reason=f"{req.status} by {req.decided_by}{binding}" + (f": {comment}" if comment else ""),
    )


def _new_version_txn(
    req: ApprovalRequest,
    wait: Wait,
    current: ApprovalArguments,
    prepared: edits.PreparedEdit,
    editor: Any,
    comment: str,
    now: datetime,
) -> ApprovalArguments:
    """Record an edit as the next version; approvals of the old one no longer count."""
    new = ApprovalArguments.objects.create(
        request=req,
        number=current.number + 1,
        value=prepared.text,
        digest=prepared.digest,
        created_by=editor,
        comment=comment,
        created_at=now,
    )
    reset = list(
        req.decisions.filter(arguments=current, approved=True)
        .order_by("created_at")
        .values_list("user__username", flat=True)
    )
    req.arguments = new
    req.save(update_fields=["arguments"])
    proposed_text = (
        current.value
        if current.number == 1
        else ApprovalArguments.objects.filter(request=req, number=1)
        .values_list("value", flat=True)
        .first()
    )
    proposed, before, after = _display(proposed_text), _display(current.value), _display(new.value)
    locked = edits.secret_keys(new.value)
    change = edits.summary(edits.diff(before, after, locked=locked))
    TraceEvent.objects.create(
        run_id=req.run_id,
        kind=EventKind.APPROVAL_EDITED,
        step_id=wait.wait_id,
        actor=editor.get_username(),
        message=f"{editor.get_username()} edited the arguments (version {new.number}): {change}"
        + (
            f"; approvals of version {current.number} by {', '.join(reset)} no longer "
            "count, they are asked again"
            if reset
            else ""
        ),
        data={
            "version": new.number,
            "digest": new.digest,
            "previous_version": current.number,
            "proposed": proposed,
            "edited": after,
            "reset": reset,
        },
    )
    return new


def _apply_timeout_txn(req: ApprovalRequest, wait: Wait, now: datetime) -> str:
    """Apply every timeout outcome due by ``now``, each as of its own deadline.

    ``on_timeout="escalate"`` (first expiry): the request moves to the ``escalate_to``
    group with a new deadline one timeout after the old one, and stays pending. Otherwise
    it expires as a rejection. Returns ``"escalated"``, ``"rejected"``, or ``""`` when
    nothing was due. Call inside a transaction holding the run, request and wait rows.
    """
    outcome = ""
    if req.expires_at is None and wait.wake_at is not None:
        req.expires_at = wait.wake_at
    while (
        req.status == ApprovalStatus.PENDING
        and req.expires_at is not None
        and req.expires_at <= now
    ):
        deadline = req.expires_at
        if req.on_timeout == "escalate" and req.escalated_at is None and req.escalate_to_id:
            req.escalated_at = deadline
            req.approver_group_id = req.escalate_to_id
            req.expires_at = (
                deadline + timedelta(seconds=req.timeout_seconds) if req.timeout_seconds else None
            )
            req.save(update_fields=["escalated_at", "approver_group", "expires_at"])
            wait.wake_at = req.expires_at
            wait.save(update_fields=["wake_at"])
            group = req.escalate_to.name if req.escalate_to else "?"
            TraceEvent.objects.create(
                run_id=wait.run_id,
                kind=EventKind.APPROVAL_ESCALATED,
                step_id=wait.wait_id,
                actor="timeout",
                message=f"no decision by {deadline.isoformat(timespec='seconds')}; escalated "
                f"to {group}"
                + (
                    f", who decide by {req.expires_at.isoformat(timespec='seconds')}"
                    if req.expires_at
                    else ""
                ),
            )
            outcome = "escalated"
            continue
        req.status = ApprovalStatus.EXPIRED
        req.decided_at = deadline
        req.decided_by = "timeout"
        req.save(update_fields=["status", "decided_at", "decided_by"])
        close_wait_txn(
            wait,
            status=WaitStatus.EXPIRED,
            result=Decision(
                False,
                ("timeout",),
                deadline.isoformat(),
                "no decision before the deadline",
                expired=True,
            ).to_dict(),
            by="timeout",
            now=now,
            reason=f"approval expired at {deadline.isoformat(timespec='seconds')}: rejected",
        )
        outcome = "rejected"
    return outcome


def approval_expire_txn(wait: Wait, now: datetime) -> bool:
    """The sweeper's handler for an approval wait whose time ran out.

    Applies the timeout as :func:`approval_decide` does for a late click (escalation, or
    expiry as a rejection, as of the deadline). Returns True when the wait was closed,
    False when the request is still pending (escalated, or its deadline is later).
    """
    req = (
        ApprovalRequest.objects.select_for_update(of=("self",))
        .select_related("escalate_to")
        .filter(wait=wait)
        .first()
    )
    if req is None or req.status != ApprovalStatus.PENDING:
        close_wait_txn(
            wait,
            status=WaitStatus.EXPIRED,
            result=Decision(
                False, ("timeout",), now.isoformat(), "expired", expired=True
            ).to_dict(),
            by="timeout",
            now=now,
        )
        return True
    if req.expires_at is not None and req.expires_at > now:
        if wait.wake_at != req.expires_at:  # the request's deadline is the one that counts
            wait.wake_at = req.expires_at
            wait.save(update_fields=["wake_at"])
        return False
    return _apply_timeout_txn(req, wait, now) == "rejected"
