"""The run page's trace tools: the step filter (status and kind), alike repeated steps
folded, and the lanes (a run's own steps, each parallel call and each child run on one
time axis). Split from :mod:`.run_detail`, which uses them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

from django.db.models import Q

from durable.models import Run, Step, StepKind, StepStatus


class _Row(Protocol):
    """What folding reads and marks of a timeline row (``run_detail.StepRow``)."""

    step: Step
    group: str
    repeats_from: int
    repeats_end: bool


Row = TypeVar("Row", bound=_Row)


#: a call of a parallel group named by the group: ``parallel#2[0]``, ``tool_calls[3]``
_GROUP_MEMBER = re.compile(r"^((?:parallel|tool_calls)(?:#[0-9]+)?)\[[0-9]+\]$")


def group_of(step_id: str) -> str:
    """The parallel group a step id names (durable/runtime/parallel.py), or ""."""
    match = _GROUP_MEMBER.match(step_id)
    return match.group(1) if match else ""


#: steps read to draw a run's lanes (the first ones, by position)
LANES_STEPS = 2000
#: lanes drawn at most (the main lane, then groups' calls and children, in time order)
LANES_SHOWN = 40


@dataclass
class Segment:
    """A bar on a lane: ``left`` and ``width`` in percent of the run's timeline."""

    left: float
    width: float
    status: str
    title: str


@dataclass
class Lane:
    """One row of the lanes: the workflow's own steps (``kind`` "steps"), one call of a
    parallel group ("call"), or a child run ("child", ``href`` its page)."""

    label: str
    kind: str
    segments: list[Segment]
    href: str = ""


@dataclass
class Lanes:
    lanes: list[Lane]
    #: lanes left out over :data:`LANES_SHOWN`
    more: int = 0
    #: the steps drawn are the first :data:`LANES_STEPS` of a longer run
    cut: bool = False


def _segment(
    start: datetime, total: float, now: datetime, began: datetime | None, ended: datetime | None,
    status: str, title: str,
) -> Segment:  # fmt: skip
    began = began or start
    ended = ended or (now if status in ("running", "retrying", "waiting", "pending") else began)
    left = min(max((began - start).total_seconds() / total * 100, 0.0), 100.0)
    width = min(max((ended - began).total_seconds() / total * 100, 0.6), max(100.0 - left, 0.6))
    return Segment(round(left, 2), round(width, 2), status, title)


def run_lanes(run: Run, children: list[Run], start: datetime, total: float, now: datetime) -> Lanes:
    """The run's work as lanes on one time axis: its sequential steps on one lane, each
    call of a parallel group on a lane of its own, each child run (``children``) on its
    own lane. One query (the first :data:`LANES_STEPS` steps' times)."""
    rows = list(
        Step.objects.filter(run=run)
        .order_by("position")
        .values_list("step_id", "kind", "status", "started_at", "finished_at")[: LANES_STEPS + 1]
    )
    cut = len(rows) > LANES_STEPS
    main = Lane("this run's steps", "steps", [])
    calls: dict[str, Lane] = {}
    for step_id, kind, status, began, ended in rows[:LANES_STEPS]:
        seg = _segment(start, total, now, began, ended, status, f"{step_id} ({kind}, {status})")
        if group_of(step_id):
            calls.setdefault(step_id, Lane(step_id, "call", [])).segments.append(seg)
        else:
            main.segments.append(seg)
    others = list(calls.values())
    for child in children:
        seg = _segment(
            start,
            total,
            now,
            child.started_at or child.created_at,
            child.finished_at,
            child.status,
            f"{child.id} ({child.workflow_name}, {child.status})",
        )
        others.append(Lane(child.id, "child", [seg], href=child.id))
    others.sort(key=lambda lane: lane.segments[0].left if lane.segments else 100.0)
    lanes = [main, *others] if main.segments else others
    return Lanes(lanes=lanes[:LANES_SHOWN], more=max(len(lanes) - LANES_SHOWN, 0), cut=cut)


#: consecutive alike steps (kind, name without ``#n``, status) from which the later ones
#: are folded behind "N more like this" (the first stays shown)
REPEATS_FOLDED = 3


@dataclass(frozen=True)
class StepFilter:
    """The trace's filter on a run's page (``?step_status=&step_kind=``): "" is any."""

    status: str = ""
    kind: str = ""

    @property
    def active(self) -> bool:
        return bool(self.status or self.kind)

    def q(self) -> Q:
        q = Q()
        if self.status:
            q &= Q(status=self.status)
        if self.kind:
            q &= Q(kind=self.kind)
        return q

    def query(self) -> str:
        """The filter as query parameters (``&``-joined, URL-safe: choices only)."""
        parts = [f"step_status={self.status}"] if self.status else []
        if self.kind:
            parts.append(f"step_kind={self.kind}")
        return "&".join(parts)


def step_filter(status: str | None, kind: str | None) -> StepFilter:
    """The :class:`StepFilter` of query values. Raises ``ValueError`` naming the
    parameter and the values it takes, for a value that is not a step status or kind."""
    status, kind = (status or "").strip(), (kind or "").strip()
    if status and status not in StepStatus.values:
        raise ValueError(
            f"step_status {status[:40]!r} is not a step status: one of "
            + ", ".join(StepStatus.values)
        )
    if kind and kind not in StepKind.values:
        raise ValueError(
            f"step_kind {kind[:40]!r} is not a step kind: one of " + ", ".join(StepKind.values)
        )
    return StepFilter(status, kind)


def _alike(row: _Row) -> tuple[str, str, str] | None:
    s = row.step
    if row.group or s.status == StepStatus.FAILED:  # a group has its own label; failures show
        return None
    return (s.kind, s.step_id.split("#", 1)[0], s.status)


def fold_repeats(rows: list[Row]) -> list[Row]:
    """Mark runs of :data:`REPEATS_FOLDED` or more alike consecutive rows: the first
    stays, the rest are folded (``repeats_from`` on the first folded, ``repeats_end``
    on the last). Failed steps and parallel groups are never folded. Returns ``rows``."""
    i = 0
    while i < len(rows):
        key = _alike(rows[i])
        j = i + 1
        while key is not None and j < len(rows) and _alike(rows[j]) == key:
            j += 1
        if key is not None and j - i >= REPEATS_FOLDED:
            rows[i + 1].repeats_from = j - i - 1
            rows[j - 1].repeats_end = True
        i = j
    return rows
