"""A dry replay: a run's recorded history against the workflow code registered now.

Invariant: a dry replay writes nothing and executes nothing. It is the engine's own
execution (:class:`~durable.runtime.execution.Execution`, the same context, the same
replay cursor and its non-determinism check), with a cursor that answers every recorded
call as a replay does and stops, by a private ``BaseException``, at the first call that
would execute (the one place the engine checks budgets): so no step body, tool, LLM call,
wait or child start is reached, and a workflow's ``except Exception`` cannot swallow the
stop. The engine's own cursor is untouched: the dry one is a subclass, so the hot path
pays nothing for it. A pending or answered wait that has no step row yet (the run is
parked on it, or woken and not yet resumed) is part of the history at its position, as a
step that did not succeed: code that now asks for another call there diverges.
See docs/deploying.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from durable.context import WorkflowContext
from durable.exceptions import NonDeterminismError
from durable.models.runs import Run
from durable.models.steps import Step
from durable.runtime.execution import Execution
from durable.runtime.replay import ReplayCursor
from durable.vocabulary import RunStatus, StepKind, StepStatus, WaitKind, WaitStatus

__all__ = ["Divergence", "RunReplay", "dry_replay", "history_with_waits"]

#: the step kind a wait's call takes (``WaitParking.wait``); other wait kinds (a
#: reconcile decision, a limit) sit at the position of a call that has its own step row
WAIT_STEP_KINDS = {
    WaitKind.APPROVAL: StepKind.WAIT,
    WaitKind.TIMER: StepKind.SLEEP,
    WaitKind.SIGNAL: StepKind.SIGNAL,
    WaitKind.CHILD: StepKind.WAIT,
}

_DURABLE = Path(__file__).resolve().parents[1]
_CONTRIB = _DURABLE / "contrib"


@dataclass(frozen=True)
class Divergence:
    """Where a run's history and the code part.

    ``reason``: ``"different_call"`` (another step id at the position), ``"kind_changed"``
    (the same id, another kind of call), ``"tool_changed"`` (the same id, another tool),
    ``"returned_early"`` (the code returned before a recorded call), ``"raised"`` (the
    code raised), ``"not_registered"`` (the run's workflow and version are not
    registered). ``expected``/``got``: ``{"step_id", "kind", "tool"}`` or ``None``;
    ``file``/``line``: the code's line that made the call (or raised).
    """

    reason: str
    message: str
    position: int | None = None
    expected: dict[str, str] | None = None
    got: dict[str, str] | None = None
    file: str = ""
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "message": self.message,
            "position": self.position,
            "expected": self.expected,
            "got": self.got,
            "file": self.file,
            "line": self.line,
        }


@dataclass
class RunReplay:
    """The outcome of one run's dry replay.

    ``outcome``: ``"continues"`` (the code reached a call with no record: a real
    execution would continue there, ``continues_at``), ``"completes"`` (the code returned
    where the history ends), ``"fails_as_recorded"`` (the code raised what the failed
    run recorded), or ``"diverged"`` (``divergence`` says where). ``replayed``: recorded
    calls answered. ``compatible`` is ``outcome != "diverged"``.
    """

    run_id: str
    workflow: str
    version: str
    status: str
    outcome: str
    replayed: int = 0
    continues_at: dict[str, Any] | None = None
    divergence: Divergence | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def compatible(self) -> bool:
        return self.outcome != "diverged"

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "version": self.version,
            "status": self.status,
            "compatible": self.compatible,
            "outcome": self.outcome,
            "replayed": self.replayed,
            "continues_at": self.continues_at,
            "divergence": self.divergence.to_dict() if self.divergence else None,
        }

    def __str__(self) -> str:
        head = f"run {self.run_id} ({self.workflow} v{self.version}, {self.status})"
        if self.divergence is None:
            where = ""
            if self.continues_at is not None:
                where = f" at position {self.continues_at['position']} "
                where += f"({self.continues_at['step_id']})"
            return f"{head}: compatible, {self.outcome}{where}"
        d = self.divergence
        at = f" ({d.file}:{d.line})" if d.file else ""
        return f"{head}: diverged: {d.message}{at}"


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
            expected = (
                _call(rec.step_id, rec.kind, rec.tool_name) if rec is not None else None
            )
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
            {"position": pos, "step_id": sid, "kind": kind, "tool": tool, "file": file, "line": line}
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


def history_with_waits(steps: list[Step], waits: list[tuple[int, str, str, str]]) -> list[Step]:
    """The steps of a run, plus an unsaved, not succeeded step for each workflow wait
    ``(position, wait_id, wait kind, wait status)`` whose position has no step row yet:
    the wait the run is parked on (or was woken from) is part of its history."""
    taken = {s.position for s in steps}
    extra = [
        Step(
            position=pos,
            step_id=wait_id,
            kind=WAIT_STEP_KINDS[kind],
            status=StepStatus.WAITING if status == WaitStatus.PENDING else StepStatus.RUNNING,
        )
        for pos, wait_id, kind, status in waits
        if kind in WAIT_STEP_KINDS and pos not in taken and status != WaitStatus.CANCELLED
    ]
    return steps + extra if extra else steps


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
