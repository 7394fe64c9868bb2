"""The ``Schedule`` model: a workflow started on a cron expression (durable/services/schedules.py).

Kept beside :mod:`durable.models` (which re-exports it) so each module stays small. The
row holds the next slot to start; every tick that finds it due starts the slot's run
under a run id made of the schedule's name and the slot, so that two beat processes
ticking at once start one run (the idempotent ``durable.start`` does the work).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from durable.values.fields import StorableCharField, StorableTextField
from durable.vocabulary import Catchup


class Schedule(models.Model):
    """A workflow started at every slot of ``cron`` in ``timezone``
    (see durable/services/schedules.py)."""

    name = models.CharField(
        max_length=80,
        unique=True,
        help_text="1-80 letters, digits, '.', '_' or '-': part of every run id it starts",
    )
    workflow_name = models.CharField(max_length=200)
    input = StorableTextField(
        blank=True, default="null", help_text="the runs' input, as stored (codec JSON)"
    )
    cron = models.CharField(
        max_length=120, help_text="five fields: minute hour day-of-month month day-of-week"
    )
    timezone = models.CharField(
        max_length=64, default="UTC", help_text="an IANA zone name, e.g. Europe/Berlin"
    )
    catchup = models.CharField(
        max_length=8,
        choices=Catchup.choices,
        default=Catchup.LATEST,
        help_text="slots missed while no beat ran: start the latest one, all, or none",
    )
    paused = models.BooleanField(default=False)
    next_slot_at = models.DateTimeField(
        null=True, blank=True, db_index=True, help_text="the next slot to start (UTC)"
    )
    last_slot_at = models.DateTimeField(null=True, blank=True)
    last_run_id = models.CharField(max_length=128, blank=True, default="")
    skipped_slots = models.PositiveIntegerField(
        default=0, help_text="missed slots that were not started (catch-up policy)"
    )
    updated_by = StorableCharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(catchup__in=Catchup.values), name="schedule_catchup_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"
