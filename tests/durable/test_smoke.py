from __future__ import annotations

from decimal import Decimal

import pytest

import durable
from durable.models import RunStatus, Step
from durable.testing import drive
from tests import workflows as wf

pytestmark = pytest.mark.django_db(transaction=True)


def test_run_completes_and_replays():
    wf.CALLS.clear()
    run = durable.start("tests.add_twice", {"a": 1, "b": 2})
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"result": 5}
    assert [c[0] for c in wf.CALLS] == ["add", "add"]
    step_ids = Step.objects.filter(run=run).values_list("step_id", flat=True)
    assert list(step_ids) == ["first", "second"]


def test_values_round_trip():
    run = drive(durable.start("tests.values", None).id)
    out = run.output_value()
    assert type(out["price"]) is Decimal and str(out["price"]) == "19.90"
    assert out["raw"] == b"\x00\xff" and out["pairs"] == {(1, 2), (3, 4)}
