"""The limits of an execution: admit a call, or park its run until the limit admits it.

Before each try of a limited call (a tool with ``rate_limit`` / ``concurrency``, an LLM
model in ``DURABLE['LLM_LIMITS']``) and before a workflow with ``max_concurrent_runs``
starts executing, the execution asks the key's shared state
(:mod:`durable.runtime.limit_store`). A wait of up to :data:`INPLACE_MAX_SECONDS` is slept in
the worker; a longer one parks the run like a durable timer: a ``limit`` wait with the
wake time, the run WAITING and its lease (so its worker) given back, in one fenced
transaction. The wake replays the workflow to the same call, which asks again. A try
that fails with a ``Retry-After`` slows the key for every run (docs/limits.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from durable import clock
from durable.dispatch import dispatch_on_commit
from durable.exceptions import StepTimeout, Suspend
from durable.limits import Limits
from durable.models import transitions
from durable.models.events import TraceEvent
from durable.models.runs import Run
from durable.models.waits import Wait
from durable.retry import classify
from durable.runtime import limit_store
from durable.runtime.checkpoint import Checkpoints
from durable.runtime.replay import ReplayCursor
from durable.values import codec
from durable.vocabulary import EventKind, RunStatus, WaitKind, WaitStatus

#: a limit that admits the call within this many seconds is waited for in the worker
INPLACE_MAX_SECONDS = 1.0
#: the longest slow-down a Retry-After sets (seconds), as durable.durations caps it
MAX_SLOW_SECONDS = 86_400.0

_REASONS = {"rate": "rate limit", "slowed": "rate limit", "concurrency": "concurrency limit"}


class LimitGate:
    """Admission of an execution's limited calls (engine use only): a part of the
    execution over its ``cursor``, parking through its ``checkpoints``."""

    def __init__(self, cursor: ReplayCursor, checkpoints: Checkpoints) -> None:
        self.cursor = cursor
        self.checkpoints = checkpoints
        #: the concurrency slots this execution holds: key -> slot id
        self._limit_slots: dict[str, int] = {}
        #: bodies that outlived their timeout holding a slot of the key: key -> bodies
        self._outliving: dict[str, list[Any]] = {}

    def _held(self) -> dict[str, int]:
        """The concurrency slots this execution holds: key -> slot id."""
        return self._limit_slots

    def admit(
        self,
        limits: Limits,
        *,
        wait_id: str,
        position: int,
        timeout: float | None = None,
        attempt: int = 0,
    ) -> StepTimeout | None:
        """Return once ``limits`` admit one call (a slot, if any, is then held), after
        at most :data:`INPLACE_MAX_SECONDS` of sleeping; else park the run on the
        ``limit`` wait ``wait_id`` and raise :class:`Suspend`.

        ``timeout`` (seconds, the step's): the try's time counts from its first ask
        (kept on the wait row across parks, for ``attempt``), so a park never outlasts
        it: the wait wakes at the timeout at the latest, and a try whose time ran out
        gets the :class:`StepTimeout` to raise as its outcome (returned, nothing held);
        ``None`` when admitted."""
        if limits.key in self._held():
            return None  # this execution holds the slot already (the workflow's own)
        wait_id = wait_id[:255]
        asked_at = self._asked_at(wait_id, attempt) if timeout else None
        queued_since = self._queued_since(wait_id)
        deadline = time.monotonic() + INPLACE_MAX_SECONDS
        while True:
            if timeout and asked_at is not None:
                left = timeout - (timezone.now() - asked_at).total_seconds()
                if left <= 0:
                    return StepTimeout(
                        f"attempt did not start within its timeout of {timeout:g} s: it "
                        f"waited for the limits of {limits.key} ({limits.describe()}); the "
                        "call was not made"
                    )
            verdict, slot = limit_store.acquire(
                limits,
                run_id=self.cursor.run_id,
                token=self.cursor.token,
                since=queued_since,
                wait_id=wait_id,
            )
            if verdict.admitted:
                if slot is not None:
                    self._held()[limits.key] = slot
                return None
            mine = [b for b in self._outliving.get(limits.key, ()) if not b.ended]
            if verdict.reason == "concurrency" and mine:
                # this execution's own timed-out body holds the slot: it frees it when
                # it ends, which parking (giving the lease back) would wait for too
                mine[0].wait()
                self.cursor.waited = True
                if asked_at is not None:  # the wait was the last try's, not this one's
                    asked_at = timezone.now()
                continue
            delay = verdict.delay if not timeout else min(verdict.delay, max(left, 0.0))
            if time.monotonic() + delay <= deadline:
                self.cursor.pause(max(delay, 0.005))
                continue
            self._park_for_limit(
                limits,
                verdict,
                wait_id,
                position,
                queued_since=queued_since,
                delay=delay,
                asked={"attempt": attempt, "asked_at": asked_at.isoformat()}
                if asked_at is not None
                else None,
            )

    def _queued_since(self, wait_id: str) -> datetime:
        """This call's place in the key's queue (:func:`limit_store.queued_ahead`): when
        it first parked on its ``limit`` wait, kept across wakes and parks until it is
        admitted; else now, behind every run already queued."""
        first = (
            Wait.objects.filter(run_id=self.cursor.run_id, wait_id=wait_id, kind=WaitKind.LIMIT)
            .exclude(resolved_by=limit_store.ADMITTED_BY)
            .values_list("created_at", flat=True)
            .first()
        )
        return first or timezone.now()

    def _asked_at(self, wait_id: str, attempt: int) -> datetime:
        """When try ``attempt`` first asked for its limits: kept on its limit wait row
        while it is parked (a wake replays to the same try), else now."""
        payload = (
            Wait.objects.filter(run_id=self.cursor.run_id, wait_id=wait_id)
            .values_list("payload", flat=True)
            .first()
        )
        asked = codec.decode(payload) if payload else None
        if isinstance(asked, dict) and asked.get("attempt") == attempt:
            return datetime.fromisoformat(str(asked["asked_at"]))
        return timezone.now()

    def limited(self, limits: Limits, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` that frees its slot when it returns or raises -- a try that timed out
        while its body still runs, when that body ends -- and slows the key for
        everyone when it fails with a ``Retry-After`` (a provider's 429)."""

        def call() -> Any:
            try:
                return fn()
            except Exception as exc:
                _, retry_after = classify(exc)
                if retry_after is not None and math.isfinite(retry_after) and retry_after > 0:
                    limit_store.slow(limits.key, min(retry_after, MAX_SLOW_SECONDS))
                body = getattr(exc, "body", None)  # a timed-out body still running
                slot = self._held().get(limits.key)
                if body is not None and slot is not None:  # its slot goes with it
                    del self._held()[limits.key]
                    self._outliving.setdefault(limits.key, []).append(body)
                    body.on_end(lambda: limit_store.release(limits.key, slot))
                raise
            finally:
                self.release_slot(limits.key)

        return call

    def release_slot(self, key: str) -> None:
        """Free this execution's slot of ``key``, if it holds one."""
        slot = self._held().pop(key, None)
        if slot is not None:
            limit_store.release(key, slot)

    def release_slots(self) -> None:
        """Free every slot this execution holds (at its end)."""
        for key in list(self._held()):
            self.release_slot(key)

    def _park_for_limit(
        self,
        limits: Limits,
        verdict: Any,
        wait_id: str,
        position: int,
        *,
        queued_since: datetime | None = None,
        delay: float | None = None,
        asked: dict[str, Any] | None = None,
    ) -> None:
        what = _REASONS.get(verdict.reason, "limit")
        delay = verdict.delay if delay is None else delay  # a step's timeout may cut it
        wake_at = clock.now() + timedelta(seconds=delay)
        title = f"waiting for {what} of {limits.key}"
        if verdict.reason == "slowed":
            title += " (slowed down by a 429)"

        def work() -> None:
            now = timezone.now()
            Wait.objects.update_or_create(
                run_id=self.cursor.run_id,
                wait_id=wait_id,
                defaults={
                    "position": position,
                    "kind": WaitKind.LIMIT,
                    "key": limits.key[:255],
                    "status": WaitStatus.PENDING,
                    "title": title[:300],
                    "wake_at": wake_at,
                    # its place in the key's queue: the first ask, kept across re-parks
                    "created_at": queued_since or now,
                    "payload": codec.encode(asked) if asked else None,
                    "result": None,
                    "resolved_at": None,
                    "resolved_by": "",
                },
            )
            transitions.update(
                "park", Run.objects.filter(pk=self.cursor.run_id), source=self.cursor.status
            )
            TraceEvent.objects.create(
                run_id=self.cursor.run_id,
                kind=EventKind.WAITING,
                step_id=wait_id,
                actor=self.cursor.worker_id,
                message=f"{title} ({limits.describe()}) until {wake_at.isoformat()}",
            )
            dispatch_on_commit(self.cursor.run_id, countdown=delay)

        self.cursor.let_bodies_end()  # parking gives the lease back
        self.checkpoints.write({}, work, record_if_stopped=False)
        self.cursor.stopped = RunStatus.WAITING
        raise Suspend(f"{title} until {wake_at.isoformat()}")
