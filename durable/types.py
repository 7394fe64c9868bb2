"""Small value types of the public API."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass(frozen=True)
class ModelRecoverable:
    """What a step or tool call returns when the agent made a fixable mistake.

    Returned (not raised) so the workflow can feed ``message`` back to the model, e.g.
    as the tool message of an OpenAI chat completion. It is recorded and replayed like
    any result. ``error_type`` names the error; ``details`` is JSON-able extra data.
    """

    message: str
    error_type: str = "ModelRecoverableError"
    details: Any = None

    is_error = True

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "error_type": self.error_type, "details": self.details}


class _NotFound:
    """Returned by a tool's ``reconcile`` hook when the write did not happen."""

    _instance: _NotFound | None = None

    def __new__(cls) -> _NotFound:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "durable.NOT_FOUND"

    def __bool__(self) -> bool:
        return False


NOT_FOUND = _NotFound()


@dataclass(frozen=True)
class Decision:
    """The answer to ``ctx.wait_for_approval``.

    ``approved``; ``decided_by`` (usernames, in order; ``["timeout"]`` on expiry);
    ``decided_at`` (ISO 8601 text); ``comment``; ``edited`` (the approver's edited
    parameters, when the policy allows editing, else ``None``); ``expired``.
    """

    approved: bool
    decided_by: tuple[str, ...] = ()
    decided_at: str = ""
    comment: str = ""
    edited: Any = None
    expired: bool = False

    def __bool__(self) -> bool:
        return self.approved

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        return cls(
            approved=bool(data.get("approved")),
            decided_by=tuple(data.get("decided_by") or ()),
            decided_at=str(data.get("decided_at") or ""),
            comment=str(data.get("comment") or ""),
            edited=data.get("edited"),
            expired=bool(data.get("expired")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "approved": self.approved,
            "decided_by": list(self.decided_by),
            "decided_at": self.decided_at,
            "comment": self.comment,
            "edited": self.edited,
            "expired": self.expired,
        }


class SignalDelivery(str, Enum):
    """Where :func:`durable.signal` put a signal."""

    #: a pending ``wait_for_signal(name)`` received it; the run continues
    DELIVERED = "delivered"
    #: no wait for the name was pending: it waits in the run's mailbox for the next one
    KEPT = "kept"


@dataclass(frozen=True)
class SignalResult:
    """What :func:`durable.signal` did with a signal, and what to tell the sender.

    ``delivery`` (:class:`SignalDelivery`); ``name``; ``waiting_on``: the signal names
    the run's pending waits are for now; ``waited_on``: every signal name the run has
    waited on so far, in order; ``duplicate``: the ``dedupe_key`` was seen before and
    nothing new was stored; ``message``: one sentence for the sender (it differs for a
    name the run never waited on, to catch typos); ``signal``: the stored
    :class:`~durable.models.Signal` row.

    Backward compatible with the ``Signal`` row ``durable.signal`` used to return: it is
    truthy, and attributes it does not define (``pk``, ``wait``, ``wait_id``,
    ``payload``, ...) are read from ``signal``.
    """

    signal: Any
    delivery: SignalDelivery
    name: str = ""
    waiting_on: tuple[str, ...] = ()
    waited_on: tuple[str, ...] = ()
    duplicate: bool = False
    message: str = ""

    @property
    def delivered(self) -> bool:
        return self.delivery == SignalDelivery.DELIVERED

    @property
    def misaddressed(self) -> bool:
        """Kept although the run has waited on signals, never on this name (a typo?)."""
        return (
            self.delivery == SignalDelivery.KEPT
            and bool(self.waited_on)
            and self.name not in self.waited_on
        )

    def __bool__(self) -> bool:
        return True

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(object.__getattribute__(self, "signal"), attr)


@dataclass(frozen=True)
class ChildHandle:
    """A child run started by ``ctx.start_child`` (docs/children.md).

    ``run_id``: the child's run id (``"{parent_run_id}.{child_id}"``);
    ``workflow_name``: its workflow; ``step_id``: the parent's step that started it.
    :meth:`result` waits durably for the child's end (as ``ctx.wait_child(handle)``).
    """

    run_id: str
    workflow_name: str
    step_id: str
    _context: Any = field(default=None, repr=False, compare=False)

    def result(self) -> Any:
        """Wait for the child's end; return its output. Raises
        :class:`~durable.ChildFailed` when it failed, was cancelled or compensated."""
        if self._context is None:
            raise RuntimeError("this ChildHandle belongs to no workflow: use ctx.wait_child")
        return self._context.wait_child(self)


class Secret:
    """A value that must never be persisted or shown in clear.

    ``Secret(value)`` wraps any value the codec can store (usually a ``str``);
    ``.reveal()`` returns it. ``repr()`` is ``Secret('***')`` and ``str()`` is
    ``'***'``, so logging or formatting a Secret does not leak it. Two Secrets are
    equal when their values are equal; a Secret is hashable when its value is.

    The codec stores a Secret encrypted and decodes it back to a ``Secret``; the
    dashboard shows it as ``[REDACTED]``.
    """

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def reveal(self) -> Any:
        """Return the wrapped value, in clear."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Secret):
            return bool(self._value == other._value)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if isinstance(other, Secret):
            return not bool(self._value == other._value)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((Secret, self._value))
