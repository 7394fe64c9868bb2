"""The caller's own API tokens: list, make (from a browser session only) and revoke.

Every operation needs the scope ``tokens:manage`` (``api/main.py``): a token made to read
runs cannot list or revoke its user's tokens. A token cannot make tokens, even with that
scope: a leaked token must not be able to outlive its revocation by minting a successor.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Path, Router, Status

from .models import ApiToken, token_create, token_revoke
from .problems import REFUSALS, ApiProblem
from .schemas import NewTokenOut, Problem, TokenIn, TokenOut

router = Router(tags=["tokens"])


def token_out(token: ApiToken) -> dict:
    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "scopes": list(token.scopes or []),
        "created_at": token.created_at,
        "last_used_at": token.last_used_at,
        "expires_at": token.expires_at,
        "revoked_at": token.revoked_at,
    }


@router.get("/tokens", response={200: list[TokenOut], REFUSALS: Problem}, summary="My tokens")
def list_tokens(request: HttpRequest) -> list[dict]:
    return [token_out(t) for t in ApiToken.objects.filter(user=request.user)[:500]]


@router.post("/tokens", response={201: NewTokenOut, REFUSALS: Problem}, summary="Make a token")
def create_token(request: HttpRequest, body: TokenIn) -> Status:
    """The answer holds the token's secret, shown this once. Browser session only."""
    if getattr(request, "api_token", None) is not None:
        raise ApiProblem(403, "Tokens are made from a logged-in browser session, not a token.")
    token, text = token_create(user=request.user, name=body.name, scopes=body.scopes)
    return Status(201, {**token_out(token), "token": text})


@router.delete("/tokens/{token_id}", response={200: TokenOut, REFUSALS: Problem}, summary="Revoke")
def revoke_token(request: HttpRequest, token_id: int = Path(..., ge=1, le=2**62)) -> dict:
    token = token_revoke(token_id=token_id, user=request.user)
    if token is None:
        raise ApiProblem(404, f"You have no token {token_id}.")
    return token_out(token)
