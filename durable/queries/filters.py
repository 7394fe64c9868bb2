"""The runs list's filters: one definition of their rules, which the dashboard's filter
form and the API's ``GET /runs`` both apply (:func:`parse_filters`).

Every parameter is text as a request carries it. Free text is stripped and refused with
a NUL or over its length; a status or a sort must be one of its choices; a date is a date
(``YYYY-MM-DD`` or another of Django's ``DATE_INPUT_FORMATS``) within
:data:`~durable.queries.parsing.MIN_YEAR`..:data:`~durable.queries.parsing.MAX_YEAR`;
a number is a whole number in its range. The messages are Django's form field messages,
which the dashboard showed before the rules moved here.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from django.utils import formats

from durable.queries.parsing import BadParameter, bounded_datetime, clean_text
from durable.vocabulary import RunStatus

#: pseudo statuses of the runs filter, besides the RunStatus values
STATUS_APPROVAL = "approval"
STATUS_ATTENTION = "attention"
#: runs parked until a rate or concurrency limit admits their call (docs/limits.md)
STATUS_LIMIT = "limit"

#: (value, label) of the status filter, "" first (any status)
STATUS_CHOICES: list[tuple[str, str]] = [
    ("", "Any status"),
    *((str(value), str(label)) for value, label in RunStatus.choices),
    (STATUS_APPROVAL, "Waiting for approval"),
    (STATUS_ATTENTION, "Needs attention"),
    (STATUS_LIMIT, "Waiting for a limit"),
]

#: sort -> (the key it sorts on, descending)
SORTS = {
    "-created": ("created", True),
    "created": ("created", False),
    "-duration": ("duration", True),
    "duration": ("duration", False),
}
SORT_CHOICES = [
    ("-created", "Newest first"),
    ("created", "Oldest first"),
    ("-duration", "Longest first"),
    ("duration", "Shortest first"),
]

#: longest text accepted per text filter, in characters
TEXT_MAX = {"q": 200, "version": 64, "started_by": 150}
#: (least, most) per number filter
NUMBER_RANGE = {"waiting_minutes": (1, 10_000_000), "retries": (1, 1_000_000)}
_DECIMAL_ZEROS = re.compile(r"\.0*\s*$")


@dataclass
class RunFilters:
    status: str = ""
    workflow: str = ""
    version: str = ""
    started_by: str = ""
    created_from: Any = None  # date
    created_to: Any = None  # date
    waiting_minutes: int | None = None
    retries: int | None = None
    q: str = ""
    sort: str = "-created"
    #: list the runs the system started for itself too (``system=1``); hidden by default
    system: bool = False

    @classmethod
    def from_cleaned(cls, data: dict[str, Any]) -> RunFilters:
        known = {
            k: v for k, v in data.items() if k in cls.__dataclass_fields__ and v not in (None, "")
        }
        return cls(**known)


#: the filters in the order their errors are reported (the form's field order)
FIELDS: tuple[str, ...] = ("q", "status", "workflow", "version", "started_by")
FIELDS += ("created_from", "created_to", "waiting_minutes", "retries", "sort", "system")
#: what ``system=`` may say: on (a checkbox sends its value, "1") or off
FLAG_VALUES = {"": False, "0": False, "false": False, "1": True, "on": True, "true": True}
assert set(FIELDS) == {f.name for f in fields(RunFilters)}


def _text(name: str, value: str) -> str:
    value = value.strip()
    if "\x00" in value:
        raise BadParameter("Null characters are not allowed.")
    most = TEXT_MAX.get(name)
    if most is not None and len(value) > most:
        unit = "character" if most == 1 else "characters"
        raise BadParameter(f"Ensure this value has at most {most} {unit} (it has {len(value)}).")
    return value


def _choice(value: str, choices: list[tuple[str, str]]) -> str:
    if value and value not in {key for key, _ in choices}:
        raise BadParameter(f"Select a valid choice. {value} is not one of the available choices.")
    return value


def _date(value: str) -> dt.date | None:
    if not value:
        return None
    for pattern in formats.get_format("DATE_INPUT_FORMATS"):
        try:
            day = dt.datetime.strptime(value, pattern).date()
        except (ValueError, TypeError):
            continue
        return bounded_datetime(day, "The date")
    raise BadParameter("Enter a valid date.")


def _flag(value: str) -> bool:
    flag = FLAG_VALUES.get(value.strip().lower())
    if flag is None:
        raise BadParameter("Select a valid choice: 1 (on) or 0 (off).")
    return flag


def _number(name: str, value: str) -> int | None:
    if not value:
        return None
    try:
        number = int(_DECIMAL_ZEROS.sub("", value))
    except ValueError:
        raise BadParameter("Enter a whole number.") from None
    least, most = NUMBER_RANGE[name]
    if number < least:
        raise BadParameter(f"Ensure this value is greater than or equal to {least}.")
    if number > most:
        raise BadParameter(f"Ensure this value is less than or equal to {most}.")
    return number


def parse_filters(params: Mapping[str, Any]) -> tuple[RunFilters, dict[str, str]]:
    """The filters of ``params`` (a query dict: name -> text; missing names are empty),
    and ``{name: message}`` for each invalid one, which the filters leave out.

    The dashboard shows the messages beside the fields and lists the runs matching the
    valid filters; the API answers 422 naming them.
    """
    cleaned: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in FIELDS:
        raw = params.get(name)
        value = "" if raw is None else str(raw)
        try:
            if name in TEXT_MAX:
                cleaned[name] = _text(name, value)
            elif name == "status":
                cleaned[name] = _choice(value, STATUS_CHOICES)
            elif name == "sort":
                cleaned[name] = _choice(value, SORT_CHOICES)
            elif name in ("created_from", "created_to"):
                cleaned[name] = _date(value.strip())
            elif name in NUMBER_RANGE:
                cleaned[name] = _number(name, value)
            elif name == "system":
                cleaned[name] = _flag(value)
            else:  # the workflow: any name (a link may name one no longer registered)
                cleaned[name] = clean_text(value, "The workflow")
        except BadParameter as exc:
            errors[name] = str(exc)
    return RunFilters.from_cleaned(cleaned), errors
