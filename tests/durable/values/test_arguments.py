"""Checking a tool's arguments against its signature (durable/values/arguments.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from durable.values.arguments import convert_arguments, validate_arguments


def refund(charge_id: str, amount: int, *, idempotency_key: str) -> None: ...


def fields(errors) -> dict[str, str]:
    return {e.field: e.message for e in errors}


def test_types_are_strict_and_values_are_not_converted():
    assert validate_arguments(refund, {"charge_id": "ch_1", "amount": 40}) == []
    for bad in ("forty", "40", 40.5, None, True):
        assert list(fields(validate_arguments(refund, {"charge_id": "ch_1", "amount": bad}))) == [
            "amount"
        ], bad


def test_missing_unknown_and_reserved_names_are_named():
    assert fields(validate_arguments(refund, {"charge_id": "ch_1"})) == {
        "amount": "required: the tool has no default for it"
    }
    assert fields(validate_arguments(refund, {"charge_id": "c", "amount": 1, "to": "x"})) == {
        "to": "the tool takes no argument of this name"
    }
    assert list(
        fields(validate_arguments(refund, {"charge_id": "c", "amount": 1, "idempotency_key": "k"}))
    ) == ["idempotency_key"]


def test_kwargs_defaults_and_unannotated_parameters():
    def send(to, body="", **extra): ...

    assert validate_arguments(send, {"to": 1, "anything": [1]}) == []
    assert list(fields(validate_arguments(send, {}))) == ["to"]


def test_iso_text_is_a_datetime_in_json_mode():
    def book(when: datetime): ...

    assert validate_arguments(book, {"when": "2026-11-30T10:00:00Z"}) == []
    assert list(fields(validate_arguments(book, {"when": "soon"}))) == ["when"]


def test_an_unresolvable_annotation_is_not_checked():
    def odd(x: NoSuchType, n: int): ...  # noqa: F821

    assert list(fields(validate_arguments(odd, {"x": object(), "n": "1"}))) == ["n"]


def test_unchecked_names_count_as_present_whatever_their_value():
    assert (
        validate_arguments(refund, {"charge_id": object(), "amount": 1}, unchecked={"charge_id"})
        == []
    )


@dataclass
class Line:
    sku: str
    qty: int


def invoice(day: date, lines: list[Line], total: Decimal, note: str, extra: dict) -> None: ...


def test_json_values_become_the_annotated_types_when_the_tool_runs():
    sent = {
        "day": "2026-12-07",
        "lines": [{"sku": "A1", "qty": 2}],
        "total": "19.90",
        "note": "2026-12-07",
        "extra": {"day": "2026-12-07"},
    }
    got = convert_arguments(invoice, sent)
    assert got == {
        "day": date(2026, 12, 7),
        "lines": [Line("A1", 2)],
        "total": Decimal("19.90"),
        "note": "2026-12-07",  # a str parameter stays a str
        "extra": {"day": "2026-12-07"},  # JSON annotations are not touched
    }
    assert sent["day"] == "2026-12-07"  # the recorded arguments are not changed


def test_objects_and_values_that_do_not_fit_are_passed_as_given():
    lines = [Line("A1", 2)]
    assert convert_arguments(invoice, {"day": date(2026, 1, 1), "lines": lines}) == {
        "day": date(2026, 1, 1),
        "lines": lines,
    }
    assert convert_arguments(invoice, {"day": "soon", "total": "lots"}) == {
        "day": "soon",
        "total": "lots",
    }
    assert convert_arguments(len, {"x": 1}) == {"x": 1}  # no signature: unchanged
