"""Prometheus metrics (docs/observability.md#metrics): counted where the engine commits,
and read from the database when scraped.

Two kinds, for two reasons. What happens in a worker (checkpoint latency, steps
executed and replayed, failed attempts by classification, lost leases, recoveries) is
counted by the process that did it, after its transaction committed -- a rolled-back
checkpoint counts nothing. What the system *is* (runs by status, pending waits by kind
and age, approvals pending and how long decisions took, unknown outcomes, the broker's
queue) is read from the database and the broker at scrape time
(:mod:`durable.observability.scrape`), so it is right whichever process answers and
survives restarts.

Several processes (daphne, Celery's prefork children) share one view of the counters
through prometheus_client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set
(``make up`` sets it); otherwise each process exposes its own. This module imports
no model, so the checkpoint can call it without the models above it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import Counter, Histogram

from durable.exceptions import LeaseLost
from durable.vocabulary import EventKind

__all__ = [
    "CHECKPOINT_SECONDS",
    "checkpoint",
    "replayed",
]

#: seconds buckets of a checkpoint (a commit: 0.2 ms on a quiet server to seconds under load)
CHECKPOINT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
#: seconds buckets of an approval's time to decision (a minute to a week)
DECISION_BUCKETS = (60, 300, 900, 3600, 4 * 3600, 86_400, 3 * 86_400, 7 * 86_400)
#: approvals decided in this many seconds before the scrape make the decision histogram
DECISION_WINDOW_SECONDS = 86_400.0

CHECKPOINT_SECONDS = Histogram(
    "durable_checkpoint_seconds",
    "Seconds a checkpoint transaction took, to its commit (path: orm, one_statement)",
    ["path"],
    buckets=CHECKPOINT_BUCKETS,
)
STEPS_EXECUTED = Counter(
    "durable_steps_executed", "Steps executed and checkpointed (not replayed)", ["kind"]
)
STEPS_REPLAYED = Counter(
    "durable_steps_replayed", "Recorded steps returned by a replay without running", ["kind"]
)
ATTEMPTS_FAILED = Counter(
    "durable_attempts_failed",
    "Failed tries of a step, by classification; retried: whether a retry was scheduled",
    ["classification", "retried"],
)
LEASE_LOSSES = Counter(
    "durable_lease_losses", "Checkpoints refused because another worker held the lease"
)
RECOVERIES = Counter(
    "durable_recoveries", "Runs claimed again after their worker's lease expired or it died"
)
UNKNOWN_OUTCOMES = Counter(
    "durable_unknown_outcomes", "Writes whose outcome became unknown (to reconcile)"
)


def count_events(events: Iterable[Any]) -> None:
    """Count what committed trace events say (``kind``, ``data``): steps, failures,
    recoveries, unknown outcomes."""
    events = list(events)
    retried = any(getattr(e, "kind", "") == EventKind.RETRY_SCHEDULED for e in events)
    for e in events:
        kind = getattr(e, "kind", "")
        data = getattr(e, "data", None) or {}
        if kind == EventKind.STEP_EXECUTED:
            step_executed(str(data.get("kind") or "step"))
        elif kind == EventKind.ATTEMPT_FAILED:
            classification = str(data.get("classification") or "unknown")
            ATTEMPTS_FAILED.labels(classification=classification, retried=str(retried)).inc()
        elif kind == EventKind.RECOVERED:
            RECOVERIES.inc()
        elif kind == EventKind.UNKNOWN_OUTCOME:
            UNKNOWN_OUTCOMES.inc()


#: the labelled children of the counters above, by (metric name, label value): what
#: ``labels()`` answers, without its keyword handling and lock per step (~5 us); a child
#: is the same object either way (prometheus_client keeps them), in multiprocess mode too
_CHILDREN: dict[tuple[str, str], Any] = {}


def _child(metric: Any, value: str) -> Any:
    key = (metric._name, value)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = metric.labels(value)
    return child


def step_executed(kind: str) -> None:
    """One step executed and checkpointed (its commit done) of ``kind``."""
    _child(STEPS_EXECUTED, kind or "step").inc()


def checkpoint_committed(path: str, seconds: float) -> None:
    """A checkpoint on ``path`` (``orm``, ``one_statement``) committed in ``seconds``."""
    _child(CHECKPOINT_SECONDS, path).observe(seconds)


@contextlib.contextmanager
def checkpoint(events: Sequence[Any] = (), *, path: str = "orm") -> Iterator[None]:
    """Time a checkpoint transaction (put it around ``transaction.atomic()``, so the
    commit is inside) and count its ``events`` once it committed; a lost lease counts
    as one. Anything raised propagates unchanged."""
    started = time.perf_counter()
    try:
        yield
    except LeaseLost:
        LEASE_LOSSES.inc()
        raise
    checkpoint_committed(path, time.perf_counter() - started)
    count_events(events)


def replayed(kind: str) -> None:
    """One recorded step returned by a replay."""
    _child(STEPS_REPLAYED, kind or "step").inc()
