"""Small value types of the public API."""

from __future__ import annotations

from dataclasses import dataclass
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
        return cls(approved=bool(data.get("approved")),
                   decided_by=tuple(data.get("decided_by") or ()),
                   decided_at=str(data.get("decided_at") or ""),
                   comment=str(data.get("comment") or ""),
                   edited=data.get("edited"), expired=bool(data.get("expired")))

    def to_dict(self) -> dict[str, Any]:
        return {"approved": self.approved, "decided_by": list(self.decided_by),
                "decided_at": self.decided_at, "comment": self.comment,
                "edited": self.edited, "expired": self.expired}
