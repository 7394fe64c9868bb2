"""The chaos audit's beat and operator for the newer capabilities (``manage.py durable_chaos``).

:class:`Extras` is driven by :class:`examples.chaos.Chaos` and does, while workers are
SIGKILLed, what Celery beat and an operator would:

- **Schedules** (docs/schedules.md): it declares the schedule ``chaos-<stamp>`` of
  ``examples.scheduled`` (cron ``* * * * *``, ``catchup="all"``) and ticks it
  (``durable.services.schedules.tick``, what beat's ``durable.tick_schedules`` calls),
  twice each time, as two beats would. Cron slots are minutes, so the ticks run on a
  compressed clock: one slot (one cron minute after the schedule's first slot) every
  :data:`SLOT_SECONDS` of wall time, for as many slots as the audit has ``scheduled``
  runs, and no further.
- **Outgoing webhooks** (docs/api.md#outgoing-webhooks): it subscribes the payments
  service's receiver (``POST /v1/webhooks``) to ``run.succeeded``, ``run.failed`` and
  ``run.compensated`` and runs ``api.webhooks_out.emit_webhooks`` (beat's
  ``api.emit_webhooks``) every second; the workers deliver (``api.webhook_delivery``).
  The subscription starts at the newest trace event when no other subscription is
  active (events of older runs are not the audit's).
- **The shared limit**: it samples the admissions of ``examples.chaos.limited_ticket``
  from its limit row every turn, and slows the first limited call of each run down at
  the payments service (:data:`SLOW_LIMITED_SECONDS`), so calls overlap there.
- **Cancel and compensation cascades**: once an ``examples.cascade`` run's children have
  billed their first invoice, it cancels the parent (the children are cancelled with it)
  and reads :func:`cancel_mark` (what the audit orders the tree's writes by), then, for
  the cascades whose plan says so, compensates it at once (the children's invoices are
  refunded), writes in flight and all.

:meth:`Extras.pending` keeps the chaos loop going until every slot has fired and every
expected webhook delivery has ended; examples/chaos_checks.py audits the outcome.
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from .procs import admin

#: wall-clock seconds per schedule slot (one cron minute of the compressed clock)
SLOT_SECONDS = 1.0
#: the webhook events the audit subscribes to
WEBHOOK_EVENTS = ("run.succeeded", "run.failed", "run.compensated")
#: seconds between two runs of the webhook outbox
EMIT_SECONDS = 1.0
#: the key of the shared limit (docs/limits.md)
LIMIT_KEY = "tool:examples.chaos.limited_ticket"
#: seconds the payments service takes for the first limited call of each run
SLOW_LIMITED_SECONDS = 0.4


class CancelMark(NamedTuple):
    """The highest ids committed when a cascade's cancel had committed (ids, not times:
    examples/chaos_checks.py's ``late_writes``)."""

    #: the newest ``durable.models.Operation`` (ledger row) id; 0: none yet
    operation: int
    #: the newest ``durable.models.TraceEvent`` id; 0: none yet
    event: int


def cancel_mark() -> CancelMark:
    """The highest ledger row and trace event ids committed now; read after a cancel has
    committed, a row of the cancelled tree with a higher id committed after the cancel."""
    from durable.models import Operation, TraceEvent

    def newest(model: Any) -> int:
        return model.objects.order_by("-id").values_list("id", flat=True).first() or 0

    return CancelMark(operation=newest(Operation), event=newest(TraceEvent))


class Extras:
    """Schedule, webhooks and cascades of one chaos audit (``chaos``: its Chaos)."""

    def __init__(self, chaos: Any, stamp: str, slots: int) -> None:
        self.chaos = chaos
        self.schedule_name = f"chaos-{stamp}"
        self.slots = slots
        self.first_slot: datetime | None = None
        self.ticks_from = 0.0
        self.subscription: int | None = None
        self.cancelled: set[str] = set()  # cascade parents the operator cancelled
        self.compensated: set[str] = set()  # ... and compensated
        #: cascade parent -> the ids read once its cancel had committed
        self.cancel_marks: dict[str, CancelMark] = {}
        self.handled: set[str] = set()
        #: the shared limit's admissions (Unix seconds, the database's clock), sampled
        #: from its row every turn (the row keeps the last period and a guard)
        self.admissions: set[float] = set()
        self.next_emit = 0.0

    # ---------------------------------------------------------------------- setup

    def setup(self, receiver_url: str) -> None:
        """Declare the schedule (when there are slots) and the webhook subscription to
        the payments service at ``receiver_url``; slow its first limited calls down."""
        import durable
        from api.models import WebhookCursor, WebhookSubscription
        from durable.models import TraceEvent

        if not WebhookSubscription.objects.filter(active=True).exists():
            newest = TraceEvent.objects.order_by("-id").values_list("id", flat=True).first()
            WebhookCursor.objects.update_or_create(
                name="events", defaults={"last_event_id": newest or 0}
            )
        sub = WebhookSubscription.objects.create(
            url=f"{receiver_url}/v1/webhooks",
            secret="chaos-audit-secret",
            events=list(WEBHOOK_EVENTS),
        )
        self.subscription = sub.pk
        # the first limited call of each run takes the service SLOW_LIMITED_SECONDS, so
        # calls overlap at the service and the concurrency limit is measured, not idle
        # (the others keep the random faults; a rule takes precedence over them)
        admin(
            receiver_url,
            "POST",
            "/_admin/faults",
            {
                "fault": "slow",
                "path": "^/v1/tickets$",
                "method": "POST",
                "match": " limited 0",
                "times": -1,
                "seconds": SLOW_LIMITED_SECONDS,
            },
        )
        if self.slots:
            row = durable.schedule(
                self.schedule_name,
                "examples.scheduled",
                {"customer": "Chaos Scheduled"},
                cron="* * * * *",
                catchup="all",
            )
            self.first_slot = row.next_slot_at
            self.ticks_from = time.monotonic()

    def teardown(self) -> None:
        """Pause the schedule and deactivate the subscription (the audit is over)."""
        from api.models import WebhookSubscription
        from durable.models import Schedule

        Schedule.objects.filter(name=self.schedule_name).update(paused=True)
        if self.subscription is not None:
            WebhookSubscription.objects.filter(pk=self.subscription).update(active=False)

    # ---------------------------------------------------------------- slots, runs

    def expected_slots(self) -> list[str]:
        """The run ids of the schedule's slots, in order."""
        from durable.services.schedules import slot_run_id

        if self.first_slot is None:
            return []
        return [
            slot_run_id(self.schedule_name, self.first_slot + timedelta(minutes=k))
            for k in range(self.slots)
        ]

    def _tick(self) -> None:
        from durable.services.schedules import tick

        if self.first_slot is None:
            return
        due = min(int((time.monotonic() - self.ticks_from) / SLOT_SECONDS), self.slots - 1)
        now = self.first_slot + timedelta(minutes=due, seconds=30)
        for _ in range(2):  # two beats at once start each slot once
            for run_id in tick(now=now):
                if run_id.startswith(f"schedule.{self.schedule_name}."):
                    self.chaos.report.runs.setdefault(run_id, "scheduled")

    def _cascades(self) -> None:
        """Cancel each cascade once its children billed, then compensate it if planned.

        Idempotent per turn, from the database's state: a turn that failed half-way (a
        deadlock, the database restarting) is finished by the next one."""
        import durable
        from durable.exceptions import DurableError
        from durable.models import Operation, OperationStatus, Run, RunStatus

        for run_id, plan in self.chaos.plans.items():
            if not plan.get("cancel") or run_id in self.handled:
                continue
            status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
            if status != RunStatus.CANCELLED:
                billed = Operation.objects.filter(
                    run__parent_run_id=run_id, status=OperationStatus.SUCCEEDED
                ).exists()
                if not billed:
                    continue
                try:
                    durable.cancel(
                        run_id, by=self.chaos.operator, reason="chaos: cancel mid-flight"
                    )
                except DurableError:
                    continue  # it ended meanwhile: the audit says whether it should have
            if run_id not in self.cancel_marks:
                # after the commit (a turn that failed after it reads it later: a higher
                # mark, which misses more but never blames a write before the cancel)
                self.cancel_marks[run_id] = cancel_mark()
            self.cancelled.add(run_id)
            if plan.get("compensate"):
                # a turn that failed after the compensate committed (a deadlock) finds it
                # compensating; from any other status it is for the audit to say
                with contextlib.suppress(DurableError):
                    durable.compensate(run_id, by=self.chaos.operator, reason="chaos: undo")
                self.compensated.add(run_id)
            self.handled.add(run_id)

    def operate(self, remaining: list[str]) -> None:
        """One turn of beat and operator: tick, cancel and compensate, emit webhooks."""
        from api.webhooks_out import emit_webhooks
        from durable.models import Limit

        self._tick()
        self._cascades()
        admitted = Limit.objects.filter(key=LIMIT_KEY).values_list("admitted", flat=True).first()
        self.admissions.update(float(t) for t in admitted or [])
        if time.monotonic() >= self.next_emit:
            emit_webhooks()
            self.next_emit = time.monotonic() + EMIT_SECONDS

    # ------------------------------------------------------------------- waiting

    def expected_deliveries(self) -> dict[str, tuple[str, str]]:
        """``{delivery run id: (event id, event type)}`` for every webhook event of the
        audit's runs and their children that the subscription asks for."""
        from api.webhooks_out import FAILURE_KINDS
        from durable.models import Run, TraceEvent
        from durable.vocabulary import EventKind

        roots = list(self.chaos.report.runs)
        tree = roots + list(
            Run.objects.filter(parent_run_id__in=roots).values_list("id", flat=True)
        )
        kinds = [EventKind.COMPLETED, *FAILURE_KINDS]
        out = {}
        for pk, kind, message in TraceEvent.objects.filter(
            run_id__in=tree, kind__in=kinds
        ).values_list("id", "kind", "message"):
            if kind != EventKind.COMPLETED:
                type_ = "run.failed"
            else:
                type_ = "run.compensated" if "compensated" in message else "run.succeeded"
            out[f"webhook.{self.subscription}.{pk}"] = (f"evt_{pk}", type_)
        return out

    def pending(self) -> str:
        """What the loop still waits for once every run has ended ("" for nothing)."""
        from durable.models import TERMINAL, Run

        roots = list(self.chaos.report.runs)
        children = Run.objects.filter(parent_run_id__in=roots).exclude(status__in=TERMINAL)
        if children.exists():  # a compensated parent's children may still compensate
            return f"{children.count()} child runs to end"
        fired = set(roots)
        unfired = [r for r in self.expected_slots() if r not in fired]
        if unfired:
            return f"{len(unfired)} schedule slots to fire"
        wanted = self.expected_deliveries()
        ended = set(
            Run.objects.filter(pk__in=list(wanted), status__in=TERMINAL).values_list(
                "pk", flat=True
            )
        )
        if len(ended) < len(wanted):
            return f"{len(wanted) - len(ended)} webhook deliveries to end"
        return ""
