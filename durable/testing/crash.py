"""Crashes at a step's boundaries, in-process, and what each step's body is doing.

A worker that dies is simulated by :class:`SimulatedCrash`, a ``BaseException``: neither
workflow code nor the engine catches it (the engine lets every ``BaseException`` that
is not its own leave the execution with the lease still held, as after a SIGKILL; see
``durable/runtime/attempts.py``), so the run stays RUNNING under a lease nobody
renews, and nothing after the crash point is written. Recovery is then the real one:
the lease runs out, the sweeper dispatches the run, a fresh execution claims it and
replays (``DurableEnv.run`` does it).

Three points of a durable call (a step, a tool call, an LLM call, a compensation):

- ``"before"``: the body is about to start (for a write, after its operation row
  ``started`` is committed: the ledger must settle it on recovery);
- ``"after_effect"``: the body returned (the external effect happened) and nothing is
  checkpointed yet;
- ``"after_checkpoint"``: the call's result is recorded (committed for a ``sync``
  call; a ``batched`` one may still wait for its group's commit).

:class:`Hooks` installs the one wrapper around the engine's attempt loop and its
checkpoint that arms these points and tells :data:`current_call` which call a body
belongs to (the scripted LLM and the tool recorder read it).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable.runtime import attempts, checkpoint

__all__ = ["POINTS", "CallInfo", "CrashPoint", "Hooks", "SimulatedCrash", "current_call"]

#: the crash points of a call, in the order a try passes them
POINTS = ("before", "after_effect", "after_checkpoint")


class SimulatedCrash(BaseException):
    """The worker "died" at ``point`` of the call ``step_id`` of run ``run_id``.

    Not an ``Exception``: nothing in the workflow or the engine catches it, so the
    execution stops there with its lease held and writes nothing more."""

    def __init__(self, run_id: str, step_id: str, point: str) -> None:
        super().__init__(f"simulated crash {point} {step_id!r} of run {run_id}")
        self.run_id, self.step_id, self.point = run_id, step_id, point


@dataclass(frozen=True)
class CallInfo:
    """The durable call a body runs for: its run, step id, kind and tool (or model)."""

    run_id: str
    step_id: str
    kind: str
    tool_name: str

    @property
    def idempotency_key(self) -> str:
        """``"{run_id}:{step_id}"``, the key the engine gives the call."""
        return f"{self.run_id}:{self.step_id}"


#: the call whose body runs in this context (copied into a timed body's thread)
current_call: contextvars.ContextVar[CallInfo | None] = contextvars.ContextVar(
    "durable_testing_current_call", default=None
)


@dataclass
class CrashPoint:
    """An armed crash: at ``point`` of the first call matching ``step`` (its step id,
    its id without the ``#n`` of a repeat, or its tool or model name) of ``run_id``
    (any run: ``None``). ``fired``: the crash, once it happened."""

    step: str
    point: str
    run_id: str | None = None
    fired: SimulatedCrash | None = None

    def matches(self, info: CallInfo, point: str) -> bool:
        if self.fired is not None or point != self.point:
            return False
        if self.run_id is not None and info.run_id != self.run_id:
            return False
        return self.step in (info.step_id, info.step_id.split("#", 1)[0], info.tool_name)


@dataclass
class Hooks:
    """The wrapper around ``Attempts.execute`` and ``Checkpoints.record_success``:
    install with :meth:`install`, remove with :meth:`uninstall`."""

    armed: list[CrashPoint] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _saved: list[tuple[type, str, Any]] = field(default_factory=list)

    def arm(self, step: str, point: str, run_id: str | None = None) -> CrashPoint:
        """Crash once at ``point`` (one of :data:`POINTS`) of the call ``step``.
        Raises ``ValueError`` for another point."""
        if point not in POINTS:
            raise ValueError(f"point must be one of {', '.join(POINTS)}, got {point!r}")
        crash = CrashPoint(step=step, point=point, run_id=run_id)
        with self._lock:
            self.armed.append(crash)
        return crash

    def fire(self, info: CallInfo, point: str) -> None:
        """Raise :class:`SimulatedCrash` if a crash is armed at ``point`` of ``info``."""
        with self._lock:
            crash = next((c for c in self.armed if c.matches(info, point)), None)
            if crash is None:
                return
            crash.fired = SimulatedCrash(info.run_id, info.step_id, point)
        raise crash.fired

    def install(self) -> Hooks:
        hooks = self
        real_execute = attempts.Attempts.execute
        real_record = checkpoint.Checkpoints.record_success

        def execute(self: attempts.Attempts, call: Any, *, fn: Callable[[], Any], **kw: Any) -> Any:
            info = CallInfo(self.cursor.run_id, call.step_id, str(call.kind), call.tool_name)

            def body() -> Any:
                hooks.fire(info, "before")
                token = current_call.set(info)
                try:
                    value = fn()
                finally:
                    current_call.reset(token)
                hooks.fire(info, "after_effect")
                return value

            return real_execute(self, call, fn=body, **kw)

        def record_success(self: checkpoint.Checkpoints, call: Any, **kw: Any) -> Any:
            value = real_record(self, call, **kw)
            info = CallInfo(self.cursor.run_id, call.step_id, str(call.kind), call.tool_name)
            hooks.fire(info, "after_checkpoint")
            return value

        for owner, name, value in (
            (attempts.Attempts, "execute", execute),
            (checkpoint.Checkpoints, "record_success", record_success),
        ):
            self._saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, value)
        return self

    def uninstall(self) -> None:
        while self._saved:
            owner, name, value = self._saved.pop()
            setattr(owner, name, value)
