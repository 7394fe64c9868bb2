"""The public API of ``durable`` is pinned (as Temporal's tests/test_workflow_exports.py)."""

from __future__ import annotations

import durable

EXPECTED = sorted(
    [
        "AmbiguousOutcomeError",
        "BudgetExceeded",
        "ChildFailed",
        "ChildHandle",
        "Decision",
        "DurableConfigurationError",
        "DurableError",
        "IdempotencyConflict",
        "IllegalTransition",
        "InvalidDuration",
        "KeyConflict",
        "ModelRecoverable",
        "ModelRecoverableError",
        "NOT_FOUND",
        "NonDeterminismError",
        "PayloadError",
        "PermanentError",
        "RetryPolicy",
        "RunFailed",
        "RunInputConflict",
        "RunNotFound",
        "ScheduleNotFound",
        "Secret",
        "SignalDelivery",
        "SignalResult",
        "StepFailed",
        "ToolNotFound",
        "TransientError",
        "WorkflowNotFound",
        "call",
        "cancel",
        "compensate",
        "fork",
        "get_run",
        "result",
        "resume",
        "schedule",
        "signal",
        "start",
        "stream",
        "tool",
        "tool_call",
        "workflow",
    ]
)


def test_all_is_pinned():
    assert sorted(durable.__all__) == EXPECTED


def test_all_has_no_duplicates():
    assert len(durable.__all__) == len(set(durable.__all__))


def test_every_exported_name_resolves():
    for name in durable.__all__:
        assert getattr(durable, name) is not None, name


def test_star_import_gives_exactly_all():
    namespace: dict[str, object] = {}
    exec("from durable import *", namespace)  # noqa: S102 - the behaviour under test
    namespace.pop("__builtins__", None)
    assert sorted(namespace) == EXPECTED


def test_exported_errors_share_one_base():
    for name in durable.__all__:
        value = getattr(durable, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, durable.DurableError), name


def test_unknown_attribute_raises_attribute_error():
    try:
        durable.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("durable.no_such_name resolved")
