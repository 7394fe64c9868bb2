"""Keep approval requests in step with the engine's waits (signals from ``durable``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import Group

from durable import requesters
from durable.hooks import run_exporting, runs_pruning, wait_closed, wait_created
from durable.models import TraceEvent, Wait, WaitKind, WaitStatus
from durable.values import codec
from durable.vocabulary import EventKind

from .models import ApprovalArguments, ApprovalDecision, ApprovalRequest, ApprovalStatus


def _group(name: Any) -> Group | None:
    if not name:
        return None
    group, _ = Group.objects.get_or_create(name=str(name)[:150])
    return group


def on_wait_created(sender: Any, wait: Wait, spec: dict[str, Any], **kwargs: Any) -> None:
    """Create the ApprovalRequest of a new approval wait (inside the engine's transaction)."""
    if wait.kind != WaitKind.APPROVAL:
        return
    run = wait.run
    timeout = spec.get("timeout")
    display = {k: spec.get(k) for k in ("payload", "params") if spec.get(k) is not None}
    four_eyes = bool(spec.get("four_eyes"))
    asked, required = _requesters(run, spec)
    if four_eyes and requesters.any_unknown(asked) and required < 2:
        # four-eyes cannot tell the requester from an approver: two different people
        # must approve, so at least one of them did not ask (docs/requesters-and-signals.md)
        required = 2
        TraceEvent.objects.create(
            run=run,
            kind=EventKind.FOUR_EYES_REQUESTER_UNKNOWN,
            step_id=wait.wait_id,
            message=f"{str(spec.get('title') or wait.title)[:200]}: who asked for this run is "
            "unknown, so this four-eyes approval needs two different approvers",
            data={"requesters": [requesters.label(p) for p in asked]},
        )
    req = ApprovalRequest.objects.create(
        wait=wait,
        run=run,
        key=wait.key,
        title=str(spec.get("title") or wait.title)[:300],
        payload=codec.dumps_checked(display, what="approval payload", step_id=wait.wait_id)
        if display
        else None,
        tool_name=spec.get("tool") or "",
        safety=spec.get("safety") or "",
        allow_edit=bool(spec.get("allow_edit")),
        four_eyes=four_eyes,
        required_approvals=required,
        requesters=asked,
        approver_group=_group(spec.get("approvers")),
        escalate_to=_group(spec.get("escalate_to")),
        on_timeout=spec.get("on_timeout") or "reject",
        timeout_seconds=timeout,
        # the wait's wake_at is the deadline the sweeper acts on; show the same instant
        expires_at=(wait.wake_at or wait.created_at + timedelta(seconds=timeout))
        if timeout
        else None,
        requested_by_id=run.started_by_id,
        created_at=wait.created_at,
    )
    # version 1 of what is asked: the tool's parameters, or the workflow's payload
    proposed = spec.get("params") if spec.get("tool") else spec.get("payload")
    req.arguments = ApprovalArguments.objects.create(
        request=req,
        number=1,
        created_at=wait.created_at,
        value=None
        if proposed is None
        else codec.dumps_checked(proposed, what="approval arguments", step_id=wait.wait_id),
        digest=codec.fingerprint(proposed, where="approval arguments"),
    )
    req.save(update_fields=["arguments"])


def _requesters(run: Any, spec: dict[str, Any]) -> tuple[list[requesters.Principal], int]:
    """Who asked for this approval: the run's requesters (an empty list, from before they
    were recorded, counts as unknown), then the names the workflow gave; and the
    number of approvals the workflow asked for."""
    asked = list(run.requesters or [requesters.UNKNOWN])
    named = [
        requesters.resolve(name)[1]
        for name in (spec.get("requesters") or [])
        if isinstance(name, str) and name.strip()
    ]
    return requesters.chain(asked[0], asked[1:] + named), int(spec.get("required") or 1)


def on_wait_closed(sender: Any, wait: Wait, reason: str, **kwargs: Any) -> None:
    """A wait closed by the engine (run cancelled) closes its pending approval request."""
    if wait.kind != WaitKind.APPROVAL or wait.status != WaitStatus.CANCELLED:
        return
    ApprovalRequest.objects.filter(wait=wait, status=ApprovalStatus.PENDING).update(
        status=ApprovalStatus.CANCELLED,
        decided_at=wait.resolved_at,
        decided_by=wait.resolved_by,
        comment=reason,
    )


def on_runs_pruning(sender: Any, run_ids: list[str], **kwargs: Any) -> dict[str, int]:
    """Retention deletes these runs: delete their approval requests here, decisions
    first (a decision protects the argument version it decided on, which Django's
    cascade from the wait would try to delete before it). Inside the prune's
    transaction; ``{model_name: rows deleted}``."""
    decisions, _ = ApprovalDecision.objects.filter(request__run_id__in=run_ids).delete()
    _, by_model = ApprovalRequest.objects.filter(run_id__in=run_ids).delete()
    counts = {"approvaldecision": decisions}
    for label, n in by_model.items():
        counts[label.rsplit(".", 1)[-1].lower()] = n
    return counts


def on_run_exporting(sender: Any, run: Any, **kwargs: Any) -> dict[str, Any]:
    """The ``approvals`` section of a run's audit document (``durable.services.export``): each
    request with its policy, the arguments it asked about (secrets shown as
    ``[REDACTED]``) and every decision: who, approved or not, when, on which version."""
    out = []
    for req in ApprovalRequest.objects.filter(run=run).order_by("created_at", "id"):
        versions = {v.pk: v for v in ApprovalArguments.objects.filter(request=req)}
        decisions = ApprovalDecision.objects.filter(request=req).select_related("user")
        out.append(
            {
                "wait_id": req.wait.wait_id,
                "key": req.key,
                "title": req.title,
                "tool": req.tool_name,
                "status": req.status,
                "required_approvals": req.required_approvals,
                "four_eyes": req.four_eyes,
                "requesters": req.requesters_label,
                "created_at": req.created_at.isoformat(),
                "expires_at": req.expires_at.isoformat() if req.expires_at else None,
                "decided_at": req.decided_at.isoformat() if req.decided_at else None,
                "decided_by": req.decided_by,
                "comment": req.comment,
                "arguments": [
                    {"version": v.number, "value": v.value_for_display(), "comment": v.comment}
                    for v in sorted(versions.values(), key=lambda v: v.number)
                ],
                "decisions": [
                    {
                        "user": d.user.get_username(),
                        "approved": d.approved,
                        "comment": d.comment,
                        "arguments_version": (
                            versions[d.arguments_id].number if d.arguments_id in versions else None
                        ),
                        "at": d.created_at.isoformat(),
                    }
                    for d in decisions
                ],
            }
        )
    return {"approvals": out}


def open_request_keeps() -> Any:
    """Retention's condition (``durable.services.retention.register_keeper``): the
    candidate run has an approval request still open (pending)."""
    from django.db.models import Exists, OuterRef

    return Exists(
        ApprovalRequest.objects.filter(run_id=OuterRef("pk"), status=ApprovalStatus.PENDING)
    )


def open_request_reason(run: Any) -> str | None:
    """Why :func:`open_request_keeps` keeps ``run``, or ``None``."""
    req = ApprovalRequest.objects.filter(run_id=run.pk, status=ApprovalStatus.PENDING).first()
    if req is None:
        return None
    return f"its approval request {req.pk} ({req.title!r}) is still open"


def connect() -> None:
    from durable.services.retention import register_keeper

    register_keeper("approvals.open", open_request_keeps, open_request_reason)
    wait_created.connect(on_wait_created, dispatch_uid="approvals.on_wait_created")
    wait_closed.connect(on_wait_closed, dispatch_uid="approvals.on_wait_closed")
    runs_pruning.connect(on_runs_pruning, dispatch_uid="approvals.on_runs_pruning")
    run_exporting.connect(on_run_exporting, dispatch_uid="approvals.on_run_exporting")
