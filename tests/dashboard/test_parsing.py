"""Strict parsing (durable/queries/parsing.py) and the malformed inputs that used to be 500s."""

from __future__ import annotations

import base64
import json

import pytest
from django.core.exceptions import ValidationError

import durable
from dashboard.selectors import decode_cursor
from durable.models import Operation, Step
from durable.queries.parsing import BadParameter, load_json, parse_int
from durable.testing import drive
from tests.dashboard import dash_workflows as dw
from tests.dashboard.conftest import HTMX


@pytest.mark.parametrize(
    "text", ["²", "1²", "٣", "१२", "𝟙", "-1", " 1", "1 ", "+1", "1.0", "0x1", "9" * 19]
)
def test_parse_int_accepts_only_bounded_ascii_digits(text):
    with pytest.raises(BadParameter):
        parse_int(text)


def test_parse_int_bounds_and_empties():
    assert parse_int(None) is None and parse_int("") is None
    assert parse_int("007") == 7
    with pytest.raises(BadParameter, match="between 1 and 5"):
        parse_int("6", minimum=1, maximum=5)


@pytest.mark.parametrize("text", ["[" * 10_000 + "]" * 10_000, '{"a":' * 100 + "1" + "}" * 100])
def test_load_json_refuses_deep_nesting_before_parsing(text):
    with pytest.raises(ValidationError, match="nested deeper than 64"):
        load_json(text)


def test_load_json_counts_brackets_in_strings_as_text():
    assert load_json('{"a": "' + "[" * 1000 + '"}') == {"a": "[" * 1000}


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '"\\u0000"', '{"\\ud800": 1}', "[1,"])
def test_load_json_refuses_what_cannot_be_stored(text):
    with pytest.raises(ValidationError):
        load_json(text)


def test_load_json_refuses_a_document_over_the_size_before_parsing():
    with pytest.raises(ValidationError, match="larger than 10 bytes"):
        load_json("[" + "1," * 10 + "1]", max_bytes=10)


def _cursor(value, run_id="r"):
    raw = json.dumps([value, run_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "value", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2024-01-01T00:00:00", 17]
)
def test_a_created_cursor_out_of_range_is_ignored(value):
    assert decode_cursor(_cursor(value), "created") is None


def test_a_duration_cursor_must_be_a_bounded_int():
    assert decode_cursor(_cursor(10**30), "duration") is None
    assert decode_cursor(_cursor("5"), "duration") is None
    assert decode_cursor(_cursor(5), "duration")[0].microseconds == 5


@pytest.mark.django_db(transaction=True)
def test_the_known_malformed_requests_answer_4xx_with_a_message(viewer_client, operator_client):
    dw.KNOBS["unknown"] = 1
    run = drive(durable.start("dash.echo", {"n": 1}, version="1").id)
    transfer = drive(durable.start("dash.transfer", {"amount": 1}).id)
    step = Step.objects.filter(run=run).first()

    response = viewer_client.get(f"/runs/{run.id}/steps/?after=²")
    assert response.status_code == 400
    assert "digits 0-9" in response.content.decode()
    assert viewer_client.get(f"/runs/{run.id}/payload/step-output/²/").status_code == 404
    assert viewer_client.get(f"/runs/{run.id}/payload/step-output/{step.pk}/").status_code == 200
    for value in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        assert viewer_client.get("/", {"after": _cursor(value)}).status_code == 200
        assert viewer_client.get("/", {"before": _cursor(value)}).status_code == 200
    response = viewer_client.get("/", {"created_from": "0001-01-01", "created_to": "9999-12-31"})
    assert response.status_code == 200
    assert "between the years 1900 and 9000" in response.content.decode()

    op = Operation.objects.get(run=transfer)
    deep = "[" * 10_000 + "]" * 10_000
    response = operator_client.post(
        f"/operations/{op.pk}/reconcile/", {"outcome": "happened", "result": deep}, **HTMX
    )
    assert response.status_code == 422
    assert "nested deeper than 64 levels" in response.content.decode()
    Operation.objects.get(pk=op.pk, status=op.status)  # nothing changed
