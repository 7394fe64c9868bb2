"""What the engine tells the outside while it works: the log context of
:mod:`durable.logcontext`, the counters of :mod:`durable.metrics`, and OpenTelemetry
spans (docs/observability.md#tracing) -- one call from the engine for all three.

Invariant: telemetry never changes what the engine does. A span per run execution
(``durable.run``) and per step attempt (``durable.step``; ``chat <model>`` for an LLM
call, with the GenAI semantic conventions' attributes), an instant span per replayed
step; an exception passes through unchanged (recorded on the span). Without the
``opentelemetry-api`` package, or without a configured SDK (``DURABLE_OTEL``), the spans
are the API's no-ops. The trace context travels from ``durable.start`` to the worker in
the Celery message (the official Celery instrumentation), so a run's spans join the
trace that started it, and a child started from a step joins its parent's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from . import logcontext, metrics

if TYPE_CHECKING:
    from .models import Run, Step
    from .retry import RetryPolicy

try:  # the optional extra durable[otel]
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - without the extra: no spans
    _trace = None  # type: ignore[assignment]

__all__ = ["attempt", "execution", "llm_result", "replayed", "run_claimed"]

F = TypeVar("F", bound=Callable[..., Any])
TRACER_NAME = "durable"


def _tracer() -> Any:
    return _trace.get_tracer(TRACER_NAME) if _trace is not None else None


@contextlib.contextmanager
def _span(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(name, attributes=attributes) as span:
        yield span


def execution(fn: F) -> F:
    """Decorates ``engine.execute(run_id, ...)``: binds ``run_id`` to the log lines and
    opens the ``durable.run`` span around the whole execution."""

    @functools.wraps(fn)
    def wrapper(run_id: str, *args: Any, **kwargs: Any) -> Any:
        with (
            logcontext.bound(run_id=str(run_id)),
            _span("durable.run", {"durable.run.id": str(run_id)}) as span,
        ):
            status = fn(run_id, *args, **kwargs)
            if span is not None:
                span.set_attribute("durable.run.status", str(status or "not_claimed"))
            return status

    return wrapper  # type: ignore[return-value]


def run_claimed(run: Run) -> None:
    """The run was claimed: name its workflow and version on the current run span."""
    if _trace is None:
        return
    span = _trace.get_current_span()
    span.set_attribute("durable.workflow", run.workflow_name)
    span.set_attribute("durable.workflow.version", run.workflow_version)


@contextlib.contextmanager
def attempt(call: Any, *, attempt: int, safety: str | None, policy: RetryPolicy) -> Iterator[None]:
    """Around one try of ``call`` (a :class:`durable.replay.StepCall`): the log context
    and the ``durable.step`` span with the step's id, kind, tool, safety class, attempt
    and, when it fails, the failure's classification (:func:`durable.retry.classify`,
    as the engine classifies it)."""
    attributes: dict[str, Any] = {
        "durable.step.id": call.step_id,
        "durable.step.kind": str(call.kind),
        "durable.step.attempt": attempt,
        "durable.step.replayed": False,
    }
    if call.tool_name:
        attributes["durable.tool"] = call.tool_name
    if safety:
        attributes["durable.tool.safety"] = str(safety)
    if str(call.kind) == "llm":
        attributes["gen_ai.operation.name"] = "chat"
        attributes["gen_ai.system"] = "openai"
    with (
        logcontext.bound(step_id=call.step_id, attempt=attempt),
        _span("durable.step", attributes) as span,
    ):
        try:
            yield
        except Exception as exc:
            if span is not None:
                from .retry import classify

                classification, _ = classify(exc, safety=safety, policy=policy)
                span.set_attribute("durable.classification", str(classification))
            raise


def llm_result(result: dict[str, Any]) -> None:
    """An LLM call answered: its model and token counts on the current step span, named
    ``chat <model>`` (OpenTelemetry GenAI semantic conventions)."""
    if _trace is None:
        return
    span = _trace.get_current_span()
    model = str(result.get("model") or "")
    usage = result.get("usage") or {}
    if model:
        span.update_name(f"chat {model}")
        span.set_attribute("gen_ai.request.model", model)
        span.set_attribute("gen_ai.response.model", model)
    span.set_attribute("gen_ai.usage.input_tokens", int(usage.get("prompt_tokens") or 0))
    span.set_attribute("gen_ai.usage.output_tokens", int(usage.get("completion_tokens") or 0))


def replayed(rec: Step) -> None:
    """A recorded step returned by a replay: counted, and an instant span saying so."""
    metrics.replayed(rec.kind)
    if _trace is None:
        return
    with _span(
        "durable.step",
        {
            "durable.step.id": rec.step_id,
            "durable.step.kind": rec.kind,
            "durable.step.attempt": rec.attempts,
            "durable.step.replayed": True,
            **({"durable.tool": rec.tool_name} if rec.tool_name else {}),
        },
    ):
        pass
