"""The chaos audit's checks of the newer capabilities (``manage.py durable_chaos``).

Called by :func:`examples.chaos_audit.audit` with the payments service's objects; each
check adds to ``report.violations`` (any entry fails the audit) and to the counts the
table shows:

- **end states**: a run ends as its kind expects (:func:`expected_end`): succeeded,
  except a cascade, which ends ``cancelled`` (or ``compensated`` when the operator
  compensated it), its children likewise (a child with no write is only cancelled);
- **schedule**: the runs of the audit's schedule are exactly its slots' runs (no slot
  twice, none missing) and it skipped no slot;
- **webhooks**: every ``run.succeeded`` / ``run.failed`` / ``run.compensated`` event of
  the audit's runs (children included) reached the receiver at least once, with the
  right type. docs/api.md promises at-least-once delivery with a stable ``webhook-id``
  (the delivery's idempotency key, "by which a receiver drops a repeat"): so a
  ``webhook-id`` may arrive more than once, but always with the same body and event, and
  an event reaches the subscription under one ``webhook-id`` only;
- **cancel**: after a cascade's cancel committed no write of its run tree started and
  no child was created, and every invoice request the service logged for the tree had
  a ledger row (no write outside the ledger). Ordered by the database, not by clocks:
  the operator reads the highest ledger row and trace event ids once the cancel has
  committed (:func:`examples.chaos_operator.cancel_mark`), and a ledger row of the tree
  or a child's ``created`` event with a higher id committed after the cancel. A fenced
  write holds its run's row from its fence to its commit, and the cancel locks every
  run of the tree in one transaction, so a write that passed its fence committed before
  the cancel, with an id at most the mark (its result may land later: an update of the
  same row). A row that slipped past a broken fence between the cancel's commit and the
  read is missed; no row is blamed wrongly. The rows' ``created_at`` are two processes'
  clocks (the worker's shared clock, the canceller's wall clock) and cannot order a
  write at the cancel;
- **compensation**: each invoice of a compensated cascade is refunded exactly once (the
  refund's charge is ``ch_<invoice id>``), and a cascade that was only cancelled is
  refunded nothing;
- **shared limit**: the service-side log of ``examples.chaos.limited_ticket`` requests
  (retries and faulted requests included) never has more than ``LIMITED_CONCURRENCY``
  in flight (a request's time at the service lies within its slot's, so this holds
  whatever the latency) nor more than ``LIMITED_CALLS_PER_SECOND`` arriving within one
  second; and the engine's admissions (sampled from the limit's row) never number more
  than that within the period plus ``GUARD_SECONDS``. The rate reaches the service intact
  only while a call reaches it within ``GUARD_SECONDS`` of its admission
  (docs/limits.md): a second at the service with one call too many while the admissions
  held is shown as a late arrival (a stalled process on a loaded machine), not a failure.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from .chaos_agents import LIMITED_CALLS_PER_SECOND, LIMITED_CONCURRENCY
from .procs import admin

#: the subjects of the limited tool's tickets: ``"<run id> limited <n>"``
LIMITED_SUBJECT = " limited "


def expected_end(kind: str, plan: dict[str, Any]) -> str:
    """The status a run of ``kind`` with the operator's ``plan`` must end in."""
    if kind == "cascade" and plan.get("cancel"):
        return "compensated" if plan.get("compensate") else "cancelled"
    return "succeeded"


def check_ends(report: Any, plans: dict[str, dict[str, Any]], statuses: dict[str, str]) -> None:
    """Runs (and cascade children) that did not end as their kind expects."""
    from durable.models import Operation, Run

    for run_id, kind in report.runs.items():
        want = expected_end(kind, plans.get(run_id, {}))
        got = statuses.get(run_id)
        if got is not None and got != want:
            report.violations["runs not in their expected end state"].append(
                f"{run_id}: {got}, expected {want}"
            )
        if kind != "cascade":
            continue
        for child_id, status in Run.objects.filter(parent_run_id=run_id).values_list(
            "id", "status"
        ):
            child_want = "cancelled"
            if want == "compensated" and Operation.objects.owned_by(child_id).exists():
                child_want = "compensated"
            if status != child_want:
                report.violations["runs not in their expected end state"].append(
                    f"{child_id}: {status}, expected {child_want}"
                )


def check_schedule(report: Any, extras: Any) -> None:
    from durable.models import Run, Schedule

    expected = extras.expected_slots()
    fired = set(
        Run.objects.filter(id__startswith=f"schedule.{extras.schedule_name}.").values_list(
            "id", flat=True
        )
    )
    report.schedule_slots = (len(fired & set(expected)), len(expected))
    problems = report.violations["schedule slots missing or extra"]
    problems += [f"{r} missing" for r in expected if r not in fired]
    problems += [f"{r} not a slot" for r in sorted(fired - set(expected))]
    row = Schedule.objects.filter(name=extras.schedule_name).first()
    if row is not None and row.skipped_slots:
        problems.append(f"{row.name} skipped {row.skipped_slots} slots")


def check_webhooks(report: Any, extras: Any, payments_url: str) -> None:
    from durable.models import Run

    wanted = extras.expected_deliveries()
    received = admin(payments_url, "GET", "/_admin/webhooks")["data"]
    by_event: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in received:
        by_event[row["event_id"]].append(row)
    bodies: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for row in received:
        bodies[row["webhook_id"]].add((row["event_id"], row["body_sha"]))
    delivered = 0
    for delivery, (event_id, type_) in wanted.items():
        rows = by_event.get(event_id, [])
        if not rows:
            status = Run.objects.filter(pk=delivery).values_list("status", flat=True).first()
            report.violations["webhook events not delivered"].append(
                f"{event_id} ({type_}; delivery run {delivery}: {status})"
            )
            continue
        delivered += 1
        if {r["type"] for r in rows} != {type_}:
            report.violations["webhook events not delivered"].append(
                f"{event_id}: type {sorted({r['type'] for r in rows})}, expected {type_}"
            )
        ids = {r["webhook_id"] for r in rows}
        if len(ids) > 1:
            report.violations["webhook events under two ids"].append(f"{event_id}: {sorted(ids)}")
    report.violations["webhook ids with two payloads"] += [
        f"{wid} x{len(seen)}" for wid, seen in bodies.items() if len(seen) > 1
    ]
    report.webhooks = (delivered, len(wanted), len(received) - len(bodies))


def late_writes(run_id: str, ops: Any, mark: Any) -> list[str]:
    """The writes (``ops``: Operation rows of ``run_id``'s tree) and children of the
    cascade ``run_id`` that came after its cancel, by ``mark`` (a
    :class:`examples.chaos_operator.CancelMark` read once the cancel committed; ``None``:
    none was read, itself reported)."""
    from durable.models import TraceEvent
    from durable.vocabulary import EventKind

    if mark is None:
        return [f"{run_id}: cancelled, but no ledger mark was read at its cancel"]
    late = [
        f"{op.idempotency_key} started after the cancel (ledger row {op.pk}, the newest "
        f"at the cancel {mark.operation})"
        for op in sorted(ops, key=lambda op: op.pk)
        if op.pk > mark.operation
    ]
    late += [
        f"child {child} created after the cancel (event {event}, the newest at the cancel "
        f"{mark.event})"
        for child, event in TraceEvent.objects.filter(
            run__parent_run_id=run_id, kind=EventKind.CREATED, id__gt=mark.event
        )
        .order_by("id")
        .values_list("run_id", "id")
    ]
    return late


def _tree(run_id: str) -> list[str]:
    from durable.models import Run

    return [run_id, *Run.objects.filter(parent_run_id=run_id).values_list("id", flat=True)]


def check_cascades(
    report: Any,
    extras: Any,
    objects: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    root_of: Any,
) -> None:
    from durable.models import Operation, TraceEvent
    from durable.vocabulary import EventKind

    cascades = [r for r, kind in report.runs.items() if kind == "cascade"]
    invoices: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for obj in objects:
        if obj["object"] == "invoice":
            invoices[root_of(obj["run_id"])].append(obj)
    refunds = Counter(o["charge_id"] for o in objects if o["object"] == "refund")
    refunds_of: dict[str, list[str]] = defaultdict(list)
    for obj in objects:
        if obj["object"] == "refund":
            refunds_of[root_of(obj["run_id"])].append(obj["charge_id"])
    asked: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for req in requests:
        if req["path"] == "/v1/invoices" and req["idempotency_key"]:
            asked[root_of(req["idempotency_key"].split(":", 1)[0])].append(req)
    after = report.violations["bodies after a cancel"]
    undo = report.violations["writes not compensated exactly once"]
    to_undo = undone = 0
    for run_id in cascades:
        if not TraceEvent.objects.filter(run_id=run_id, kind=EventKind.CANCELLED).exists():
            continue  # reported as a wrong end state
        report.cascades["compensated" if run_id in extras.compensated else "cancelled"] += 1
        tree = _tree(run_id)
        ops = {
            op.idempotency_key: op
            for op in Operation.objects.filter(run_id__in=tree).exclude(
                step_id__startswith="compensate:"
            )
        }
        after += late_writes(run_id, ops.values(), extras.cancel_marks.get(run_id))
        after += [
            f"{req['idempotency_key']}: a write without a ledger row"
            for req in asked.get(run_id, [])
            if req["idempotency_key"] not in ops
        ]
        keys = {f"ch_{inv['id']}": inv["idempotency_key"] for inv in invoices.get(run_id, [])}
        charges = list(keys)
        if run_id in extras.compensated:
            to_undo += len(charges)
            undone += sum(1 for c in charges if refunds[c] == 1)
            for c in charges:
                if refunds[c] != 1:
                    op = ops.get(keys[c])
                    undo.append(
                        f"{c} refunded x{refunds[c]} (write {keys[c]}: "
                        + (f"{op.status} {op.resolution}".strip() if op else "no ledger row")
                        + ")"
                    )
        else:
            undo += [f"{c} refunded (the run was only cancelled)" for c in charges if refunds[c]]
        undo += [f"{c}: not an invoice of {run_id}" for c in refunds_of[run_id] if c not in charges]
    report.compensated_writes = (undone, to_undo)


def most_within(stamps: list[float], seconds: float) -> tuple[int, int]:
    """(the most of the sorted ``stamps`` within any window shorter than ``seconds``,
    the index of the first stamp of the first such window)."""
    most = first = at = 0
    for last in range(len(stamps)):
        while stamps[last] - stamps[first] >= seconds:
            first += 1
        if last - first + 1 > most:
            most, at = last - first + 1, first
    return most, at


def check_limit(
    report: Any, requests: list[dict[str, Any]], admissions: list[float] | None = None
) -> None:
    """The shared limit at the service (``requests``: ``GET /_admin/requests``) and in
    the engine (``admissions``: Unix seconds; ``None``: not sampled, the service's
    count alone decides)."""
    rows = sorted(
        (r["arrived"], r["ended"], r.get("idempotency_key"), r.get("status"))
        for r in requests
        if r["path"] == "/v1/tickets" and LIMITED_SUBJECT in (r["subject"] or "")
    )
    calls = [(a, e) for a, e, _, _ in rows]
    edges = sorted([(a, 1) for a, _ in calls] + [(e, -1) for _, e in calls])
    in_flight = most = 0
    for _, step in edges:  # an end at the same instant as an arrival comes first
        in_flight += step
        most = max(most, in_flight)
    from durable.runtime.limit_store import GUARD_SECONDS

    per_second, at = most_within([a for a, _ in calls], 1.0)
    densest = rows[at : at + per_second]
    admitted, _ = most_within(sorted(admissions or []), 1.0 + GUARD_SECONDS)
    report.limit = (most, per_second, len(calls))
    report.limit_admitted = admitted
    if admitted > LIMITED_CALLS_PER_SECOND:
        report.violations["shared limit exceeded"].append(
            f"the engine admitted {admitted} limited calls within {1 + GUARD_SECONDS:g} s "
            f"(limit {LIMITED_CALLS_PER_SECOND})"
        )
    if most > LIMITED_CONCURRENCY:
        report.violations["shared limit exceeded"].append(
            f"{most} limited calls in flight at once (limit {LIMITED_CONCURRENCY})"
        )
    held = admissions is not None and admitted <= LIMITED_CALLS_PER_SECOND
    if per_second > LIMITED_CALLS_PER_SECOND and held:
        # the engine's admissions held: the calls reached the service later than the
        # window's guard allows for (a stalled worker, a loaded machine), docs/limits.md
        report.limit_late.append(
            ", ".join(f"+{a - densest[0][0]:.3f}s {key}" for a, _, key, _ in densest)
        )
    elif per_second > LIMITED_CALLS_PER_SECOND:
        report.violations["shared limit exceeded"].append(
            f"{per_second} limited calls within one second (limit {LIMITED_CALLS_PER_SECOND}): "
            + ", ".join(
                f"+{a - densest[0][0]:.3f}s {key} ({status})" for a, _, key, status in densest
            )
        )


def check_extras(
    report: Any,
    extras: Any,
    *,
    plans: dict[str, dict[str, Any]],
    statuses: dict[str, str],
    objects: list[dict[str, Any]],
    payments_url: str,
    root_of: Any,
) -> None:
    """Every check above; ``statuses``: run id -> status of the audit's runs."""
    requests = admin(payments_url, "GET", "/_admin/requests")["data"]
    check_ends(report, plans, statuses)
    check_limit(report, requests, sorted(extras.admissions) if extras is not None else None)
    if extras is None:
        return
    check_schedule(report, extras)
    check_webhooks(report, extras, payments_url)
    check_cascades(report, extras, objects, requests, root_of)
