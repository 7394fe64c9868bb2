"""The chaos audit's report and its audit of the services (``manage.py durable_chaos``).

:func:`audit` compares the payments service's objects and the SMTP sink's messages with
the runs: an effect counted more often than :data:`EXPECTED` says (per run, its child
runs' effects included), the same business effect under two keys (a charge refunded
twice, a Message-ID delivered twice, a ticket subject written twice), an effect missing
from a succeeded run, a run lost (started, absent) or not terminal, and a framework
run's model call asked again after its step was recorded (:func:`check_model_calls`,
from the scripted LLM's request log). :class:`Report` holds the counts and prints the
table.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

from .chaos_agents import EXPECTED as NEW_EXPECTED
from .chaos_agents import LIMITED_CALLS_PER_SECOND, LIMITED_CONCURRENCY
from .chaos_checks import check_extras
from .chaos_frameworks import EXPECTED as FRAMEWORK_EXPECTED
from .chaos_frameworks import MODEL_STEPS
from .procs import admin

#: what one succeeded run of each agent leaves in the services: (collection, count);
#: a parent's count includes its child runs' effects
EXPECTED: dict[str, dict[str, int]] = {
    "support": {"ticket": 1, "refund": 1, "email": 1},
    "invoice": {"invoice": 1, "email": 1},
    "procurement": {"purchase_request": 1, "order": 1},
    **NEW_EXPECTED,
    **FRAMEWORK_EXPECTED,
}
#: the collections whose duplicates the table lists ("model call": a framework run's
#: model call asked again after its step was recorded, :func:`check_model_calls`)
DUPLICATE_CHECKS = (
    "refund",
    "ticket",
    "email",
    "invoice",
    "order",
    "purchase_request",
    "model call",
)


def root_run_id(run_id: str) -> str:
    """The top-level run of ``run_id``: a child's id is ``"{parent_run_id}.{child_id}"``;
    a schedule's run (``"schedule.<name>.<slot>"``) has no children."""
    if run_id.startswith("schedule."):
        return run_id
    return run_id.split(".", 1)[0]


@dataclass
class Report:
    runs: dict[str, str] = field(default_factory=dict)  # run id -> kind
    statuses: Counter = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    not_terminal: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    duplicates: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    missing: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    effects: Counter = field(default_factory=Counter)
    kills: int = 0
    workers_started: int = 0
    approvals: int = 0
    escalations: int = 0
    signals: int = 0
    restarts: int = 0
    clock_steps: int = 0
    reconciled: int = 0
    worker_lost_attempts: int = 0
    plan_requests: int = 0
    child_runs: Counter = field(default_factory=Counter)  # status -> child runs
    limit_waits: int = 0
    #: network partitions (``--partition``): links cut, and how long the cut lasted
    partitions: int = 0
    partition_seconds: float = 0.0
    #: runs a cut-off worker held when its link dropped; those another worker claimed
    #: while it was cut off; those whose cut-off worker, back, was refused a write
    partition_held: list[str] = field(default_factory=list)
    partition_taken_over: list[str] = field(default_factory=list)
    partition_fenced: list[str] = field(default_factory=list)
    #: the framework runs' model calls answered by the scripted LLM / beyond one a turn
    model_calls: int = 0
    model_calls_again: int = 0
    #: failures of the newer checks (examples/chaos_checks.py): check name -> items
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    schedule_slots: tuple[int, int] = (0, 0)  # fired, expected
    webhooks: tuple[int, int, int] = (0, 0, 0)  # events delivered, expected, repeats
    cascades: Counter = field(default_factory=Counter)  # cancelled / compensated
    compensated_writes: tuple[int, int] = (0, 0)  # undone exactly once, to undo
    limit: tuple[int, int, int] = (0, 0, 0)  # max in flight, max per second, requests
    limit_admitted: int = 0  # the engine's most admissions within the period + guard
    #: seconds with a call too many at the service, the admissions held (late arrivals)
    limit_late: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def duplicate_count(self) -> int:
        return sum(len(v) for v in self.duplicates.values())

    @property
    def ok(self) -> bool:
        return not (
            self.duplicate_count
            or self.lost
            or self.not_terminal
            or self.missing
            or any(self.violations.values())
        )

    def table(self) -> str:
        rows: list[tuple[str, Any, str]] = [
            ("runs started", len(self.runs), ""),
            *[(f"  {status}", n, "") for status, n in sorted(self.statuses.items())],
            ("lost runs", len(self.lost), "FAIL" if self.lost else "ok"),
            ("runs not terminal", len(self.not_terminal), "FAIL" if self.not_terminal else "ok"),
        ]
        for name in DUPLICATE_CHECKS:
            dups = len(self.duplicates.get(name, []))
            rows.append((f"duplicate {name}s", dups, "FAIL" if dups else "ok"))
        rows += [
            (
                "effects missing from succeeded runs",
                sum(len(v) for v in self.missing.values()),
                "FAIL" if self.missing else "ok",
            ),
            (
                "refunds / tickets / emails",
                (f"{self.effects['refund']} / {self.effects['ticket']} / {self.effects['email']}"),
                "",
            ),
            ("workers SIGKILLed / started", f"{self.kills} / {self.workers_started}", ""),
            ("attempts lost with a worker", self.worker_lost_attempts, ""),
            ("writes reconciled after a crash", self.reconciled, ""),
            ("approvals decided / escalated", f"{self.approvals} / {self.escalations}", ""),
            ("signals sent", self.signals, ""),
            (
                "child runs succeeded / started",
                f"{self.child_runs['succeeded']} / {sum(self.child_runs.values())}",
                "",
            ),
            ("calls parked on the shared limit", self.limit_waits, ""),
            (
                "shared limit: max in flight / max per second",
                f"{self.limit[0]} / {self.limit[1]}",
                "FAIL" if self.violations.get("shared limit exceeded") else "ok",
            ),
            (
                "  (limit; limited requests seen)",
                f"{LIMITED_CONCURRENCY} / {LIMITED_CALLS_PER_SECOND}; {self.limit[2]}",
                "",
            ),
            ("  engine: most admitted in a period + guard", self.limit_admitted, ""),
            (
                "  seconds with a late call (beyond the guard)",
                len(self.limit_late),
                "late" if self.limit_late else "",
            ),
            (
                "schedule slots fired / expected",
                f"{self.schedule_slots[0]} / {self.schedule_slots[1]}",
                self._verdict("schedule slots missing or extra"),
            ),
            (
                "webhook events delivered / expected",
                f"{self.webhooks[0]} / {self.webhooks[1]}",
                self._verdict("webhook events not delivered"),
            ),
            ("  webhook redeliveries (same id, same body)", self.webhooks[2], ""),
            (
                "webhook ids with two payloads",
                len(self.violations.get("webhook ids with two payloads", [])),
                self._verdict("webhook ids with two payloads"),
            ),
            (
                "webhook events under two ids",
                len(self.violations.get("webhook events under two ids", [])),
                self._verdict("webhook events under two ids"),
            ),
            (
                "cascades cancelled / cancelled + compensated",
                f"{self.cascades['cancelled']} / {self.cascades['compensated']}",
                "",
            ),
            (
                "writes after a cancel",
                len(self.violations.get("bodies after a cancel", [])),
                self._verdict("bodies after a cancel"),
            ),
            (
                "writes compensated exactly once / to undo",
                f"{self.compensated_writes[0]} / {self.compensated_writes[1]}",
                self._verdict("writes not compensated exactly once"),
            ),
            (
                "runs not in their expected end state",
                len(self.violations.get("runs not in their expected end state", [])),
                self._verdict("runs not in their expected end state"),
            ),
            ("LLM plan requests (incl. re-asked after a kill)", self.plan_requests, ""),
            (
                "framework model calls / asked again (killed mid-call)",
                f"{self.model_calls} / {self.model_calls_again}",
                "",
            ),
            ("PostgreSQL + Redis restarts", self.restarts, ""),
            ("worker clock steps", self.clock_steps, ""),
            (
                "network partitions (link cut, s)",
                f"{self.partitions} ({self.partition_seconds:.1f})",
                "",
            ),
            (
                "  runs held / taken over while cut off",
                f"{len(self.partition_held)} / {len(self.partition_taken_over)}",
                "",
            ),
            ("  late writes of the cut-off worker fenced", len(self.partition_fenced), ""),
            ("wall time (s)", f"{self.seconds:.1f}", ""),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [f"{'check'.ljust(width)}  {'value':>9}  result", "-" * (width + 19)]
        lines += [f"{name.ljust(width)}  {value!s:>9}  {verdict}" for name, value, verdict in rows]
        lines.append("-" * (width + 19))
        lines.append(
            "AUDIT CLEAN: zero duplicates, zero losses"
            if self.ok
            else "AUDIT FAILED: "
            + ", ".join(
                f"{k}: {', '.join(v[:5])}"
                for k, v in {
                    **{f"duplicate {n}": d for n, d in self.duplicates.items() if d},
                    "lost": self.lost,
                    "not terminal": self.not_terminal,
                    **{f"missing {n}": m for n, m in self.missing.items()},
                    **self.violations,
                }.items()
                if v
            )
        )
        if self.failed:
            lines.append(
                "failed runs: "
                + "; ".join(f"{rid}: {why}" for rid, why in list(self.failed.items())[:10])
            )
        if self.limit_late:
            lines.append(
                "late limited calls (the engine admitted them within the limit; they "
                "reached the service later than the guard allows): " + "; ".join(self.limit_late)
            )
        if self.missing:
            lines.append(
                "missing effects: "
                + "; ".join(f"{k}: {', '.join(v[:5])}" for k, v in self.missing.items())
            )
        return "\n".join(lines)

    def _verdict(self, check: str) -> str:
        return "FAIL" if self.violations.get(check) else "ok"


def audit(
    report: Report,
    *,
    payments_url: str,
    sink_url: str,
    llm_url: str,
    plans: dict[str, dict[str, Any]] | None = None,
    extras: Any = None,
) -> None:
    """Fill ``report`` (its ``runs`` given) from the database and the services' state.

    ``plans`` (run id -> the operator's plan) say which end state each run must reach;
    ``extras`` (examples/chaos_operator.py) is the schedule, webhooks and cascades to
    check (examples/chaos_checks.py).
    """
    from .chaos_checks import expected_end

    plans = plans or {}
    from durable.models import TERMINAL, AttemptOutcome, Operation, Run, StepAttempt, Wait
    from durable.vocabulary import WaitKind

    run_ids = list(report.runs)
    children = dict(Run.objects.filter(parent_run_id__in=run_ids).values_list("id", "status"))
    report.child_runs.update(children.values())
    every_run = run_ids + list(children)
    rows = {r["id"]: r for r in Run.objects.filter(pk__in=run_ids).values("id", "status", "error")}
    for run_id in run_ids:
        row = rows.get(run_id)
        if row is None:
            report.lost.append(run_id)
            continue
        report.statuses[row["status"]] += 1
        if row["status"] not in TERMINAL:
            report.not_terminal.append(run_id)
        elif row["status"] != expected_end(report.runs[run_id], plans.get(run_id, {})):
            report.failed[run_id] = (
                f"{row['status']}: " + str((row["error"] or {}).get("message", ""))[:160]
            )
    objects = admin(payments_url, "GET", "/_admin/objects")["data"]
    mails = httpx.get(f"{sink_url}/messages", timeout=30).json()["data"]
    per_run: dict[str, Counter] = defaultdict(Counter)
    for obj in objects:
        per_run[root_run_id(obj["run_id"])][obj["object"]] += 1
        report.effects[obj["object"]] += 1
    by_message = Counter(m["message_id"] for m in mails)
    for mail in mails:
        per_run[root_run_id(mail["run_id"])]["email"] += 1
        report.effects["email"] += 1
    for run_id, kind in report.runs.items():
        counts = per_run.get(run_id, Counter())
        for name, expected in EXPECTED[kind].items():
            if counts[name] > expected:
                report.duplicates[name].append(f"{run_id} x{counts[name]}")
            status = rows.get(run_id, {}).get("status")
            if status == "succeeded" and counts[name] < expected:
                output = Run.objects.get(pk=run_id).output_value() or {}
                if output.get("status") not in ("rejected", "expired", "voided"):
                    report.missing[name].append(run_id)
    # the same effect under two keys would hide from the per-run count: check the
    # business identity too (a charge refunded twice, a Message-ID delivered twice, a
    # ticket whose subject names its run and effect written twice)
    by_charge = Counter(o["charge_id"] for o in objects if o["object"] == "refund")
    report.duplicates["refund"] += [f"{c} x{n}" for c, n in by_charge.items() if n > 1]
    report.duplicates["email"] += [f"{m} x{n}" for m, n in by_message.items() if n > 1]
    subjects = [str(o["subject"]) for o in objects if o["object"] == "ticket"]
    by_subject = Counter(t for t in subjects if root_run_id(t.split(" ", 1)[0]) in report.runs)
    report.duplicates["ticket"] += [f"{t!r} x{n}" for t, n in by_subject.items() if n > 1]
    customers = [str(o["customer"]) for o in objects if o["object"] == "invoice"]
    by_customer = Counter(c for c in customers if root_run_id(c.split(" ", 1)[0]) in report.runs)
    report.duplicates["invoice"] += [f"{c!r} x{n}" for c, n in by_customer.items() if n > 1]
    report.reconciled = Operation.objects.filter(
        run_id__in=every_run, resolution__startswith="reconciled"
    ).count()
    report.worker_lost_attempts = StepAttempt.objects.filter(
        run_id__in=every_run, outcome=AttemptOutcome.WORKER_LOST
    ).count()
    report.limit_waits = Wait.objects.filter(run_id__in=every_run, kind=WaitKind.LIMIT).count()
    check_extras(
        report,
        extras,
        plans=plans,
        statuses={r: row["status"] for r, row in rows.items()},
        objects=objects,
        payments_url=payments_url,
        root_of=root_run_id,
    )
    asked = admin(llm_url, "GET", "/_admin/requests")["data"]
    report.plan_requests = sum(
        1 for r in asked if r["run"] in report.runs and r["turn"] == 0 and r["status"] == 200
    )
    check_model_calls(report, asked)


def check_model_calls(report: Report, asked: list[dict[str, Any]]) -> None:
    """A framework run's model call whose step was recorded is never asked again.

    ``asked``: the scripted LLM's request log (``run``, ``turn``: the assistant messages
    before the request, ``status``). A turn answered more than once for a run must be
    explained by a try of one of its model steps (:data:`MODEL_STEPS`: PydanticAI's and
    the OpenAI Agents SDK's ``model``, ``model#2``...; LangGraph's ``superstep-N``, where
    the model node runs) that did not record: lost with its worker (killed mid-call) or
    failed, or by an execution stopped on a database fault (a ``db_fault`` event: the
    step in progress then runs again from the top, as durable/worker/engine.py's
    ``release_after_db_fault`` says). Each unexplained extra answer is a duplicate
    "model call" of its run.
    """
    from durable.models import StepAttempt, TraceEvent
    from durable.vocabulary import EventKind

    kinds = {rid: kind for rid, kind in report.runs.items() if kind in MODEL_STEPS}
    answered = Counter(
        (r["run"], r["turn"]) for r in asked if r["run"] in kinds and r["status"] == 200
    )
    again: Counter = Counter()
    for (run_id, _turn), n in answered.items():
        again[run_id] += n - 1
    tries: Counter = Counter()
    rows = StepAttempt.objects.filter(run_id__in=list(kinds)).values_list("run_id", "step__step_id")
    for run_id, step_id in rows:
        if step_id.startswith(MODEL_STEPS[kinds[run_id]]):
            tries[run_id] += 1
    faults = Counter(
        TraceEvent.objects.filter(run_id__in=list(kinds), kind=EventKind.DB_FAULT).values_list(
            "run_id", flat=True
        )
    )
    report.model_calls += sum(answered.values())
    report.model_calls_again += sum(again.values())
    for run_id in kinds:
        if again[run_id] > tries[run_id] + faults[run_id]:
            report.duplicates["model call"].append(
                f"{run_id} x{again[run_id]} again, {tries[run_id]} unrecorded tries, "
                f"{faults[run_id]} database faults"
            )
