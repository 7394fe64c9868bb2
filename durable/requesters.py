"""Who asked for a run: its starter and, for a fork, everyone up the fork chain.

Four-eyes approvals ("the person who asked may not approve") need to know who asked, so
every run records a *principal* for its starter, and a list of requesters:

- a dashboard account: ``{"user": 3, "name": "alice"}``;
- a login on the machine that ran ``manage.py durable start``: ``{"user": None,
  "name": "os:alice"}`` (``user`` is set when a dashboard account has the same name);
- a name given by code (``durable.start(..., started_by="billing-bot")``), by
  ``--by NAME`` or, later, by an API client (``"api:<client>"``): the same shape;
- nobody known: ``{"user": None, "name": ""}``.

A new run's requesters are ``[its starter]``; a fork's are ``[the forker] + the source
run's requesters`` (so transitively the whole chain). A user *is a requester* when one
entry holds their account id, or when an entry's name, without a known origin prefix
(``os:``, ``cli:``, ``api:``, ``sdk:``), equals their username (case-insensitively).
Matching by name errs on the side of refusing: a namesake can still reject, and another
approver can approve.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict

from durable.exceptions import InvalidIdentifier
from durable.values.fields import hidden_character

#: origins a recorded name may carry in front of a login or client name
ORIGIN_PREFIXES = ("os:", "cli:", "api:", "sdk:")
#: how the starter of a ``manage.py durable`` command is recorded without ``--by``
OS_PREFIX = "os:"
#: the starter of a run the system starts for its own work (``"system:webhooks"``: approval
#: emails, webhook deliveries); the runs list hides these runs unless asked
#: (:func:`is_system`). No dashboard username holds a ``:``, so no person is recorded so.
SYSTEM_PREFIX = "system:"
UNKNOWN_LABEL = "unknown"


class Principal(TypedDict):
    user: int | None
    name: str


UNKNOWN: Principal = {"user": None, "name": ""}


def is_system(name: str | None) -> bool:
    """Whether a recorded starter name is the system's (:data:`SYSTEM_PREFIX`)."""
    return bool(name) and str(name).startswith(SYSTEM_PREFIX)


def bare_name(name: str) -> str:
    """``name`` without its origin prefix: ``"os:alice"`` -> ``"alice"``."""
    for prefix in ORIGIN_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _user_named(name: str) -> Any:
    from django.contrib.auth import get_user_model

    if not name:
        return None
    User = get_user_model()
    field = f"{User.USERNAME_FIELD}__iexact"
    found = list(User.objects.filter(**{field: name})[:2])
    return found[0] if len(found) == 1 else None


def resolve(by: Any) -> tuple[Any, Principal]:
    """``(user or None, principal)`` for who acts: a user object, a name, or ``None``.

    A name whose bare part is a dashboard username (``"alice"``, ``"os:alice"``) maps to
    that account, so the run shows it and four-eyes applies to it. ``None`` or ``""``
    is the unknown principal. Raises :class:`~durable.exceptions.InvalidIdentifier` (a
    ``ValueError``) for a name with a control, bidirectional or zero-width character.
    """
    if by is None or by == "" or getattr(by, "is_anonymous", False) is True:
        return None, dict(UNKNOWN)  # type: ignore[return-value]
    if getattr(by, "pk", None) is not None and hasattr(by, "get_username"):
        return by, {"user": by.pk, "name": by.get_username()[:200]}
    name = str(by).strip()[:200]
    if not name:
        return None, dict(UNKNOWN)  # type: ignore[return-value]
    hidden = hidden_character(name)
    if hidden is not None:  # a name is shown as it is: it must read as what it is
        raise InvalidIdentifier("name of who acts", *hidden)
    user = _user_named(bare_name(name))
    return user, {"user": user.pk if user is not None else None, "name": name}


def is_unknown(principal: Principal | dict[str, Any]) -> bool:
    return not principal.get("user") and not (principal.get("name") or "").strip()


def any_unknown(principals: Iterable[Principal | dict[str, Any]] | None) -> bool:
    """True when one requester is unknown (or nothing was recorded at all)."""
    principals = list(principals or [])
    return not principals or any(is_unknown(p) for p in principals)


def label(principal: Principal | dict[str, Any]) -> str:
    """How a principal is shown: its recorded name, or ``"unknown"``."""
    return (principal.get("name") or "").strip() or UNKNOWN_LABEL


def chain(first: Principal, inherited: Iterable[dict[str, Any]] | None) -> list[Principal]:
    """``first`` followed by ``inherited`` (a source run's requesters), without repeats."""
    out: list[Principal] = []
    seen: set[tuple[Any, str]] = set()
    for p in [first, *(inherited or [])]:
        key = (p.get("user"), (p.get("name") or "").casefold())
        if key not in seen:
            seen.add(key)
            out.append({"user": p.get("user"), "name": p.get("name") or ""})
    return out


def includes(user: Any, principals: Iterable[dict[str, Any]] | None) -> bool:
    """Whether ``user`` (an account) is one of ``principals`` (see the module docstring)."""
    if user is None or getattr(user, "pk", None) is None:
        return False
    username = user.get_username().casefold()
    for p in principals or []:
        if p.get("user") and p["user"] == user.pk:
            return True
        name = bare_name(p.get("name") or "").casefold()
        if name and name == username:
            return True
    return False


def describe(principals: Iterable[dict[str, Any]] | None) -> str:
    """``"alice, os:bob and an unknown starter"``-style text for messages."""
    principals = list(principals or [])
    names = [label(p) for p in principals if not is_unknown(p)]
    if any_unknown(principals):
        names.append("someone unknown")
    if len(names) <= 1:
        return names[0] if names else "someone unknown"
    return ", ".join(names[:-1]) + " and " + names[-1]
