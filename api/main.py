"""The ``/api/v1/`` API object: authentication, the JSON parser, and problem details for
every refusal.

Built with django-ninja: the request and response shapes are the pydantic models of
``api/schemas.py`` (pydantic is already how Durable checks an approver's edits), the
OpenAPI schema is generated from them, and each endpoint is a function that calls the
same service the dashboard calls (``durable/services/runs.py``, ``approvals/services.py``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import URLPattern
from ninja import NinjaAPI, Router
from ninja.constants import NOT_SET
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger, _csrf_needed
from ninja.parser import Parser
from ninja.responses import Response

from durable import postgres
from durable.values.jsontext import JSONInputError, loads_bounded

from . import approvals, runs, schedules, streams, subscriptions, tokens, webhooks_in
from .auth import SessionAuth, TokenAuth
from .problems import CONTENT_TYPE, ApiProblem, field_errors, problem, status_for
from .schemas import QUERY_RULES
from .scopes import Refused


class BoundedParser(Parser):
    """JSON bodies with the size and depth bounds of :func:`durable.values.jsontext.loads_bounded`
    (a body nested thousands deep is a 400, not a ``RecursionError``)."""

    def parse_body(self, request: HttpRequest) -> Any:
        text = request.body.decode("utf-8")  # UnicodeDecodeError: 400 below
        limit = int(getattr(settings, "MAX_REQUEST_BODY_BYTES", 4 * 1024 * 1024))
        return loads_bounded(text, what="The request body", max_bytes=limit)


class DurableAPI(NinjaAPI):
    """NinjaAPI whose schema says what the answers are: a refusal is
    ``application/problem+json`` (RFC 9457 section 3), not ``application/json``."""

    def get_openapi_schema(self, **kwargs: Any) -> Any:
        schema = super().get_openapi_schema(**kwargs)
        declare_rules(schema)
        self._declare_scopes(schema)
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for code, response in (operation.get("responses") or {}).items():
                    content = response.get("content") or {}
                    if str(code) >= "400" and "application/json" in content:
                        content[CONTENT_TYPE] = content.pop("application/json")
        return schema

    def _declare_scopes(self, schema: dict[str, Any]) -> None:
        """Each operation's security requirement names its scope (OpenAPI 3.1 allows role
        names for non-OAuth schemes), and its description says it."""
        paths = schema.get("paths", {})
        for _prefix, router in self._routers:
            for path, view in router.path_operations.items():
                for operation in view.operations:
                    scope = next(
                        (a.scope for a in operation.auth_callbacks if getattr(a, "scope", None)),
                        None,
                    )
                    if scope is None:
                        continue
                    for method in operation.methods:
                        documented = paths.get(f"/api/v1{path}", {}).get(method.lower())
                        if documented is None:
                            continue
                        documented["security"] = [{"TokenAuth": [scope]}, {"SessionAuth": [scope]}]
                        needs = f"Needs the scope `{scope}` (else 403)."
                        text = documented.get("description")
                        documented["description"] = f"{text}\n\n{needs}" if text else needs


def declare_rules(schema: dict[str, Any]) -> None:
    """Say in ``schema`` (an OpenAPI document) the rules the server enforces that
    pydantic's models cannot carry, so that a request the schema allows is one the server
    takes (schemathesis' "schema-valid data is accepted"): the runs list's query values
    (:data:`api.schemas.QUERY_RULES`). The registered workflows are said only to a caller
    who authenticates (:func:`declare_workflows`, :func:`schema_view`)."""
    for (path, method), rules in QUERY_RULES.items():
        operation = schema.get("paths", {}).get(f"/api/v1{path}", {}).get(method)
        for parameter in (operation or {}).get("parameters", []):
            if parameter.get("in") == "query" and parameter["name"] in rules:
                parameter["schema"].update(rules[parameter["name"]])


def declare_workflows(schema: dict[str, Any]) -> None:
    """The start's ``workflow``: an ``enum`` of the registered workflows, and for each
    its registered versions (``anyOf``), known only at run time."""
    from durable import registry

    versions: dict[str, list[str]] = {}
    for spec in registry.workflows():
        versions.setdefault(spec.name, []).append(str(spec.version))
    start = schema.get("components", {}).get("schemas", {}).get("StartIn")
    if start is None or not versions:
        return
    start["properties"]["workflow"]["enum"] = sorted(versions)
    start["anyOf"] = [
        {
            "properties": {
                "workflow": {"const": name},
                "version": {"enum": [None, *sorted(known)]},
            }
        }
        for name, known in sorted(versions.items())
    ]


def _authenticates(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return True
    try:
        return bool(TokenAuth()(request))
    except ApiProblem:
        return False


def schema_view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    """``GET /api/v1/schema``, public: the API's shape. To a caller who authenticates (a
    live token, or the dashboard's session) it also names this server's registered
    workflows and their versions (:func:`declare_workflows`); anyone else learns no
    names."""
    schema = api.get_openapi_schema(path_params=kwargs)
    if _authenticates(request):
        declare_workflows(schema)
    return Response(schema)


class LocalSwagger(Swagger):
    """ninja's Swagger UI page, rendered from ninja's own template and static files
    without ``"ninja"`` in ``INSTALLED_APPS`` (config/settings.py adds their folders):
    ninja would otherwise render its CDN page, which the Content-Security-Policy blocks
    and an offline machine cannot load."""

    def render_page(self, request: HttpRequest, api: Any, **kwargs: Any) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        context = {
            "swagger_settings": json.dumps(self.settings, indent=1),
            "api": api,
            "add_csrf": _csrf_needed(api),
        }
        return render(request, self.template, context)


api = DurableAPI(
    title="Durable API",
    version="1",
    description=(
        "Start, inspect and operate durable runs; decide approvals. Authenticate with "
        "`Authorization: Bearer <token>` (tokens: the dashboard's API tokens page) or the "
        "dashboard's session (send `X-CSRFToken` on unsafe methods). Errors are RFC 9457 "
        "problem details."
    ),
    openapi_url="/schema",
    docs_url="/docs",
    docs=LocalSwagger(),
    urls_namespace="api",
    auth=[TokenAuth(), SessionAuth()],
    parser=BoundedParser(),
)


@api.exception_handler(ApiProblem)
def _api_problem(request: HttpRequest, exc: ApiProblem) -> HttpResponse:
    extra = dict(exc.extra)
    headers = extra.pop("headers", {}) or {}
    response = problem(exc.status, exc.detail, request=request, **extra)
    for name, value in headers.items():
        response[name] = value
    return response


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = field_errors(exc.errors)
    where = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:10])
    return problem(422, f"The request is not valid: {where}.", request=request, errors=errors)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = problem(
        401,
        "Authentication required: send 'Authorization: Bearer <token>', or log in to the "
        "dashboard and use its session.",
        request=request,
    )
    response["WWW-Authenticate"] = 'Bearer realm="durable"'
    return response


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    cause = exc.__cause__
    if isinstance(cause, JSONInputError):
        detail = str(cause)
    elif isinstance(cause, UnicodeDecodeError):
        detail = "The request body is not UTF-8 text."
    else:
        detail = str(exc.message) if hasattr(exc, "message") else str(exc)
    return problem(exc.status_code, detail, request=request)


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return problem(404, str(exc) or "Not found.", request=request)


@api.exception_handler(Refused)
def _refused(request: HttpRequest, exc: Refused) -> HttpResponse:
    return problem(403, str(exc), request=request)


@api.exception_handler(PermissionDenied)
def _denied(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    return problem(403, str(exc) or "Not allowed.", request=request)


@api.exception_handler(Exception)
def _service_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """The services' refusals (``durable/exceptions.py``, ``approvals/services.py``) by
    :data:`api.problems.STATUS_OF`, a database that did not answer (an exhausted pool, a
    connection ended by a restart) 503 with ``Retry-After``; anything else is a bug and
    propagates (500)."""
    if postgres.database_unavailable(exc):
        detail = (
            "every database connection of this web process is in use; try again"
            if postgres.pool_exhausted(exc)  # busy, not broken: nothing was changed
            else "the database did not answer (a restart or a failover); try again with "
            "the same run_id or Idempotency-Key"
        )
        response = problem(503, detail, request=request)
        response["Retry-After"] = str(postgres.BUSY_RETRY_AFTER)
        return response
    status = status_for(exc)
    if status is None:
        raise exc
    extra: dict[str, Any] = {}
    errors = getattr(exc, "errors", None)
    if isinstance(errors, dict):  # InvalidEdit: messages by field
        extra["errors"] = [
            {"loc": ["body", "parameters", *([f] if f else [])], "msg": "; ".join(m), "type": ""}
            for f, m in errors.items()
        ]
    current = getattr(exc, "current", None)
    if status == 409 and current:
        extra["current_status"] = str(current)
    return problem(status, str(exc), request=request, **extra)


#: the scope each operation needs, checked in its authentication step (``api/auth.py``),
#: before ninja reads the body: a caller without it gets a 403, never a 422 about a body
#: it may not send. Every operation that authenticates must be listed (a new one that is
#: not stops the start-up); an operation with its own ``auth=None`` (the signed incoming
#: webhooks) is not.
SCOPE_OF: dict[Callable[..., Any], str] = {
    runs.start_run: "runs:start",
    runs.list_runs: "runs:read",
    runs.get_run: "runs:read",
    runs.list_steps: "runs:read",
    streams.run_stream: "runs:read",
    runs.cancel_run: "runs:operate",
    runs.compensate_run: "runs:operate",
    runs.resume_run: "runs:operate",
    runs.fork_run: "runs:operate",
    runs.signal_run: "runs:signal",
    runs.reconcile_operation: "runs:operate",
    runs.lookup_operation: "runs:operate",
    approvals.list_approvals: "approvals:read",
    approvals.get_approval: "approvals:read",
    approvals.decide_approval: "approvals:decide",
    tokens.list_tokens: "tokens:manage",
    tokens.create_token: "tokens:manage",
    tokens.revoke_token: "tokens:manage",
    subscriptions.list_subscriptions: "webhooks:manage",
    subscriptions.create_subscription: "webhooks:manage",
    subscriptions.delete_subscription: "webhooks:manage",
    schedules.list_schedules: "runs:read",
    schedules.schedule_action: "runs:operate",
}


def _scoped(router: Router) -> Router:
    """``router`` with each operation authenticating with the scope of :data:`SCOPE_OF`.

    Raises ``ImproperlyConfigured`` naming an operation that authenticates but is not in
    the table."""
    for path, view in router.path_operations.items():
        for operation in view.operations:
            if operation.auth_param is not NOT_SET:  # its own auth (None: public, signed)
                continue
            scope = SCOPE_OF.get(operation.view_func)
            if scope is None:
                raise ImproperlyConfigured(
                    f"{operation.methods} {path} ({operation.view_func.__qualname__}) has no "
                    "scope: add it to api.main.SCOPE_OF"
                )
            auth = [TokenAuth(scope), SessionAuth(scope)]
            operation.auth_param = auth
            operation._set_auth(auth)
    return router


for _router in (runs, streams, approvals, tokens, webhooks_in, subscriptions, schedules):
    api.add_router("", _scoped(_router.router))


def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any other path under /api/v1/: a 404 problem, not the dashboard's HTML page."""
    return problem(404, "There is no such API path; see /api/v1/schema.", request=request)


def _with_problem_405(view: Any) -> Any:
    """``view``, answering a wrong method with a 405 problem (and its ``Allow`` header)
    instead of ninja's plain-text one; ``functools.wraps`` keeps its csrf_exempt mark."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if response.status_code != 405 or response.get("Content-Type") == CONTENT_TYPE:
            return response
        allowed = response.get("Allow", "")
        answer = problem(
            405,
            f"{request.method} is not allowed here; allowed: {allowed or 'none'}.",
            request=request,
        )
        if allowed:
            answer["Allow"] = allowed
        return answer

    return wrapped


def urls() -> tuple[list[Any], str, str]:
    """``api.urls`` with every refusal a problem, a wrong method's 405 included."""
    patterns, app_name, namespace = api.urls
    for pattern in patterns:
        if isinstance(pattern, URLPattern) and pattern.name == "openapi-json":
            pattern.callback = schema_view
        if isinstance(pattern, URLPattern):
            pattern.callback = _with_problem_405(pattern.callback)
    return patterns, app_name, namespace
