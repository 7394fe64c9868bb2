"""The runs list's filters, parsed once for the dashboard's form and the API."""

from __future__ import annotations

import datetime as dt

import pytest

from durable.queries.filters import FIELDS, RunFilters, parse_filters


def test_valid_filters_are_parsed_and_text_is_stripped():
    filters, errors = parse_filters(
        {
            "q": "  refund  ",
            "status": "failed",
            "workflow": "shop.refund",
            "created_from": "2026-11-01",
            "waiting_minutes": "5",
            "retries": "2.0",
            "sort": "-duration",
        }
    )
    assert errors == {}
    assert filters == RunFilters(
        q="refund",
        status="failed",
        workflow="shop.refund",
        created_from=dt.date(2026, 11, 1),
        waiting_minutes=5,
        retries=2,
        sort="-duration",
    )


def test_missing_and_empty_filters_are_the_defaults():
    assert parse_filters({}) == (RunFilters(), {})
    assert parse_filters({name: "" for name in FIELDS}) == (RunFilters(), {})


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("status", "nope", "Select a valid choice. nope is not one of the available choices."),
        ("sort", "size", "Select a valid choice. size is not one of the available choices."),
        ("q", "x" * 201, "Ensure this value has at most 200 characters (it has 201)."),
        ("version", "a\x00b", "Null characters are not allowed."),
        ("workflow", "shop\x00", "The workflow contains a NUL character."),
        ("created_from", "2026-13-40", "Enter a valid date."),
        ("created_to", "0001-01-01", "The date must be between the years 1900 and 9000."),
        ("waiting_minutes", "x", "Enter a whole number."),
        ("waiting_minutes", "0", "Ensure this value is greater than or equal to 1."),
        ("retries", "1000001", "Ensure this value is less than or equal to 1000000."),
    ],
)
def test_an_invalid_filter_is_named_with_its_message_and_left_out(name, value, message):
    filters, errors = parse_filters({name: value, "status": "failed"} | {name: value})
    assert errors == {name: message}
    assert getattr(filters, name) == getattr(RunFilters(), name)
    if name != "status":
        assert filters.status == "failed"  # the valid ones still apply
