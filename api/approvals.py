"""Approvals: the requests the caller may decide, one request, and a decision.

Reading a request (and so minting its links) needs the right to decide it: the
permission and the request's approver group (:func:`approvals.services.authority_problems`,
the rule of the inbox's decision); the links a caller gets are bound to the caller
(``api/links.py``). The decision goes through
:func:`approvals.services.approval_decide`, the inbox's service: the approver's
authority, four-eyes, N-of-M, the deadline and the version of the arguments are checked
there, exactly as for a decision in the dashboard.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest
from ninja import Path, Query, Router

from approvals.edits import parse_edit
from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.selectors import pending_for
from approvals.services import approval_decide, authority_problems

from .links import approval_links
from .problems import REFUSALS, ApiProblem
from .schemas import ApprovalOut, DecisionIn, Problem

router = Router(tags=["approvals"])

ApprovalIdPath = Path(..., ge=1, le=2**62, description="the approval request's id")


def approval_out(req: ApprovalRequest, recipient: Any) -> dict[str, Any]:
    """The JSON shape of a request (``schemas.ApprovalOut``); arguments for display;
    while pending, links bound to ``recipient`` (the caller, who may decide it)."""
    version = req.arguments
    approvals = ApprovalDecision.objects.filter(
        request=req, approved=True, arguments=req.arguments_id
    ).count()
    return {
        "id": req.pk,
        "run_id": req.run_id,
        "title": req.title,
        "tool_name": req.tool_name,
        "status": req.status,
        "safety": req.safety,
        "allow_edit": req.allow_edit,
        "four_eyes": req.four_eyes,
        "required_approvals": req.required_approvals,
        "approvals": approvals,
        "approver_group": req.approver_group.name if req.approver_group else None,
        "created_at": req.created_at,
        "expires_at": req.expires_at,
        "version": version.number if version is not None else None,
        # one-time signed links to approve or reject after a confirmation (api/links.py)
        "links": (approval_links(req.pk, recipient=recipient) if req.status == "pending" else None),
        "arguments": (
            version.value_for_display() if version is not None else req.payload_for_display()
        ),
    }


@router.get(
    "/approvals", response={200: list[ApprovalOut], REFUSALS: Problem}, summary="Pending for me"
)
def list_approvals(request: HttpRequest, limit: int = Query(100, ge=1, le=500)) -> list[dict]:
    """The pending requests the caller may decide, oldest first (the dashboard's inbox)."""
    qs = pending_for(request.user).select_related("arguments")[:limit]
    return [approval_out(req, request.user) for req in qs]


@router.get(
    "/approvals/{request_id}", response={200: ApprovalOut, REFUSALS: Problem}, summary="One"
)
def get_approval(request: HttpRequest, request_id: int = ApprovalIdPath) -> dict:
    req = (
        ApprovalRequest.objects.select_related("approver_group", "arguments")
        .filter(pk=request_id)
        .first()
    )
    if req is None:
        raise ApiProblem(404, f"There is no approval request {request_id}.")
    missing = authority_problems(request.user, req)
    if missing:
        raise ApiProblem(
            403, f"You may not decide approval request {request_id}: you lack {', '.join(missing)}."
        )
    return approval_out(req, request.user)


@router.post(
    "/approvals/{request_id}/decision",
    response={200: ApprovalOut, REFUSALS: Problem},
    summary="Approve or reject",
)
def decide_approval(
    request: HttpRequest, body: DecisionIn, request_id: int = ApprovalIdPath
) -> dict:
    """Approve (optionally with edited ``parameters``) or reject (a ``comment`` is
    required: the agent receives it). ``version``: the arguments' version you read; a
    decision on an older one is refused (409). 403 for missing authority or the
    four-eyes rule, 409 when already decided, expired or the run finished."""
    if body.decision == "reject" and not body.comment.strip():
        raise ApiProblem(
            422,
            "comment: say why you reject it: the agent receives this comment.",
            errors=[{"loc": ["body", "comment"], "msg": "required to reject", "type": "missing"}],
        )
    edited = None
    if body.parameters is not None:
        # the inbox's bounds on an edit (size, depth, an object)
        edited = parse_edit(json.dumps(body.parameters, ensure_ascii=False))
    req = approval_decide(
        request_id=request_id,
        user=request.user,
        approve=body.decision == "approve",
        comment=body.comment,
        edited=edited,
        version=body.version,
    )
    req = ApprovalRequest.objects.select_related("approver_group", "arguments").get(pk=req.pk)
    return approval_out(req, request.user)
