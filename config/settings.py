"""Settings for Durable. Everything a deployment changes comes from environment variables.

Embedded default (no variables set): SQLite in WAL mode under ``var/`` and Celery on its
``filesystem://`` transport under ``var/broker``. Production: ``DATABASE_URL=postgres://...``
and ``CELERY_BROKER_URL=redis://...`` (or ``amqp://...``). The code is the same.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _number(name: str, text: str, kind: type) -> Any:
    """``text`` (the value of variable ``name``) as ``kind``; a bad value stops the start
    with an error naming the variable and the value, never a bare ValueError."""
    try:
        value = kind(text.strip())
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ImproperlyConfigured(f"{name}={text!r} is not {what}") from None
    if kind is float and not math.isfinite(value):
        raise ImproperlyConfigured(f"{name}={text!r} must be a finite number")
    return value


def env_int(name: str, default: int) -> int:
    """An integer variable; unset or empty: ``default``. Raises ImproperlyConfigured."""
    value = os.environ.get(name)
    return _number(name, value, int) if value and value.strip() else default


def env_float(name: str, default: float | None) -> float | None:
    """A number variable; unset or empty: ``default``. Raises ImproperlyConfigured."""
    value = os.environ.get(name)
    return _number(name, value, float) if value and value.strip() else default


def env_json(name: str, default: Any) -> Any:
    """A JSON value; a bad one stops the start with the variable's name."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be JSON ({exc}), got {value!r}") from None


def env_retention(name: str) -> dict[str, float | None]:
    """``name=seconds,other=none`` -> ``{"name": seconds, "other": None}`` (none: forever)."""
    out: dict[str, float | None] = {}
    for item in env_list(name):
        key, _, value = item.partition("=")
        value = value.strip().lower()
        out[key.strip()] = (
            None if value in {"", "none", "forever"} else _number(f"{name} ({key})", value, float)
        )
    return out


BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("DURABLE_VAR_DIR", BASE_DIR / "var")).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """DJANGO_SECRET_KEY, or a random key kept in var/secret_key (never a shared default)."""
    if os.environ.get("DJANGO_SECRET_KEY"):
        return os.environ["DJANGO_SECRET_KEY"]
    path = VAR_DIR / "secret_key"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(secrets.token_urlsafe(50))
        tmp.chmod(0o600)
        try:
            os.link(tmp, path)  # atomic: the first process to create it wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

# --- HTTPS (only when asked for: the embedded default serves http on 127.0.0.1) -------
# DJANGO_HTTPS=true turns on everything below at once; each variable can still override
# its own setting. Behind a TLS-terminating proxy, the proxy must set X-Forwarded-Proto
# (and strip it from client requests): see docs/security.md.
HTTPS = env_bool("DJANGO_HTTPS", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", HTTPS)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31_536_000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool(
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", SECURE_HSTS_SECONDS > 0
)
# "preload" only offers the domain to browsers' HSTS preload lists; submitting it is a
# separate, deliberate step (hstspreload.org). DJANGO_SECURE_HSTS_PRELOAD=false drops it.
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", HTTPS)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", HTTPS)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", HTTPS)
if env_bool("DJANGO_SECURE_PROXY_SSL_HEADER", HTTPS):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# a request body over this many bytes is answered 413 before Django reads it
# (dashboard/bodylimit.py, in front of Django in config/asgi.py)
MAX_REQUEST_BODY_BYTES = env_int("DURABLE_MAX_REQUEST_BYTES", 4 * 1024 * 1024)

# Each process imports only what it uses, so a CLI command starts in well under a second:
# the admin's modules are discovered when the URLs are loaded (config/urls.py), not at
# start-up (SimpleAdminConfig, as Django documents); daphne serves the app from its own
# command (Procfile) and is not an app here (``manage.py runserver`` serves plain HTTP,
# without the live pages' websockets); the workflow modules are imported at the
# registry's first lookup (durable/registry.py).
INSTALLED_APPS = [
    "django.contrib.admin.apps.SimpleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "channels",
    "csp",
    "axes",
    "durable",
    # LangGraph checkpoints (durable[langgraph]); the app imports no LangGraph itself
    "durable.contrib.langgraph",
    # MCP (durable[mcp]): the call workflow; the app imports no MCP SDK itself
    "durable.contrib.mcp",
    "approvals",
    "dashboard",
    "api",
    "examples",
] + env_list("DURABLE_EXTRA_APPS")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # last, as django-axes asks: it turns a locked-out login into its 429 page
    "axes.middleware.AxesMiddleware",
]

# --- Content-Security-Policy (django-csp): nothing inline, nothing from elsewhere ------
# Every script and style is a file under an app's static/; templates carry no <script>,
# <style>, style="..." or on*="..." (tests/dashboard/test_security.py checks every template).
# The live updates connect to ws(s):// on the same host: 'self' covers them in current
# browsers (CSP Level 3).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# --- login throttling (django-axes) ---------------------------------------------------
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # has_perm in one query instead of ModelBackend's two; it authenticates nobody
    "approvals.backends.PermissionsInOneQuery",
    "django.contrib.auth.backends.ModelBackend",
]
# after AXES_FAILURE_LIMIT failed logins for one username from one address, that pair is
# locked out for AXES_COOLOFF_TIME hours (429); a successful login resets the count
AXES_ENABLED = env_bool("DURABLE_LOGIN_THROTTLING", True)
AXES_FAILURE_LIMIT = env_int("DURABLE_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_float("DURABLE_LOGIN_COOLOFF_HOURS", 0.25)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# the client address every throttle counts: REMOTE_ADDR, unless a trusted proxy count is
# configured, in which case the address the proxy put into X-Forwarded-For
# (config/client_address.py, docs/security.md)
TRUSTED_PROXY_COUNT = env_int("DURABLE_TRUSTED_PROXY_COUNT", 0)
AXES_CLIENT_IP_CALLABLE = "config.client_address.client_address"

ROOT_URLCONF = "config.urls"
# django-ninja's Swagger UI page (/api/v1/docs: its template and static files, no CDN),
# found without importing ninja: as an installed app, ninja would be imported at every
# start, a CLI command's or a worker's too (~0.2 s); api/main.py's LocalSwagger renders it
NINJA_DIR = Path(importlib.util.find_spec("ninja").origin).parent  # type: ignore[union-attr,arg-type]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # the project's own pages (base.html, the error pages, registration/, the admin's
        # header); each app's pages live in its templates/ folder (APP_DIRS)
        "DIRS": [BASE_DIR / "templates", NINJA_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    },
    {
        # the dashboard's hot partials (its jinja2/ folder: the tables that grow with the
        # data), called from its pages by the {% load dashboard_rows %} tags
        "BACKEND": "django.template.backends.jinja2.Jinja2",
        "NAME": "jinja2",
        "APP_DIRS": True,
        "OPTIONS": {"environment": "dashboard.jinja_env.environment"},
    },
]
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

# --- database ------------------------------------------------------------------------
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'durable.sqlite3'}",
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers (the dashboard) run beside one writer; IMMEDIATE transactions take
    # the write lock up front so two writers queue on the busy timeout instead of failing
    # with "database is locked" on lock upgrade (tests/processes/test_scenarios_processes.py::
    # test_s13_sqlite_two_workers_forty_runs_and_a_polling_dashboard).
    DATABASES["default"]["CONN_MAX_AGE"] = 0 if os.environ.get("DURABLE_SQLITE_NO_PERSIST") else 600
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": (
            "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA busy_timeout=30000"
        ),
    }
    DATABASES["default"]["TEST"] = {
        # one file per test session, so concurrent test runs cannot collide
        "NAME": os.environ.get("DURABLE_TEST_SQLITE", str(VAR_DIR / f"test-{os.getpid()}.sqlite3"))
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # The connection budget (docs/production.md#database-connections). A web process
    # (daphne: config/asgi.py sets DURABLE_PROCESS=web) answers each request in a thread of
    # its own, and each thread would open a connection and keep it CONN_MAX_AGE seconds:
    # 16 API clients held ~100 and got 500s ("too many clients"), starving the workers. So
    # the web borrows from a pool of at most DATABASE_POOL_MAX_SIZE per process (psycopg's
    # pool, Django 5.1+); a request waits up to DATABASE_POOL_TIMEOUT seconds for one, then
    # is answered 503 with Retry-After. A worker process keeps its own few connections
    # (its task's thread and its heartbeat's), as before.
    WEB_PROCESS = os.environ.get("DURABLE_PROCESS") == "web"
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    _options.setdefault("application_name", "durable-web" if WEB_PROCESS else "durable")
    # A peer that vanished (a worker host cut off in the middle of a transaction, holding
    # a run's row lock) is found by TCP keepalive on both ends: after
    # DATABASE_KEEPALIVE_SECONDS of silence, 3 probes 5 s apart. The server then ends the
    # session and its locks go with it, so the run can be claimed again; without this,
    # Linux's defaults take two hours (docs/production.md#database-connections).
    _keepalive = max(env_int("DATABASE_KEEPALIVE_SECONDS", 10), 1)
    _options.setdefault("keepalives", 1)
    _options.setdefault("keepalives_idle", _keepalive)
    _options.setdefault("keepalives_interval", 5)
    _options.setdefault("keepalives_count", 3)
    _options["options"] = " ".join(
        filter(
            None,
            [
                _options.get("options", ""),
                f"-c tcp_keepalives_idle={_keepalive} -c tcp_keepalives_interval=5 "
                "-c tcp_keepalives_count=3",
            ],
        )
    )
    if WEB_PROCESS and env_bool("DATABASE_POOL", True):
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them (Django requires 0)
        # Django then gives the pool a check that runs as a connection is lent: one the
        # database ended meanwhile (a restart, a failover) is replaced, not lent to a
        # request that would answer 500 (tests/processes/test_web_connections.py)
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
        _pool_max = max(env_int("DATABASE_POOL_MAX_SIZE", 10), 1)
        _options["pool"] = {
            "min_size": min(env_int("DATABASE_POOL_MIN_SIZE", 2), _pool_max),
            "max_size": _pool_max,
            "timeout": env_float("DATABASE_POOL_TIMEOUT", 10.0),
        }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"}
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# each app ships its own static files (dashboard/static/dashboard/, durable/static/durable/),
# found by the app-directories finder as django.contrib.admin's are; ninja's (ninja/...,
# the API docs page's Swagger UI) from its package folder (NINJA_DIR above)
STATICFILES_DIRS = [NINJA_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True

# --- Celery: only the transport ------------------------------------------------------
_broker = os.environ.get("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_URL = _broker
if _broker.startswith("filesystem://"):
    # kombu's filesystem transport with atomic message writes (config/fsbroker.py), chosen
    # by the URL's scheme as before (an explicit CELERY_BROKER_TRANSPORT would also win
    # over a redis:// URL set later)
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES["filesystem"] = "config.fsbroker:Transport"
    _queue = VAR_DIR / "broker" / "queue"
    _processed = VAR_DIR / "broker" / "processed"
    _queue.mkdir(parents=True, exist_ok=True)
    _processed.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue),
        "data_folder_out": str(_queue),
        "processed_folder": str(_processed),
        "control_folder": str(VAR_DIR / "broker" / "control"),
        "store_processed": False,
        # kombu polls the folder; its 1 s default is the whole latency of a dispatch
        "polling_interval": 0.1,
    }
# keep database connections across tasks (Celery closes them around every task by
# default: a new PostgreSQL backend per run); the engine drops broken or too-old ones
# itself with close_old_connections() at the start and end of each execution
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "durable-sweep": {
        "task": "durable.sweep",
        "schedule": env_float("DURABLE_SWEEP_INTERVAL_SECONDS", 5.0),
        "options": {"expires": 30},
    },
    # outgoing webhooks: start the deliveries of new events (api/webhooks_out.py)
    "api-webhooks": {
        "task": "api.emit_webhooks",
        "schedule": env_float("DURABLE_WEBHOOK_TICK_SECONDS", 5.0),
        "options": {"expires": 30},
    },
    "durable-schedules": {
        "task": "durable.tick_schedules",
        "schedule": env_float("DURABLE_SCHEDULE_TICK_SECONDS", 5.0),
        "options": {"expires": 30},
    },
    # retention (durable/services/retention.py): deletes nothing unless DURABLE_RETENTION_SECONDS
    # or DURABLE_RETENTION_SECONDS_BY_WORKFLOW is set
    "durable-prune": {
        "task": "durable.prune",
        "schedule": env_float("DURABLE_PRUNE_INTERVAL_SECONDS", 3600.0),
        "options": {"expires": 600},
    },
}

# --- Channels ------------------------------------------------------------------------
if os.environ.get("CHANNEL_LAYER_REDIS_URL"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [os.environ["CHANNEL_LAYER_REDIS_URL"]]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Email (Django's SMTP backend; `make up` runs a local SMTP sink on 1025) ---------
EMAIL_HOST = os.environ.get("EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = env_int("EMAIL_PORT", 1025)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_float("EMAIL_TIMEOUT", 10.0)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "Durable <durable@localhost>")

# --- Durable -------------------------------------------------------------------------
DURABLE = {
    "WORKFLOW_MODULES": env_list("DURABLE_WORKFLOW_MODULES"),
    "AUTODISCOVER": env_bool("DURABLE_AUTODISCOVER", True),
    "DISPATCH": os.environ.get("DURABLE_DISPATCH", "celery"),
    "LEASE_SECONDS": env_float("DURABLE_LEASE_SECONDS", 30.0),
    "HEARTBEAT_SECONDS": env_float("DURABLE_HEARTBEAT_SECONDS", None),
    "WORKER_BEAT_SECONDS": env_float("DURABLE_WORKER_BEAT_SECONDS", 2.0),
    "WORKER_DEAD_AFTER_SECONDS": env_float("DURABLE_WORKER_DEAD_AFTER_SECONDS", None),
    "SWEEP_INTERVAL_SECONDS": env_float("DURABLE_SWEEP_INTERVAL_SECONDS", 5.0),
    "REDISPATCH_AFTER_SECONDS": env_float("DURABLE_REDISPATCH_AFTER_SECONDS", 30.0),
    "INPROCESS_RETRY_MAX_SECONDS": env_float("DURABLE_INPROCESS_RETRY_MAX_SECONDS", 5.0),
    "MAX_WORKER_LOST_ATTEMPTS": env_int("DURABLE_MAX_WORKER_LOST_ATTEMPTS", 3),
    "MAX_PAYLOAD_BYTES": env_int("DURABLE_MAX_PAYLOAD_BYTES", 1_048_576),
    "BATCH_MAX_STEPS": env_int("DURABLE_BATCH_MAX_STEPS", 32),
    "BATCH_MAX_DELAY_MS": env_float("DURABLE_BATCH_MAX_DELAY_MS", 50.0),
    "ENCRYPTION_KEY": os.environ.get("DURABLE_ENCRYPTION_KEY", ""),
    "SCHEDULE_TICK_SECONDS": env_float("DURABLE_SCHEDULE_TICK_SECONDS", 5.0),
    "SCHEDULE_MAX_CATCHUP": env_int("DURABLE_SCHEDULE_MAX_CATCHUP", 100),
    "SCHEDULE_GRACE_SECONDS": env_float("DURABLE_SCHEDULE_GRACE_SECONDS", 60.0),
    # {"gpt-4o-mini": {"rate_limit": "500/m", "concurrency": 10}, "*": {...}} as JSON
    "LLM_LIMITS": env_json("DURABLE_LLM_LIMITS", {}),
    "RETENTION_SECONDS": env_float("DURABLE_RETENTION_SECONDS", None),
    "RETENTION_SECONDS_BY_WORKFLOW": env_retention("DURABLE_RETENTION_SECONDS_BY_WORKFLOW"),
    "PRUNE_BATCH_RUNS": env_int("DURABLE_PRUNE_BATCH_RUNS", 100),
    "PRUNE_PAUSE_SECONDS": env_float("DURABLE_PRUNE_PAUSE_SECONDS", 0.05),
    "PRUNE_INTERVAL_SECONDS": env_float("DURABLE_PRUNE_INTERVAL_SECONDS", 3600.0),
    "METRICS_TOKEN": os.environ.get("DURABLE_METRICS_TOKEN", ""),
    # a worker serves its own metrics on this port (0: off; durable/observability/metrics_server.py)
    "METRICS_PORT": env_int("DURABLE_METRICS_PORT", 0),
    "METRICS_ADDR": os.environ.get("DURABLE_METRICS_ADDR") or "127.0.0.1",
    "OTEL": env_bool("DURABLE_OTEL", False),
    "TRACE_URL": os.environ.get("DURABLE_TRACE_URL", ""),
    "MCP_TOOLS": env_list("DURABLE_MCP_TOOLS", "*"),
    "PREPARED_STATEMENTS": env_bool("DURABLE_PREPARED_STATEMENTS", True),
}

# --- the JSON API (api/) ----------------------------------------------------------------
# failed token authentications from one address before it gets 429, and the window (s)
API_AUTH_FAILURE_LIMIT = env_int("DURABLE_API_AUTH_FAILURE_LIMIT", 20)
API_AUTH_FAILURE_WINDOW = env_int("DURABLE_API_AUTH_FAILURE_WINDOW", 300)
# incoming webhooks (api/webhooks_in.py): how far a signed timestamp may be from now, and
# how long an accepted event id is remembered per endpoint (at least twice the tolerance)
WEBHOOK_TOLERANCE_SECONDS = env_int("DURABLE_WEBHOOK_TOLERANCE_SECONDS", 300)
WEBHOOK_EVENT_RETENTION_SECONDS = env_int("DURABLE_WEBHOOK_EVENT_RETENTION_SECONDS", 259200)
# outgoing webhooks reach public addresses only (api/egress.py); these CIDRs, addresses or
# host names are let through too (internal receivers), comma-separated
DURABLE_WEBHOOK_ALLOWED_NETWORKS = env_list("DURABLE_WEBHOOK_ALLOWED_NETWORKS")
# the site's address as people reach it, for links in emails and webhook payloads
DURABLE_BASE_URL = os.environ.get("DURABLE_BASE_URL", "http://127.0.0.1:8000")
# how long a signed approval link works (seconds; the request's deadline still applies)
DURABLE_APPROVAL_LINK_SECONDS = env_int("DURABLE_APPROVAL_LINK_SECONDS", 259_200)
# a workflow that emails approvers their signed links for each approval request
# (api/webhooks_out.py); empty: none. The reference agents': examples.approval_email
DURABLE_APPROVAL_EMAIL_WORKFLOW = os.environ.get("DURABLE_APPROVAL_EMAIL_WORKFLOW", "")


# every line carries the run, step and attempt it is about, secrets blanked out
# (durable/observability/logcontext.py); DURABLE_LOG_FORMAT=json: one JSON object per line
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "durable_context": {"()": "durable.observability.logcontext.ContextFilter"},
        # Celery's lines about the periodic sweep / schedule / webhook ticks (DEBUG shows them)
        "housekeeping": {"()": "durable.observability.logcontext.HousekeepingFilter"},
    },
    "formatters": {
        "plain": {
            "()": "durable.observability.logcontext.RedactingFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s "
            "[run=%(run_id)s step=%(step_id)s attempt=%(attempt)s] %(message)s",
        },
        "json": {"()": "durable.observability.logcontext.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if os.environ.get("DURABLE_LOG_FORMAT") == "json" else "plain",
            # DURABLE_LOG_HOUSEKEEPING=true: Celery's lines about the periodic ticks too
            "filters": ["durable_context"]
            + ([] if env_bool("DURABLE_LOG_HOUSEKEEPING", False) else ["housekeeping"]),
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("DJANGO_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # django-axes announces its version at every start, manage.py commands included
        "axes": {"level": "WARNING"},
        # "No hostname was supplied" for the filesystem:// broker, which has none
        "kombu.connection": {"level": "ERROR"},
    },
}
