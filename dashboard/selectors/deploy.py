"""Reads of the deploy-check page: the open runs of each workflow by version, beside the
versions this process has registered, and the last replay check run from the page.

One aggregate query for the runs, whatever their number; the registry is this web
process's (the same modules as the workers', ``DURABLE_WORKFLOW_MODULES``). The last
report lives in the cache (``django.core.cache``): with the default in-memory cache it
is this process's last check, with a shared cache the last one of any web process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.cache import cache
from django.db.models import Count

from durable import registry
from durable.models import Run
from durable.worker.replay_check import OPEN_STATUSES

#: the cache key of the last report (``{"report", "at", "by"}``)
LAST_REPORT_KEY = "durable:deploy-check:last"


@dataclass
class VersionRow:
    version: str
    open_runs: int
    registered: bool
    latest: bool


@dataclass
class WorkflowRow:
    name: str
    versions: list[VersionRow] = field(default_factory=list)

    @property
    def open_runs(self) -> int:
        return sum(v.open_runs for v in self.versions)

    @property
    def unregistered_runs(self) -> int:
        """Open runs whose version this process does not have (no worker like it resumes
        them)."""
        return sum(v.open_runs for v in self.versions if not v.registered)


def open_runs_by_version() -> list[WorkflowRow]:
    """Every workflow with open runs or registered here: its versions (registered, or with
    open runs), each with its open runs, whether it is registered and the latest."""
    counts: dict[tuple[str, str], int] = {
        (row["workflow_name"], row["workflow_version"]): row["n"]
        for row in Run.objects.filter(status__in=OPEN_STATUSES)
        .values("workflow_name", "workflow_version")
        .annotate(n=Count("id"))
    }
    registered = {(s.name, s.version) for s in registry.workflows()}
    latest = {name: registry.get_workflow(name).version for name, _ in registered}
    rows: dict[str, WorkflowRow] = {}
    for name, version in sorted(set(counts) | registered):
        rows.setdefault(name, WorkflowRow(name)).versions.append(
            VersionRow(
                version=version,
                open_runs=counts.get((name, version), 0),
                registered=(name, version) in registered,
                latest=latest.get(name) == version,
            )
        )
    return list(rows.values())


def last_report() -> dict[str, Any] | None:
    """The last check run from the page: ``{"report", "at" (ISO), "by"}``, or ``None``."""
    return cache.get(LAST_REPORT_KEY)


def keep_report(report: dict[str, Any], *, at: str, by: str) -> None:
    cache.set(LAST_REPORT_KEY, {"report": report, "at": at, "by": by}, timeout=None)
