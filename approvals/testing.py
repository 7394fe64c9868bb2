"""Deciding approvals in tests, the way an approver does (docs/testing-agents.md).

Also a pytest plugin, installed with the package (the ``pytest11`` entry point
``durable_approvals``): the ``durable_approvals`` fixture is an :class:`Approvals`.
Decisions go through :func:`approvals.services.approval_decide`, the service behind
the dashboard and the API, so the approval's policy holds as in production: the
permission, the approver group, four-eyes, N-of-M, edits checked against the tool's
signature, and a deadline that has passed (``ApprovalExpired``).

Decisions are made by test users that may decide: each has the ``decide_approval``
permission and is put in the group a request names (and the group it escalates to)
when it decides. They are never a run's requester, so four-eyes holds for runs that
``durable_env.start`` starts (as ``test:requester``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["Approvals"]


def _run_id(run: Any) -> str:
    return str(getattr(run, "pk", run))


class Approvals:
    """Approve, reject and edit a run's pending approval as a test approver.

    ``approver``: the username of the default approver (others: :meth:`user`)."""

    def __init__(self, approver: str = "test-approver") -> None:
        self.approver = approver

    def user(self, username: str | None = None) -> Any:
        """A user (``username``, default :attr:`approver`) with the permission to decide,
        created the first time."""
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Permission

        app_label, codename = "approvals", "decide_approval"
        model = get_user_model()
        user, created = model.objects.get_or_create(username=username or self.approver)
        if created:
            user.set_unusable_password()
            user.save()
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
        return model.objects.get(pk=user.pk)  # permissions are cached on the instance

    def pending(self, run: Any, tool: str | None = None) -> list[Any]:
        """The run's pending approval requests (``tool``: only that tool's), oldest
        first."""
        from approvals.models import ApprovalRequest, ApprovalStatus

        qs = ApprovalRequest.objects.filter(run_id=_run_id(run), status=ApprovalStatus.PENDING)
        if tool is not None:
            qs = qs.filter(tool_name=tool)
        return list(qs.order_by("created_at", "pk"))

    def approve(
        self, run: Any, *, tool: str | None = None, by: Any = None, comment: str = ""
    ) -> Any:
        """Approve the run's pending approval (of ``tool``, when given); returns the
        ``ApprovalRequest``. ``by``: a user or a username (default :attr:`approver`).
        Raises ``LookupError`` when none is pending, and what ``approval_decide``
        raises (``ApprovalExpired`` past its deadline, ``NotAllowed``...)."""
        return self._decide(run, tool, by, approve=True, comment=comment)

    def reject(
        self, run: Any, *, tool: str | None = None, by: Any = None, comment: str = ""
    ) -> Any:
        """Reject it (``comment`` reaches the agent); as :meth:`approve`."""
        return self._decide(run, tool, by, approve=False, comment=comment)

    def edit(
        self,
        run: Any,
        arguments: dict[str, Any],
        *,
        tool: str | None = None,
        by: Any = None,
        comment: str = "",
    ) -> Any:
        """Approve it with ``arguments`` changed (a dict of the parameters to change; the
        others keep their values). Raises ``InvalidEdit`` for arguments that do not fit
        the tool, ``NotAllowed`` when the tool does not allow edits; as :meth:`approve`."""
        from approvals.edits import secret_keys
        from durable.values import codec

        req = self._request(run, tool)
        stored = req.arguments.value if req.arguments is not None else None
        current = codec.decode(stored) if stored else {}
        locked = secret_keys(stored)  # kept by the server, never sent back
        edited = {k: v for k, v in (current or {}).items() if k not in locked}
        edited.update(arguments)
        return self._decide(run, tool, by, approve=True, comment=comment, edited=edited)

    def _request(self, run: Any, tool: str | None) -> Any:
        found = self.pending(run, tool)
        if not found:
            raise LookupError(
                f"run {_run_id(run)} has no pending approval" + (f" of {tool}" if tool else "")
            )
        return found[0]

    def _decide(self, run: Any, tool: str | None, by: Any, **decision: Any) -> Any:
        from approvals.services import approval_decide

        req = self._request(run, tool)
        user = by if by is not None and not isinstance(by, str) else self.user(by)
        for group in (req.approver_group, req.escalate_to):
            if group is not None:
                user.groups.add(group)
        return approval_decide(request_id=req.pk, user=user, **decision)


@pytest.fixture
def durable_approvals(transactional_db: None) -> Iterator[Approvals]:
    """Approve, reject and edit approvals as a test approver (:class:`Approvals`)."""
    yield Approvals()
