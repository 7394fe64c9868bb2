"""Who calls the API: a bearer token (machines) or the browser's session (with CSRF).

Failed token authentications are counted in Django's cache per live token and client
address: a token whose public prefix (``dur_<prefix>_...``) names a live token, with a
wrong secret, counts against that prefix from that address. After
``API_AUTH_FAILURE_LIMIT`` failures within ``API_AUTH_FAILURE_WINDOW`` seconds that
token gets 429 (with ``Retry-After``) from that address for the rest of the window, the
right secret included, so a secret cannot be guessed by trying (the dashboard's login
has django-axes for the same). Anything else (no token, junk, an unknown or revoked
prefix) cannot be a right guess, so it is a 401 and counts against nothing: a scanner, a
fuzzer's authentication probes or a neighbour behind the same NAT never lock out the
live tokens used from that address. Incoming webhooks' failed signatures count in a
bucket of their own (:data:`WEBHOOK`), with the same limit and window: junk posted to a
webhook URL throttles webhooks from that address, never the API tokens of people behind
the same address (and the other way round). The client address is the one django-axes
uses (``config/client_address.py``, ``DURABLE_TRUSTED_PROXY_COUNT``). With several web
processes, configure a shared cache (e.g. Redis) so that they count together. The
Prometheus endpoint's token has no prefix, so its failures count against the address
(:func:`throttled_bearer`), in :data:`TOKENS`.

Both authentications take the operation's ``scope``: once the caller is known, the
scope and its permission are checked (:func:`api.scopes.check`, 403), still in ninja's
authentication step, so before the body is parsed or validated.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from axes.helpers import get_client_ip_address
from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja.security import HttpBearer
from ninja.security.base import AuthBase
from ninja.utils import check_csrf

from .compiled import CompiledModel
from .models import TOKEN_TEXT, ApiToken, digest_of
from .problems import ApiProblem, problem
from .scopes import SCOPES, check

#: seconds between two writes of a token's last_used_at
LAST_USED_RESOLUTION = 60


def _limit() -> int:
    return int(getattr(settings, "API_AUTH_FAILURE_LIMIT", 20))


def _window() -> int:
    return int(getattr(settings, "API_AUTH_FAILURE_WINDOW", 300))


#: the failure buckets: API tokens, incoming webhooks' signatures
TOKENS = "auth-failures"
WEBHOOK = "webhook-failures"
_WHAT = {TOKENS: "failed authentications", WEBHOOK: "failed webhook signatures"}


def _key(request: HttpRequest, bucket: str, prefix: str = "") -> str:
    address = get_client_ip_address(request) or "-"
    return f"api:{bucket}:{address}:{prefix}" if prefix else f"api:{bucket}:{address}"


def refuse_if_locked(request: HttpRequest, bucket: str = TOKENS, prefix: str = "") -> None:
    """Raise a 429 :class:`ApiProblem` (with ``Retry-After``, seconds) when the client's
    address has ``API_AUTH_FAILURE_LIMIT`` failures in ``bucket`` (:data:`TOKENS` or
    :data:`WEBHOOK`) within the window; with ``prefix`` (a live token's public prefix),
    the failures of that address against that token."""
    if (cache.get(_key(request, bucket, prefix)) or 0) >= _limit():
        raise ApiProblem(
            429,
            f"Too many {_WHAT[bucket]} from this address; try again in up to {_window()} seconds.",
            headers={"Retry-After": str(_window())},
        )


def count_failure(request: HttpRequest, bucket: str = TOKENS, prefix: str = "") -> None:
    """Count one failure of the client's address in ``bucket`` (against the live token
    ``prefix`` names, if given); the window starts at the first."""
    key = _key(request, bucket, prefix)
    if not cache.add(key, 1, _window()):
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, _window())


def _scope_of(scope: str | None) -> str | None:
    if scope is not None and scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; the scopes are {sorted(SCOPES)}")
    return scope


#: the token with its user by the token's digest, its SQL compiled once a process
_TOKEN = CompiledModel(ApiToken, "digest", "user")


def _by_digest(digest: str) -> ApiToken | None:
    """The token of ``digest`` with its user (``token.user`` read with it), live or not.

    ``ApiToken.objects.select_related("user").get(digest=...)`` compiled its SQL at every
    request (~0.8 ms of CPU with the row's conversion); the SQL is compiled once and the
    two models are built from the row (:class:`api.compiled.CompiledModel`, ~0.3 ms).
    tests/api/test_auth.py holds both equal, field by field."""
    token: ApiToken | None = _TOKEN.get(digest)
    return token


def _live_by_digest(digest: str) -> ApiToken | None:
    """The token of ``digest`` with its user, if it is live as
    ``ApiToken.objects.live()`` says (not revoked, not expired, its user active), else
    ``None``. Read by the digest's unique index alone and checked here: the ORM compiled
    ``live()``'s conditions and join at every request (1.0 -> 0.5 ms of CPU);
    tests/api/test_auth.py holds the two answers equal."""
    found = _by_digest(digest)
    if found is None:
        return None
    if found.revoked_at is not None or not found.user.is_active:
        return None
    if found.expires_at is not None and found.expires_at <= timezone.now():
        return None
    return found


class TokenAuth(HttpBearer):
    """``Authorization: Bearer dur_...``: a live token; the request acts as its user.

    ``scope``: what the operation needs (``None``: nothing beyond a live token); a token
    without it, or a user without its permission, is refused with :class:`api.scopes.Refused` (403).
    """

    def __init__(self, scope: str | None = None) -> None:
        self.scope = _scope_of(scope)
        super().__init__()

    def __call__(self, request: HttpRequest) -> Any:
        found = super().__call__(request)
        if found and self.scope is not None:
            check(request, self.scope)
        return found

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        match = TOKEN_TEXT.fullmatch(token) if len(token) <= 100 else None
        found = None
        if match is not None:
            found = _live_by_digest(digest_of(token))
        if found is not None:
            refuse_if_locked(request, prefix=found.prefix)
        elif match is not None and ApiToken.objects.live().filter(prefix=match[1]).exists():
            # a wrong secret for a live token: a guess, counted against that token
            refuse_if_locked(request, prefix=match[1])
            count_failure(request, prefix=match[1])
        if found is None:
            raise ApiProblem(
                401,
                "The bearer token is unknown, revoked or expired. Make a new token on the "
                "dashboard's API tokens page.",
            )
        now = timezone.now()
        if found.last_used_at is None or now - found.last_used_at > timedelta(
            seconds=LAST_USED_RESOLUTION
        ):
            ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
        request.user = found.user
        request.api_token = found  # type: ignore[attr-defined]
        return found


class SessionAuth(AuthBase):
    """The dashboard's login session; an unsafe method must carry the CSRF token
    (``X-CSRFToken`` header), as the dashboard's own forms do."""

    openapi_type = "apiKey"

    def __init__(self, scope: str | None = None) -> None:
        self.openapi_in = "cookie"
        self.openapi_name = settings.SESSION_COOKIE_NAME
        self.scope = _scope_of(scope)
        super().__init__()

    def __call__(self, request: HttpRequest) -> Any:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if check_csrf(request) is not None:
            raise ApiProblem(
                403,
                "CSRF check failed: a request from the browser session must send the "
                "CSRF token in the X-CSRFToken header.",
            )
        if self.scope is not None:
            check(request, self.scope)  # a session has every scope: the permission
        return user


def throttled_bearer(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view`` (a plain Django view taking a bearer token, such as ``/metrics``) under
    the same throttle as the API's tokens: an address locked out in :data:`TOKENS` gets
    429 (``Retry-After``) before the view runs, and an answer of 401 or 403 to a request
    that sent an ``Authorization`` header counts as one failed authentication."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            refuse_if_locked(request)
        except ApiProblem as exc:
            response = problem(exc.status, exc.detail, request=request)
            for name, value in exc.extra.get("headers", {}).items():
                response[name] = value
            return response
        response = view(request, *args, **kwargs)
        if response.status_code in (401, 403) and "Authorization" in request.headers:
            count_failure(request)
        return response

    return wrapped
