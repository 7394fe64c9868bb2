"""Django signals the engine sends, so upper layers (approvals) can react without the
engine importing them (imports point down only: docs/architecture.md#layers).

- ``wait_created(sender=Wait, wait=Wait, spec=dict)``: inside the transaction that
  creates a wait; ``spec`` is the wait's declared options.
- ``wait_closed(sender=Wait, wait=Wait, reason=str)``: inside the transaction that
  resolves, expires or cancels it.
"""

from __future__ import annotations

from django.dispatch import Signal

wait_created = Signal()
wait_closed = Signal()
