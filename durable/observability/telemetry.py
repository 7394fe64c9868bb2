"""What the engine tells the outside while it works: the log context of
:mod:`durable.observability.logcontext`, the counters of
:mod:`durable.observability.metrics`, and OpenTelemetry
spans (docs/observability.md#tracing) -- one call from the engine for all three.

Invariant: telemetry never changes what the engine does. A span per run execution
(``durable.run``) and per step attempt (``durable.step``; ``chat <model>`` for an LLM
call, with the GenAI semantic conventions' attributes), an instant span per replayed
step; an exception passes through unchanged (recorded on the span). Without the
``opentelemetry-api`` package, or without a configured SDK (``DURABLE_OTEL``), the spans
are the API's no-ops.

The trace context is stored with the run: ``durable.start`` (a ``durable.start`` span
of its own) records the W3C ``traceparent`` of the span it was called in
(:func:`carrier`), and every execution of the run -- the first, a resume after a wait, a
recovery after a crash, a retry a sweep re-dispatched days later -- opens its
``durable.run`` span in that trace. A child started from a step records its parent's
step span, so it joins its parent's trace. When the message that woke the run came
from another trace (the Celery instrumentation's span of a sweep, say), the run span
links to it (``durable.link`` = ``dispatcher``).
"""

from __future__ import annotations

import contextlib
import functools
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from durable.observability import logcontext, metrics

if TYPE_CHECKING:
    from durable.models.steps import Step
    from durable.retry import RetryPolicy

try:  # the optional extra durable[otel]
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - without the extra: no spans
    _trace = None  # type: ignore[assignment]

__all__ = [
    "attempt",
    "carrier",
    "execution",
    "llm_result",
    "replayed",
    "starting",
]

F = TypeVar("F", bound=Callable[..., Any])
TRACER_NAME = "durable"


def _tracer() -> Any:
    return _trace.get_tracer(TRACER_NAME) if _trace is not None else None


@contextlib.contextmanager
def _span(name: str, attributes: dict[str, Any], **options: Any) -> Iterator[Any]:
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(
        name,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
        **options,
    ) as span:
        try:
            yield span
        except Exception as exc:
            _record_failure(span, exc)
            raise


def _record_failure(span: Any, exc: Exception) -> None:
    """What OpenTelemetry's ``use_span`` records for an exception leaving a span (an
    ``exception`` event with the semantic conventions' attributes, status ERROR), with a
    message that an exception's broken ``__str__`` cannot turn into a second exception:
    ``Span.record_exception`` calls ``str(exc)``, and a ``RuntimeError`` from it would
    replace the step's own failure (S11: the attempt was recorded as ``RuntimeError``)."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not replace the failure
        message = f"<{type(exc).__name__} with an unprintable message>"
    kind = type(exc)
    module = kind.__module__
    span.add_event(
        "exception",
        {
            "exception.type": f"{module}.{kind.__qualname__}"
            if module and module != "builtins"
            else kind.__qualname__,
            "exception.message": message,
            "exception.stacktrace": "".join(traceback.format_exception(exc)),
            "exception.escaped": "False",
        },
    )
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"{kind.__name__}: {message}"))


#: the API's providers that make no-op spans (no SDK installed)
_NO_OP_PROVIDERS = (
    (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider) if _trace is not None else ()
)


def _recording() -> bool:
    """Whether an SDK provider is installed (the API's default makes no-op spans)."""
    return _trace is not None and not isinstance(_trace.get_tracer_provider(), _NO_OP_PROVIDERS)


def carrier() -> dict[str, str]:
    """The current span's W3C trace context as ``{"traceparent": ..., ["tracestate": ...]}``
    (what :attr:`Run.trace_context` stores), or ``{}`` with no recording span."""
    if _trace is None or not _trace.get_current_span().get_span_context().is_valid:
        return {}
    from opentelemetry import propagate

    found: dict[str, str] = {}
    propagate.inject(found)
    return {k: v for k, v in found.items() if k in ("traceparent", "tracestate")}


def starting(fn: F) -> F:
    """Decorates ``durable.start(workflow_name, ...)`` (answering a run, or ``(run,
    created)``): a ``durable.start`` span (kind PRODUCER) around it, in the caller's
    trace or a new one, so the run it records (:func:`carrier`) has a trace to join."""

    @functools.wraps(fn)
    def wrapper(workflow_name: str, *args: Any, **kwargs: Any) -> Any:
        if not _recording():
            return fn(workflow_name, *args, **kwargs)
        kind = _trace.SpanKind.PRODUCER
        with _span("durable.start", {"durable.workflow": str(workflow_name)}, kind=kind) as span:
            answer = fn(workflow_name, *args, **kwargs)
            run = answer[0] if isinstance(answer, tuple) else answer  # (run, created)
            span.set_attribute("durable.run.id", str(run.id))
            return answer

    return wrapper  # type: ignore[return-value]


def _run_span(run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``durable.run`` span's attributes and ``start_as_current_span`` options, from
    one query of the run: its workflow and version (also on an execution that finds the
    run claimed elsewhere and ends at once), and its stored trace context as parent,
    unless the current span (the Celery instrumentation's, in the message's trace) is
    already in it; a link to that current span otherwise."""
    from opentelemetry import propagate

    from durable.models.runs import Run

    attributes: dict[str, Any] = {"durable.run.id": run_id}
    try:
        row = (
            Run.objects.filter(pk=run_id)
            .values_list("workflow_name", "workflow_version", "trace_context")
            .first()
        )
    except Exception:  # telemetry never changes what the engine does: the claim reports it
        return attributes, {}
    if row is None:
        return attributes, {}
    workflow, version, stored = row
    attributes["durable.workflow"] = workflow
    attributes["durable.workflow.version"] = version
    if not stored:
        return attributes, {}
    parent = propagate.extract(stored)
    wanted = _trace.get_current_span(parent).get_span_context()
    current = _trace.get_current_span().get_span_context()
    if not wanted.is_valid or (current.is_valid and current.trace_id == wanted.trace_id):
        return attributes, {}
    links = [_trace.Link(current, {"durable.link": "dispatcher"})] if current.is_valid else []
    return attributes, {"context": parent, "links": links}


def execution(fn: F) -> F:
    """Decorates ``engine.execute(run_id, ...)``: binds ``run_id`` to the log lines and
    opens the ``durable.run`` span around the whole execution, in the run's trace, with
    its workflow and version (one query of the run, made only when tracing is on)."""

    @functools.wraps(fn)
    def wrapper(run_id: str, *args: Any, **kwargs: Any) -> Any:
        if _recording():
            attributes, options = _run_span(str(run_id))
        else:
            attributes, options = {"durable.run.id": str(run_id)}, {}
        with (
            logcontext.bound(run_id=str(run_id)),
            _span("durable.run", attributes, **options) as span,
        ):
            status = fn(run_id, *args, **kwargs)
            if span is not None:
                span.set_attribute("durable.run.status", str(status or "not_claimed"))
            return status

    return wrapper  # type: ignore[return-value]


def attempt(
    call: Any, *, attempt: int, safety: str | None, policy: RetryPolicy
) -> contextlib.AbstractContextManager[None]:
    """Around one try of ``call`` (a :class:`durable.runtime.replay.StepCall`): the log context
    and the ``durable.step`` span with the step's id, kind, tool, safety class, attempt
    and, when it fails, the failure's classification (:func:`durable.retry.classify`,
    as the engine classifies it). Without a recording SDK only the log context: the
    API's no-op span would change nothing (the current span stays the run's), and
    building one costs a checkpointed step ~0.03 ms."""
    if not _recording():
        return logcontext.bound(step_id=call.step_id, attempt=attempt)
    return _recorded_attempt(call, attempt=attempt, safety=safety, policy=policy)


@contextlib.contextmanager
def _recorded_attempt(
    call: Any, *, attempt: int, safety: str | None, policy: RetryPolicy
) -> Iterator[None]:
    """:func:`attempt` with a recording SDK: the log context and the ``durable.step`` span."""
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
    if str(call.kind) == "llm":  # the client speaks OpenAI's chat completions API
        attributes["gen_ai.operation.name"] = "chat"
        attributes["gen_ai.provider.name"] = "openai"
        attributes["gen_ai.system"] = "openai"  # the conventions' name before 1.37
    with (
        logcontext.bound(step_id=call.step_id, attempt=attempt),
        _span("durable.step", attributes) as span,
    ):
        try:
            yield
        except Exception as exc:
            if span is not None:
                from durable.retry import classify

                classification, _ = classify(exc, safety=safety, policy=policy)
                span.set_attribute("durable.classification", str(classification))
            raise


def llm_result(result: dict[str, Any], *, requested: str = "") -> None:
    """An LLM call answered: the model asked for (``requested``) and the one that
    answered, why it stopped and the token counts, on the current step span, named
    ``chat <requested model>`` (OpenTelemetry GenAI semantic conventions,
    https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/)."""
    if _trace is None:
        return
    span = _trace.get_current_span()
    model = str(result.get("model") or "")
    requested = requested or model
    usage = result.get("usage") or {}
    if requested:
        span.update_name(f"chat {requested}")
        span.set_attribute("gen_ai.request.model", requested)
    if model:
        span.set_attribute("gen_ai.response.model", model)
    if result.get("finish_reason"):
        span.set_attribute("gen_ai.response.finish_reasons", [str(result["finish_reason"])])
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
