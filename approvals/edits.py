"""An approver's edit of the arguments: bounded parsing, secrets kept, signature checks.

Rules (docs/approvals.md):

- An edit is a JSON object of at most :data:`EDIT_MAX_BYTES` bytes nested at most
  :data:`EDIT_MAX_DEPTH` deep; both are checked on the text *before* it is parsed, so a
  hostile edit cannot exhaust the parser's recursion.
- A parameter whose stored value holds a secret (a redacted string, a
  :class:`~durable.Secret`) is *locked*: the edit form shows it as "secret, kept", the
  edit leaves it out (or sends the placeholder ``[REDACTED]`` unchanged) and the server
  puts the stored real value back. An edit cannot change a locked parameter, and no
  value of an edit may contain the placeholder text.
- For a tool, the merged arguments are checked against the tool's signature and type
  annotations (:func:`durable.values.arguments.validate_arguments`) before anything is recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from durable import registry
from durable.exceptions import DurableError, PayloadError, ToolNotFound
from durable.values import codec
from durable.values.jsontext import JSONInputError, loads_bounded
from durable.values.redaction import REDACTED

#: largest edit accepted, in bytes of UTF-8 JSON text
EDIT_MAX_BYTES = 100_000
#: deepest nesting of lists and objects accepted in an edit
EDIT_MAX_DEPTH = 32
#: what the edit form shows in place of a locked parameter
KEPT = "secret, kept"


class InvalidEdit(DurableError, ValueError):
    """The edited arguments cannot be approved; nothing was recorded.

    ``errors``: field name (``""`` for the edit as a whole) -> messages.
    """

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        parts = [
            f"{field}: {'; '.join(msgs)}" if field else "; ".join(msgs)
            for field, msgs in errors.items()
        ]
        super().__init__(
            "the edited arguments were refused, the request is still pending: " + " | ".join(parts)
        )


def _whole(message: str) -> InvalidEdit:
    return InvalidEdit({"": [message]})


def _value_depth(value: Any) -> int:
    """Deepest nesting of containers in a Python value, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > EDIT_MAX_BYTES:  # more items than bytes allowed: too big anyway
            return EDIT_MAX_DEPTH + 1
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            if depth > EDIT_MAX_DEPTH:
                return depth
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            deepest = max(deepest, depth)
            if depth > EDIT_MAX_DEPTH:
                return depth
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parse_edit(text: str) -> dict[str, Any]:
    """Parse an edit typed as JSON text; raises :class:`InvalidEdit`."""
    try:
        value = loads_bounded(
            text, what="The edit", max_bytes=EDIT_MAX_BYTES, max_depth=EDIT_MAX_DEPTH
        )
    except JSONInputError as exc:
        raise _whole(str(exc)) from None
    if not isinstance(value, dict):
        raise _whole("The edited parameters must be a JSON object ({...}).")
    return value


def _has_secret(raw: Any) -> bool:
    stack = [raw]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get(codec.TAG) in ("secret", "Secret"):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def secret_keys(stored: str | None) -> frozenset[str]:
    """Top-level parameters of a stored (codec) value that hold a secret anywhere."""
    if not stored:
        return frozenset()
    raw = json.loads(stored)
    if isinstance(raw, dict) and raw.get(codec.TAG) == "dict":  # a dict stored as pairs
        pairs = [(k, v) for k, v in raw.get("v", []) if isinstance(k, str)]
    elif isinstance(raw, dict) and codec.TAG not in raw:
        pairs = list(raw.items())
    else:
        return frozenset()
    return frozenset(k for k, v in pairs if _has_secret(v))


def _contains_placeholder(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and REDACTED in item:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


@dataclass(frozen=True)
class PreparedEdit:
    """An edit ready to record: the full arguments (secrets merged back) and their text."""

    value: dict[str, Any]
    text: str
    digest: str


def prepare(*, edited: Any, stored: str | None, tool_name: str) -> PreparedEdit:
    """Check an edit against the current version (``stored``, codec text) and the tool.

    Returns the arguments the tool would run with; raises :class:`InvalidEdit` listing
    every problem by field.
    """
    if not isinstance(edited, dict):
        raise _whole("The edited parameters must be a JSON object (a dict).")
    if _value_depth(edited) > EDIT_MAX_DEPTH:
        raise _whole(f"The edit is nested deeper than {EDIT_MAX_DEPTH} levels.")
    locked = secret_keys(stored)
    current = codec.decode(stored) if stored else None
    current = current if isinstance(current, dict) else {}
    errors: dict[str, list[str]] = {}
    merged: dict[str, Any] = {}
    for key, value in edited.items():
        if not isinstance(key, str):
            errors.setdefault(str(key), []).append("parameter names are text")
        elif key in locked:
            if value != REDACTED:
                errors.setdefault(key, []).append(
                    f"{KEPT}: a secret cannot be changed in an edit; leave it out to keep it"
                )
        elif _contains_placeholder(value) or REDACTED in key:
            errors.setdefault(key, []).append(
                f"holds the placeholder {REDACTED}: type the real value, or leave a secret "
                "parameter out to keep it"
            )
        else:
            merged[key] = value
    for key in locked:
        if key in current:
            merged[key] = current[key]
    if tool_name:
        try:
            spec = registry.get_tool(tool_name)
        except ToolNotFound:
            errors.setdefault("", []).append(
                f"tool {tool_name!r} is not registered in this process, so an edit cannot be "
                "checked; approve or reject the proposed arguments"
            )
        else:
            # pydantic, imported when an edit is checked: not by every process that
            # imports the approvals' services (a CLI command, a worker)
            from durable.values.arguments import validate_arguments

            for err in validate_arguments(spec.fn, merged, unchecked=locked & merged.keys()):
                errors.setdefault(err.field, []).append(err.message)
    if errors:
        raise InvalidEdit(errors)
    try:
        text = codec.dumps_checked(merged, what="edited parameters")
    except PayloadError as exc:
        raise _whole(str(exc)) from None
    return PreparedEdit(value=merged, text=text, digest=codec.fingerprint(merged))


# --- showing versions ----------------------------------------------------------------


@dataclass(frozen=True)
class DiffRow:
    """One parameter of a diff between two versions; values are display JSON text."""

    key: str
    change: str  # "same", "changed", "added", "removed", "kept" (a locked secret)
    before: str
    after: str


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def diff(before: Any, after: Any, *, locked: frozenset[str] = frozenset()) -> list[DiffRow]:
    """Per-parameter differences between two display values (``decode_for_display``);
    a value that is not an object is compared as a whole (key ``""``)."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        change = "same" if before == after else "changed"
        return [DiffRow("", change, _shown(before), _shown(after))]
    rows = []
    for key in list(before) + [k for k in after if k not in before]:
        if key in locked:
            rows.append(DiffRow(key, "kept", KEPT, KEPT))
        elif key not in after:
            rows.append(DiffRow(key, "removed", _shown(before[key]), ""))
        elif key not in before:
            rows.append(DiffRow(key, "added", "", _shown(after[key])))
        else:
            rows.append(
                DiffRow(
                    key,
                    "same" if before[key] == after[key] else "changed",
                    _shown(before[key]),
                    _shown(after[key]),
                )
            )
    return rows


def summary(rows: list[DiffRow], limit: int = 300) -> str:
    """``amount: 100 → 40; to: added "x"`` -- the changed rows in one line."""
    parts = []
    for row in rows:
        if row.change == "changed":
            parts.append(f"{row.key or 'value'}: {row.before} → {row.after}")
        elif row.change == "added":
            parts.append(f"{row.key}: added {row.after}")
        elif row.change == "removed":
            parts.append(f"{row.key}: removed")
    text = "; ".join(parts) or "no change"
    return text if len(text) <= limit else text[: limit - 1] + "…"
