"""Django signals the engine sends, so upper layers (approvals) can react without the
engine importing them (imports point down only: docs/architecture.md#layers).

- ``wait_created(sender=Wait, wait=Wait, spec=dict)``: inside the transaction that
  creates a wait; ``spec`` is the wait's declared options.
- ``wait_closed(sender=Wait, wait=Wait, reason=str)``: inside the transaction that
  resolves, expires or cancels it.
- ``runs_pruning(sender=Run, run_ids=list[str])``: inside the retention transaction that
  deletes those runs, before any of their rows (``durable.services.retention``); a receiver
  deletes what an upper layer keeps for them that Django's cascade cannot
  (approval decisions protect the argument versions they decided on).
- ``run_exporting(sender=Run, run=Run)``: while the audit document of a run is built
  (``durable.services.export``); a receiver returns ``{section name: JSON-able value}`` to add
  (the approvals app adds ``approvals``: requests, decisions, who and when).
"""

from __future__ import annotations

from django.dispatch import Signal

wait_created = Signal()
wait_closed = Signal()
runs_pruning = Signal()
run_exporting = Signal()
