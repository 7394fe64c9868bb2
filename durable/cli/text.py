"""Text for the shell: aligned tables, printable cells, payload previews, and option parsing.

Every cell the CLI prints goes through :func:`_clean`, so a run's input, an error
message or a title cannot move the cursor or recolour the terminal (ANSI escapes come out
escaped), and payloads go through :func:`durable.values.codec.decode_for_display`, so secrets
print as ``[REDACTED]``. Separate from the subcommands so that reading (``.inspection``)
and acting (``.actions``) share one formatting and one set of exit codes.
"""

from __future__ import annotations

import argparse
import getpass
import json
import unicodedata
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

from durable import requesters
from durable.values import codec
from durable.values.jsontext import JSONInputError, loads_bounded

USER_ERROR = 2
RUN_DID_NOT_SUCCEED = 1
#: characters of a payload shown by ``show`` before it is cut
PAYLOAD_PREVIEW_CHARS = 2000
#: widest cell of a free-text column (messages, titles)
TEXT_COLUMN_CHARS = 60


# --- text helpers --------------------------------------------------------------------


def _clean(value: Any) -> str:
    """One line of printable text: control characters (ANSI escapes too) are escaped."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Plain aligned text: a header, a rule, one line per row (cells made printable)."""
    cells = [[_clean(c) for c in row] for row in rows]
    widths = [max([_width(h)] + [_width(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        padded = (v + " " * (w - _width(v)) for v, w in zip(values, widths, strict=False))
        return "  ".join(padded).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


def _seconds(value: float | None) -> str:
    """Seconds as "0.216ms" (under a second: a step's no-op is a fraction of a
    millisecond, which "0.000s" hid), "4.200s", "75s"; "-" for none."""
    if value is None:
        return "-"
    ms = value * 1000
    if ms < 999.5:
        return f"{ms:.3g}ms" if ms < 100 else f"{ms:.0f}ms"
    return f"{value:.3f}s" if value < 60 else f"{value:.0f}s"


def _output_json(text: str | None) -> str:
    """A stored payload whole, as one line of JSON a script can read (``start --wait``):
    never cut, never decrypted (secrets redacted), ASCII-escaped so that no character
    can reach the terminal raw. ``null`` for no payload."""
    try:
        return json.dumps(codec.decode_for_display(text), ensure_ascii=True, default=str)
    except ValueError as exc:
        return f"(unreadable payload: {exc})"


def _display(text: str | None) -> str:
    """A stored payload as compact JSON for humans: never decrypted, cut when long."""
    if text is None:
        return "-"
    try:
        shown = json.dumps(codec.decode_for_display(text), ensure_ascii=False, default=str)
    except ValueError as exc:
        return f"(unreadable payload: {exc})"
    if len(shown) > PAYLOAD_PREVIEW_CHARS:
        shown = (
            shown[:PAYLOAD_PREVIEW_CHARS]
            + f"… ({len(shown)} characters; the admin shows all of it)"
        )
    return _clean(shown)


#: the largest JSON an option takes, in bytes (the codec's payload limit applies after)
MAX_INPUT_BYTES = 16 * 1_048_576


def _parse_json(text: str, option: str) -> Any:
    """Strict JSON (no NaN/Infinity; size and depth bounded before parsing,
    :func:`durable.values.jsontext.loads_bounded`) or a user error naming the option."""
    try:
        return loads_bounded(text, what=option, max_bytes=MAX_INPUT_BYTES)
    except JSONInputError as exc:
        hint = (
            f" Quote keys and strings with double quotes, e.g. {option} '{{\"a\": 1}}'."
            if exc.code == "invalid"
            else ""
        )
        raise CommandError(f"{exc}{hint}", returncode=USER_ERROR) from None
    except ValueError as exc:
        raise CommandError(
            f"{option} is not valid JSON: {exc}; use null or a number.", returncode=USER_ERROR
        ) from None


def _default_actor() -> str:
    """``os:<login name>``: who runs this command, recorded as such (a dashboard account
    of the same name is mapped to it by :func:`durable.requesters.resolve`); ``""``
    (unknown) when the process has no login name."""
    try:
        login = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        return ""
    return f"{requesters.OS_PREFIX}{login}" if login else ""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be 0 or more seconds")
    return value
