"""A dry replay: a run's recorded history against the workflow code registered now.

Invariant: a dry replay writes nothing and executes nothing. It is the engine's own
execution (:class:`~durable.runtime.execution.Execution`, the same context, the same
replay cursor and its non-determinism check), with a cursor that answers every recorded
call as a replay does and stops, by a private ``BaseException``, at the first call that
would execute (the one place the engine checks budgets): so no step body, tool, LLM call,
wait or child start is reached, and a workflow's ``except Exception`` cannot swallow the
stop. The engine's own cursor is untouched: the dry one is a subclass, so the hot path
pays nothing for it. The histories (a wait the run is parked on is part of its history)
and the report are read and built by :mod:`durable.worker.replay_check`, read-only.
See docs/deploying.md.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

from django.db import DatabaseError

from durable import postgres
from durable.context import WorkflowContext
from durable.exceptions import NonDeterminismError
from durable.models.runs import Run
from durable.models.steps import Step
from durable.runtime.execution import Execution
from durable.runtime.replay import ReplayCursor
from durable.vocabulary import RunStatus, StepKind
from durable.worker.replay_check import (
    Divergence,
    ReportBuilder,
    RunReplay,
    histories,
    read_only,
)

__all__ = ["DryCursor", "RunReplay", "check_runs", "dry_replay"]

_DURABLE = Path(__file__).resolve().parents[1]
_CONTRIB = _DURABLE / "contrib"


class _Stop(BaseException):
    """Ends a dry replay (never seen by workflow code's ``except Exception``)."""


class _WouldContinue(_Stop):
    def __init__(self, where: dict[str, Any]) -> None:
        super().__init__(where)
        self.where = where


class _Diverged(_Stop):
    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.message)
        self.divergence = divergence


class _AnyTool(dict):
    """Tool rows for a replay without a database: no row for any tool (the registered spec)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> None:
        return None


def _code_location(frame: FrameType | None) -> tuple[str, int | None]:
    """The first frame outward from ``frame`` that is not the engine's (``durable/``,
    its integrations under ``durable/contrib/`` aside): the workflow's line."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if not path.is_relative_to(_DURABLE) or path.is_relative_to(_CONTRIB):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return "", None


def _traceback_location(exc: BaseException, fn_file: str) -> tuple[str, int | None]:
    """Where ``exc`` was raised: the deepest frame in the workflow's file, else the
    deepest frame outside the engine."""
    in_file: tuple[str, int | None] = ("", None)
    outside: tuple[str, int | None] = ("", None)
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        path = Path(code.co_filename)
        if code.co_filename == fn_file:
            in_file = (code.co_filename, tb.tb_lineno)
        if not path.is_relative_to(_DURABLE) or path.is_relative_to(_CONTRIB):
            outside = (code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return in_file if in_file[0] else outside


def _call(step_id: str, kind: str, tool: str = "") -> dict[str, str]:
    return {"step_id": step_id, "kind": kind, "tool": tool}


class DryCursor(ReplayCursor):
    """The replay cursor of a dry replay: recorded calls are answered as on a real
    replay; the first call that would execute stops the replay (``_WouldContinue``), a
    call that differs from the history stops it (``_Diverged``). Writes nothing."""

    dry = True

    def __init__(self, *, run: Run, steps: list[Step], tool_rows: dict[str, Any]) -> None:
        super().__init__(run=run, token="", steps=steps, spec=None, worker_id="replay-check")
        self.tool_rows = tool_rows
        self._asking: tuple[str, str] = (StepKind.STEP, "")

    def next_call(self, base: str, *, kind: str = StepKind.STEP, tool_name: str = "") -> Any:
        self._asking = (kind, tool_name)
        try:
            call = super().next_call(base, kind=kind, tool_name=tool_name)
        except NonDeterminismError as exc:
            rec = self.by_position.get(exc.position)
            if rec is None:  # the id asked for is recorded at another position
                rec = self.by_position.get(self.positions_by_id.get(exc.requested_step_id, -1))
            expected = _call(rec.step_id, rec.kind, rec.tool_name) if rec is not None else None
            self._diverge(
                "different_call",
                f"at position {exc.position} the history has "
                f"{expected['step_id'] if expected else '(nothing)'!r} but the code asks "
                f"for {exc.requested_step_id!r}"
                + (
                    f" (recorded at position {self.positions_by_id[exc.requested_step_id]})"
                    if exc.requested_step_id in self.positions_by_id
                    else ""
                ),
                exc.position,
                expected,
                _call(exc.requested_step_id, kind, tool_name),
            )
        self._same_kind(call.step_id, call.position, call.recorded)
        return call

    def check_budgets(self, sid: str, pos: int) -> None:
        # reached exactly when the call at ``pos`` would execute: the dry replay ends here
        self._same_kind(sid, pos, self.by_position.get(pos))
        kind, tool = self._asking
        file, line = _code_location(sys._getframe(1))
        raise _WouldContinue(
            {
                "position": pos,
                "step_id": sid,
                "kind": kind,
                "tool": tool,
                "file": file,
                "line": line,
            }
        )

    def _same_kind(self, sid: str, pos: int, rec: Step | None) -> None:
        if rec is None:
            return
        kind, tool = self._asking
        got = _call(sid, kind, tool)
        expected = _call(rec.step_id, rec.kind, rec.tool_name)
        if rec.kind != kind:
            self._diverge(
                "kind_changed",
                f"at position {pos} the history has a {rec.kind} call {rec.step_id!r} but the "
                f"code makes a {kind} call",
                pos,
                expected,
                got,
            )
        if kind == StepKind.TOOL and tool and rec.tool_name and rec.tool_name != tool:
            self._diverge(
                "tool_changed",
                f"at position {pos} the history calls tool {rec.tool_name!r} as "
                f"{rec.step_id!r} but the code calls tool {tool!r}",
                pos,
                expected,
                got,
            )

    def _diverge(
        self,
        reason: str,
        message: str,
        pos: int | None,
        expected: dict[str, str] | None,
        got: dict[str, str] | None,
    ) -> None:
        file, line = _code_location(sys._getframe(1))
        raise _Diverged(Divergence(reason, message, pos, expected, got, file, line))


def _no_write(error: dict[str, Any], *, event: str) -> None:
    """A dry replay fails nothing: a divergence is reported by the cursor instead."""


def _dry_execution(run: Run, steps: list[Step], tool_rows: dict[str, Any]) -> Execution:
    cursor = DryCursor(run=run, steps=steps, tool_rows=tool_rows)
    execution = Execution(
        run=run, token="", steps=steps, spec=None, worker_id=cursor.worker_id, cursor=cursor
    )
    cursor.fail_run = _no_write  # set after the checkpoints, which install their own
    return execution


def dry_replay(
    run: Run,
    steps: list[Step],
    fn: Any,
    workflow_input: Any,
    *,
    tool_rows: dict[str, Any] | None = None,
) -> RunReplay:
    """Replay ``run``'s history ``steps`` (see :func:`history_with_waits`) against the
    workflow function ``fn`` (``None``: not registered) with ``workflow_input``; returns
    the :class:`RunReplay`. Writes nothing, executes no step. ``tool_rows``: the
    ``Tool`` rows by name (operator settings), ``None`` for none (no query)."""
    report = RunReplay(
        run_id=run.pk,
        workflow=run.workflow_name,
        version=run.workflow_version,
        status=run.status,
        outcome="diverged",
    )
    if fn is None:
        report.divergence = Divergence(
            "not_registered",
            f"workflow {run.workflow_name!r} version {run.workflow_version!r} is not "
            "registered in this code: no worker with it can resume the run",
        )
        return report
    execution = _dry_execution(run, steps, _AnyTool() if tool_rows is None else tool_rows)
    cursor = execution.cursor
    assert isinstance(cursor, DryCursor)
    try:
        fn(WorkflowContext(execution), workflow_input)
    except _WouldContinue as stop:
        report.outcome = "continues"
        report.continues_at = stop.where
    except _Diverged as stop:
        report.divergence = stop.divergence
    except Exception as exc:  # noqa: BLE001 - the workflow code raised: reported, not raised
        recorded = run.error if isinstance(run.error, dict) else {}
        if (
            run.status == RunStatus.FAILED
            and recorded.get("type") == type(exc).__name__
            and not recorded.get("step_id")
        ):
            report.outcome = "fails_as_recorded"
        else:
            code = getattr(fn, "__code__", None)
            file, line = _traceback_location(exc, code.co_filename if code else "")
            report.divergence = Divergence(
                "raised",
                f"the code raised {type(exc).__name__}: {str(exc)[:300]} at position "
                f"{cursor.position}",
                cursor.position,
                None,
                None,
                file,
                line,
            )
    else:
        unreached = cursor.unreached_step()
        if unreached is None:
            report.outcome = "completes"
        else:
            report.divergence = Divergence(
                "returned_early",
                f"the code returned before the history's {unreached.step_id!r} at position "
                f"{unreached.position}",
                unreached.position,
                _call(unreached.step_id, unreached.kind, unreached.tool_name),
                None,
            )
    report.replayed = len(cursor.replayed)
    return report


def check_runs(
    *,
    workflow: str | None = None,
    version: str | None = None,
    status: str = "open",
    sample: int | None = None,
    since: datetime | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Replay the selected runs dry against the code registered now; returns the report.

    ``status``: ``"open"`` (pending, running, retrying, waiting) or ``"all"``;
    ``sample``: at most N of the selected runs, at random (``seed`` makes it
    repeatable); ``since``: runs created at or after it. Shape (``format``
    ``"durable.replay-check/1"``, docs/deploying.md#the-json-report)::

        {"format", "compatible": bool, "checked": n, "diverged": n, "seconds": s,
         "selection": {"workflow", "version", "status", "sample", "since"},
         "groups": [{"workflow", "version", "registered": bool, "checked": n,
                     "compatible": n, "diverged": n,
                     "outcomes": {"continues": n, "completes": n, ...},
                     "runs": [<each diverged run: RunReplay.to_dict()>]}]}

    Reads only (:func:`durable.worker.replay_check.read_only`); raises ``ValueError``
    for another status.
    """
    started = time.perf_counter()
    report = ReportBuilder(
        {
            "workflow": workflow,
            "version": version,
            "status": status,
            "sample": sample,
            "since": since.isoformat() if since is not None else None,
        }
    )
    if status not in ("open", "all"):
        raise ValueError(f"status must be 'open' or 'all', not {status!r}")
    chunks = histories(
        workflow=workflow, version=version, status=status, sample=sample, since=since, seed=seed
    )
    while True:
        # one read-only transaction a chunk: a long check holds no snapshot for its length
        with read_only():
            chunk = next(chunks, None)
            for run, history, fn, tools in chunk or []:
                report.add(_check_one(run, history, fn, tools), registered=fn is not None)
        if chunk is None:
            return report.result(time.perf_counter() - started)


def _check_one(run: Run, history: list[Step], fn: Any, tools: dict[str, Any]) -> RunReplay:
    try:
        workflow_input = run.input_value() if fn is not None else None
    except Exception as exc:  # noqa: BLE001 - e.g. an encryption key that is not configured
        return _raised(run, f"the run's input cannot be decoded: {type(exc).__name__}: {exc}")
    try:  # a failed statement of the workflow's own aborts only its savepoint
        with postgres.statement_savepoint():
            return dry_replay(run, history, fn, workflow_input, tool_rows=tools)
    except DatabaseError as exc:
        return _raised(run, f"the code's own query failed: {type(exc).__name__}: {exc}")


def _raised(run: Run, message: str) -> RunReplay:
    return RunReplay(
        run_id=run.pk,
        workflow=run.workflow_name,
        version=run.workflow_version,
        status=run.status,
        outcome="diverged",
        divergence=Divergence("raised", message),
    )
