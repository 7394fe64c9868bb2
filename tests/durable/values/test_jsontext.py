"""The bounded JSON loader every outside JSON goes through (forms, edits, the CLI)."""

from __future__ import annotations

import pytest

from durable.values.jsontext import JSONInputError, loads_bounded, nesting_exceeds


def test_deep_nesting_is_refused_before_parsing():
    text = "[" * 10_000 + "]" * 10_000  # json.loads would raise RecursionError
    with pytest.raises(JSONInputError, match="The edit is nested deeper than 64 levels") as exc:
        loads_bounded(text, what="The edit")
    assert exc.value.code == "too_deep"


def test_brackets_inside_strings_do_not_count():
    text = '{"a": "' + "[" * 500 + '\\"' + '"}'
    assert not nesting_exceeds(text, 2)
    assert loads_bounded(text) == {"a": "[" * 500 + '"'}


def test_size_is_counted_in_utf8_bytes():
    with pytest.raises(JSONInputError, match="larger than 10 bytes") as exc:
        loads_bounded('"ééééé"', max_bytes=10)  # 7 characters, 12 bytes
    assert exc.value.code == "too_large"


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}', "{a: 1}", ""])
def test_non_json_is_refused_with_the_reason(text):
    with pytest.raises(JSONInputError, match="^--input is not valid JSON: ") as exc:
        loads_bounded(text, what="--input")
    assert exc.value.code == "invalid"


def test_cli_input_goes_through_the_bounded_loader():
    from django.core.management.base import CommandError

    from durable.management.commands.durable import _parse_json

    with pytest.raises(CommandError, match="--input is nested deeper than 64 levels"):
        _parse_json("[" * 5000 + "]" * 5000, "--input")
    assert _parse_json('{"a": [1, 2]}', "--input") == {"a": [1, 2]}
