"""JSON typed by a person or sent by a machine, parsed with bounds checked first.

``json.loads`` recurses once per level of nesting, so a text of 10,000 ``[`` raises
``RecursionError``; and it accepts ``NaN`` and ``Infinity``, which are not JSON (RFC 8259,
section 6) and which no column stores. Every place that parses JSON from outside -- the
dashboard's forms, the approval edit, the CLI's ``--input`` and ``--result`` -- calls
:func:`loads_bounded`, which checks the size and the nesting depth on the text *before*
parsing and refuses the non-standard constants.
"""

from __future__ import annotations

import json
from typing import Any

from durable.exceptions import DurableError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "JSONInputError", "loads_bounded", "nesting_exceeds"]

#: largest JSON text accepted by default, in bytes of UTF-8
MAX_BYTES = 200_000
#: deepest nesting of lists and objects accepted by default
MAX_DEPTH = 64


class JSONInputError(DurableError, ValueError):
    """JSON text that was refused; the message names ``what`` and the reason.

    ``code``: ``"too_large"``, ``"too_deep"`` or ``"invalid"``.
    """

    def __init__(self, message: str, *, code: str):
        self.code = code
        super().__init__(message)


def nesting_exceeds(text: str, limit: int) -> bool:
    """Whether ``[``/``{`` outside strings nest deeper than ``limit`` (one linear scan)."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_bounded(
    text: str, *, what: str = "The value", max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    """Parse ``text`` as strict JSON; size (bytes) and depth are checked before parsing.

    Raises :class:`JSONInputError` (a ``ValueError``) whose message starts with ``what``:
    "… is larger than N bytes", "… is nested deeper than N levels", "… is not valid
    JSON: <the parser's reason, with line and column>".
    """
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise JSONInputError(f"{what} is larger than {max_bytes} bytes.", code="too_large")
    if nesting_exceeds(text, max_depth):
        raise JSONInputError(f"{what} is nested deeper than {max_depth} levels.", code="too_deep")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise JSONInputError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} "
            f"(character {exc.pos + 1}).",
            code="invalid",
        ) from None
    except (ValueError, RecursionError) as exc:
        raise JSONInputError(f"{what} is not valid JSON: {exc}.", code="invalid") from None
