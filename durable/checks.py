"""System checks: configuration is checked before anything runs.

See docs/architecture.md#configuration-checks.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register

from durable import conf, registry
from durable.dispatch import load_dispatcher
from durable.exceptions import DurableConfigurationError
from durable.limits import check_llm_limits
from durable.observability import metrics_server, otel
from durable.vocabulary import Safety


@register(Tags.compatibility, "durable")
def check_durable(app_configs: Any = None, **kwargs: Any) -> list:
    messages: list = []
    user: dict[str, Any] = {}
    try:
        from django.conf import settings

        user = getattr(settings, "DURABLE", {}) or {}
    except Exception:  # noqa: BLE001
        pass
    unknown = set(user) - set(conf.DEFAULTS)
    if unknown:
        messages.append(
            Error(
                f"unknown DURABLE settings: {', '.join(sorted(unknown))}",
                hint=f"known: {', '.join(sorted(conf.DEFAULTS))}",
                id="durable.E001",
            )
        )
    try:
        load_dispatcher(conf.get("DISPATCH"))
    except DurableConfigurationError as exc:
        messages.append(
            Error(
                str(exc),
                hint="set DURABLE['DISPATCH'] to 'celery', 'manual' "
                "or the dotted path of a durable.dispatch.Dispatcher subclass",
                id="durable.E002",
            )
        )
    for name in ("LEASE_SECONDS", "SWEEP_INTERVAL_SECONDS", "MAX_PAYLOAD_BYTES", "BATCH_MAX_STEPS"):
        try:
            if float(conf.get(name)) <= 0:
                raise ValueError
        except (TypeError, ValueError):
            messages.append(
                Error(f"DURABLE['{name}'] must be a positive number", id="durable.E003")
            )
    try:
        if float(conf.get("BATCH_MAX_DELAY_MS")) < 0:
            raise ValueError
    except (TypeError, ValueError):
        messages.append(
            Error("DURABLE['BATCH_MAX_DELAY_MS'] must be a number >= 0", id="durable.E006")
        )
    try:
        if conf.heartbeat_seconds() >= conf.lease_seconds():
            messages.append(
                Error(
                    "the heartbeat must be shorter than the lease",
                    hint="set DURABLE['HEARTBEAT_SECONDS'] below LEASE_SECONDS",
                    id="durable.E004",
                )
            )
    except (TypeError, ValueError):
        pass
    try:
        if conf.worker_beat_seconds() <= 0 or (
            conf.worker_dead_after_seconds() <= conf.worker_beat_seconds()
        ):
            messages.append(
                Error(
                    "a worker process must be presumed dead only after more than one missed "
                    "liveness beat",
                    hint="set DURABLE['WORKER_DEAD_AFTER_SECONDS'] above "
                    "WORKER_BEAT_SECONDS (default: 3 beats), both positive",
                    id="durable.E005",
                )
            )
    except (TypeError, ValueError):
        messages.append(
            Error(
                "DURABLE['WORKER_BEAT_SECONDS'] and ['WORKER_DEAD_AFTER_SECONDS'] must be numbers",
                id="durable.E005",
            )
        )
    try:
        check_llm_limits(conf.get("LLM_LIMITS") or {})
    except DurableConfigurationError as exc:
        messages.append(
            Error(
                str(exc),
                hint='e.g. {"gpt-4o-mini": {"rate_limit": "500/m", "concurrency": 10}}',
                id="durable.E007",
            )
        )
    messages.extend(_retention_errors())
    template = str(conf.get("TRACE_URL") or "")
    for problem in otel.trace_url_errors(template):
        messages.append(
            Error(
                f"DURABLE['TRACE_URL'] (DURABLE_TRACE_URL) {template!r}: {problem}",
                hint="e.g. http://jaeger:16686/trace/{trace_id}",
                id="durable.E009",
            )
        )
    patterns = conf.get("MCP_TOOLS")
    if not isinstance(patterns, list | tuple) or not all(isinstance(p, str) for p in patterns):
        messages.append(
            Error(
                f"DURABLE['MCP_TOOLS'] must be a list of tool name patterns, got {patterns!r}",
                hint='e.g. ["billing.*", "kb.search"] (DURABLE_MCP_TOOLS=billing.*,kb.search); '
                "[] serves no tool",
                id="durable.E011",
            )
        )
    try:
        metrics_server.port()
    except (TypeError, ValueError):
        messages.append(
            Error(
                f"DURABLE['METRICS_PORT'] must be a TCP port 0..65535 (0: no worker metrics "
                f"port), got {conf.get('METRICS_PORT')!r}",
                hint="set DURABLE_METRICS_PORT to a free port such as 9808, or 0 for none",
                id="durable.E010",
            )
        )
    for module, tb in registry.import_errors().items():
        last = tb.strip().splitlines()[-1] if tb.strip() else "import failed"
        messages.append(
            Warning(
                f"workflow module {module} failed to import: {last}",
                hint="its workflows cannot run on this process; fix the module",
                id="durable.W001",
            )
        )
    for spec in registry.tools():
        if (
            spec.safety == Safety.UNSAFE_WRITE
            and spec.reconcile is None
            and not spec.requires_approval
        ):
            messages.append(
                Warning(
                    f"tool {spec.name!r} is an unsafe_write with neither a reconcile hook nor "
                    "requires_approval: an unknown outcome will wait for an operator",
                    hint="add reconcile=... (look the write up by its idempotency key) or "
                    "requires_approval=True",
                    id="durable.W002",
                )
            )
        if (
            spec.safety == Safety.UNSAFE_WRITE
            and spec.retry is not None
            and (spec.retry.max_attempts > 1 and spec.reconcile is None)
        ):
            messages.append(
                Warning(
                    f"tool {spec.name!r}: a retry policy with max_attempts="
                    f"{spec.retry.max_attempts} on an unsafe_write without reconcile may repeat "
                    "a write after a transient error",
                    hint="raise TransientError only when the "
                    "write certainly did not happen, or declare the tool idempotent_write",
                    id="durable.W003",
                )
            )
    return messages


def _retention_errors() -> list:
    """RETENTION_SECONDS and each value of RETENTION_SECONDS_BY_WORKFLOW: None or >= 0."""
    errors: list = []
    values: list[tuple[str, Any]] = [("RETENTION_SECONDS", conf.get("RETENTION_SECONDS"))]
    by_workflow = conf.get("RETENTION_SECONDS_BY_WORKFLOW")
    if not isinstance(by_workflow, dict):
        return [
            Error(
                "DURABLE['RETENTION_SECONDS_BY_WORKFLOW'] must be a dict "
                "{workflow name: seconds or None}",
                id="durable.E008",
            )
        ]
    values += [(f"RETENTION_SECONDS_BY_WORKFLOW'][{k!r}", v) for k, v in by_workflow.items()]
    for name, value in values:
        if value is None:
            continue
        try:
            ok = float(value) >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            errors.append(
                Error(
                    f"DURABLE['{name}'] must be a number of seconds >= 0 or None (keep forever)",
                    id="durable.E008",
                )
            )
    try:
        if int(conf.get("PRUNE_BATCH_RUNS")) < 1 or float(conf.get("PRUNE_PAUSE_SECONDS")) < 0:
            raise ValueError
    except (TypeError, ValueError):
        errors.append(
            Error(
                "DURABLE['PRUNE_BATCH_RUNS'] must be 1 or more and PRUNE_PAUSE_SECONDS >= 0",
                id="durable.E008",
            )
        )
    return errors
