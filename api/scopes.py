"""What a token may ask for: a scope per kind of request, each backed by a permission.

A scope narrows a token, it never widens its user: a request needs the scope in the
token *and* the permission on the user (the same permissions as the dashboard,
``approvals/roles.py``). A browser session has every scope; its permissions decide.

Each operation's scope is checked in its authentication step (``api/auth.py``, with the
scope of ``api/main.py``'s table), before ninja reads the body: a caller without the scope gets a
403, never a 422 about a body it may not send.
"""

from __future__ import annotations

from typing import Any

from approvals.access import missing_message
from approvals.roles import DECIDE_APPROVAL, OPERATE_RUN, VIEW_RUN

#: scope -> (what it allows, the permission the user must also hold)
SCOPES: dict[str, tuple[str, str]] = {
    "runs:read": ("list and read runs and their steps", VIEW_RUN),
    "runs:start": ("start runs", OPERATE_RUN),
    "runs:operate": ("cancel, compensate, resume, fork runs and reconcile operations", OPERATE_RUN),
    "runs:signal": ("send signals to runs", OPERATE_RUN),
    "approvals:read": ("list and read approval requests", DECIDE_APPROVAL),
    "approvals:decide": ("approve or reject approval requests", DECIDE_APPROVAL),
    "webhooks:manage": ("manage webhook subscriptions", "api.change_webhooksubscription"),
    "tokens:manage": ("list and revoke your own API tokens", VIEW_RUN),
    # the MCP endpoint (/mcp, durable.contrib.mcp.http): each call starts a run
    "mcp:call": ("list and call the registered tools over MCP", OPERATE_RUN),
}


class Refused(Exception):
    """The caller lacks a scope or a permission; ``message`` says which (403)."""


def check(request: Any, scope: str) -> None:
    """Raise :class:`Refused` unless the request's token has ``scope`` and its user the
    scope's permission."""
    token = getattr(request, "api_token", None)
    if token is not None and scope not in (token.scopes or []):
        raise Refused(
            f"This token lacks the scope “{scope}”, needed to {SCOPES[scope][0]}. "
            f"Make a token with that scope."
        )
    perm = SCOPES[scope][1]
    if not request.user.has_perm(perm):
        raise Refused(missing_message(perm))
