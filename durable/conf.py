"""Durable's settings: one ``DURABLE = {...}`` dict in Django settings, read here only.

Every key has a default; ``config/settings.py`` fills them from environment variables.
``durable.checks`` validates them at start-up.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULT_REDACT_KEYS = (
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "access_token",
    "refresh_token",
    "client_secret",
    "private_key",
    "authorization",
    "cookie",
    "session",
    "credit_card",
    "card_number",
    "cvv",
)

DEFAULT_REDACT_PATTERNS = (
    r"sk-[A-Za-z0-9_\-]{6,}",  # OpenAI / Anthropic style secret keys
    r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{10,}",  # Stripe secret and restricted keys
    # Authorization: <scheme> <credentials>, whatever the scheme
    r"(?i)\bauthorization\b[\"']?\s*[:=]\s*[\"']?(?:[A-Za-z]+\s+)?[^\s\"',;]+",
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/\-]+=*",  # Bearer <token>
    # Basic <base64 of user:password>: a digit, +, / or = or a lower-to-upper hump, so
    # that prose ("basic settings", "Basic Authentication") is left alone
    r"(?i:\bbasic)\s+(?=[A-Za-z0-9+/]*(?:[0-9+/=]|[a-z][A-Z]))[A-Za-z0-9+/]{8,}={0,2}",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{22,}",  # GitHub fine-grained tokens
    r"\bxox[abeprs]-[A-Za-z0-9\-]{10,}",  # Slack tokens
    r"\bxapp-[0-9]-[A-Za-z0-9\-]{10,}",  # Slack app-level tokens
    r"\b(?:AKIA|ASIA|AIDA|AROA)[0-9A-Z]{16}\b",  # AWS access key ids
    # private-key blocks (PEM), up to their END line or the end of the text
    (
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----(?:[\s\S]*?-----END [A-Z0-9 ]*"
        r"PRIVATE KEY( BLOCK)?-----|[\s\S]*)"
    ),
    r"\beyJ[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*",  # JWTs
    # user:password in a URL (https://user:pass@host reads https://[REDACTED]@host)
    r"(?<=://)[^/?#\s:@]*:[^/?#\s@]+(?=@)",
)

#: normalised keys that contain a REDACT_KEYS entry but name counts, not secrets (the
#: token usage of an LLM reply); matched exactly, after the same normalisation
DEFAULT_REDACT_KEYS_ALLOW = (
    "tokens",
    "max_tokens",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "token_count",
    "tokens_used",
    "max_completion_tokens",
)

DEFAULTS: dict[str, Any] = {
    # modules to import workflows from, besides each installed app's workflows.py
    "WORKFLOW_MODULES": [],
    # import each installed app's workflows.py; False: only WORKFLOW_MODULES (a worker
    # that serves some workflows boots without importing the others' libraries)
    "AUTODISCOVER": True,
    # how a run is dispatched: the dotted path of a durable.dispatch.Dispatcher subclass,
    # or an alias: "celery" (a task on commit) or "manual" (nothing sent; tests drive it)
    "DISPATCH": "celery",
    # seconds a claim lasts without a heartbeat
    "LEASE_SECONDS": 30.0,
    # seconds between heartbeats (a third of the lease by default)
    "HEARTBEAT_SECONDS": None,
    # seconds between the liveness beats of a worker process that holds leases
    "WORKER_BEAT_SECONDS": 2.0,
    # a process silent this long (seconds) is presumed dead: the sweeper releases its
    # leases at once instead of waiting for them to expire (None: 3 beats)
    "WORKER_DEAD_AFTER_SECONDS": None,
    # seconds between sweeps (Celery beat)
    "SWEEP_INTERVAL_SECONDS": 5.0,
    # a pending run whose dispatch is older than this (seconds) is dispatched again
    "REDISPATCH_AFTER_SECONDS": 30.0,
    # retries due within this many seconds wait in-process; longer ones release the run
    "INPROCESS_RETRY_MAX_SECONDS": 5.0,
    # largest encoded payload (run input/output, step input/output), in bytes
    "MAX_PAYLOAD_BYTES": 1_048_576,
    # default budgets of a run (overridable per workflow and per start)
    "MAX_STEPS": 10_000,
    "DEADLINE_SECONDS": None,
    # batched checkpoints (docs/architecture.md#batched-checkpoints): flushed when this
    # many steps are pending, or when the oldest has waited this many milliseconds
    "BATCH_MAX_STEPS": 32,
    "BATCH_MAX_DELAY_MS": 50.0,
    # a step interrupted by a lost worker this many times fails (a poison step)
    "MAX_WORKER_LOST_ATTEMPTS": 3,
    # redaction: dict keys (case-insensitive, substring) and regex patterns
    "REDACT_KEYS": list(DEFAULT_REDACT_KEYS),
    "REDACT_PATTERNS": list(DEFAULT_REDACT_PATTERNS),
    # keys that match REDACT_KEYS but are not secret (exact, after normalisation)
    "REDACT_KEYS_ALLOW": list(DEFAULT_REDACT_KEYS_ALLOW),
    # key for encrypting redacted values at rest; derived from SECRET_KEY when empty
    "ENCRYPTION_KEY": "",
    # default token budget of a run's LLM calls (None: unlimited)
    "MAX_TOKENS": None,
    # {model: [input, output]} in US dollars per million tokens, for the trace's cost
    "LLM_PRICES": {},
    # schedules (durable/services/schedules.py): seconds between ticks (Celery beat), slots a
    # catchup="all" schedule starts per tick, how late (seconds) a catchup="none" slot
    # may still start
    "SCHEDULE_TICK_SECONDS": 5.0,
    "SCHEDULE_MAX_CATCHUP": 100,
    "SCHEDULE_GRACE_SECONDS": 60.0,
    # rate and concurrency limits of LLM calls (docs/limits.md):
    # {model or "*": {"rate_limit": "500/m", "concurrency": 10}}
    "LLM_LIMITS": {},
    # retention (durable/services/retention.py): seconds a finished run is kept (None: forever),
    # per workflow name ({name: seconds or None}) over the global value; runs deleted
    # per transaction, seconds slept between transactions, seconds between beat prunes
    "RETENTION_SECONDS": None,
    "RETENTION_SECONDS_BY_WORKFLOW": {},
    "PRUNE_BATCH_RUNS": 100,
    "PRUNE_PAUSE_SECONDS": 0.05,
    "PRUNE_INTERVAL_SECONDS": 3600.0,
    # the bearer token a Prometheus scraper sends to GET /metrics (empty: only logged-in
    # users with durable.view_run may read it)
    "METRICS_TOKEN": "",
    # a Celery worker's own metrics port (durable/observability/metrics_server.py): the TCP port its
    # main process serves the Prometheus scrape on (0: none) and the address it listens
    # on (127.0.0.1: this host only; 0.0.0.0 for a Prometheus on another host)
    "METRICS_PORT": 0,
    "METRICS_ADDR": "127.0.0.1",
    # OpenTelemetry tracing (durable/observability/otel.py; durable[otel] extra): off unless true
    "OTEL": False,
    # the tools served over MCP (durable/contrib/mcp/calls.py): fnmatch patterns of tool
    # names; Durable's own tools are never served, whatever the patterns
    "MCP_TOOLS": ["*"],
    # the run page links its trace id here: a URL with "{trace_id}" (Jaeger, Tempo, ...)
    "TRACE_URL": "",
    # PostgreSQL parses and plans the engine's hot statements once per connection
    # (durable/postgres/__init__.py, prepared_cursor); False behind a pooler that cannot
    # keep a session's prepared statements (PgBouncer in transaction mode before 1.21)
    "PREPARED_STATEMENTS": True,
}


def get(name: str) -> Any:
    """Return the ``DURABLE[name]`` setting, or its default."""
    user = getattr(settings, "DURABLE", {}) or {}
    if name in user:
        return user[name]
    return DEFAULTS[name]


def lease_seconds() -> float:
    return float(get("LEASE_SECONDS"))


def heartbeat_seconds() -> float:
    hb = get("HEARTBEAT_SECONDS")
    return float(hb) if hb else lease_seconds() / 3.0


def worker_beat_seconds() -> float:
    return float(get("WORKER_BEAT_SECONDS"))


def worker_dead_after_seconds() -> float:
    value = get("WORKER_DEAD_AFTER_SECONDS")
    return float(value) if value else 3.0 * worker_beat_seconds()
