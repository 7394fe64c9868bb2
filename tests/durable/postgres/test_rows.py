"""``durable.postgres.rows``: the one-statement paths write what the ORM would write.

``values`` takes shortcuts for the common values (a plain field's own type as it is, an
enum member as its ``str``, a storable text through ``storable_text`` alone) and
``unsaved`` builds an instance positionally; both must give exactly what Django's own
preparation and ``Model(**fields)`` give, for ordinary and awkward values alike."""

from __future__ import annotations

import warnings
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from durable.models.operations import Operation
from durable.models.steps import Step
from durable.postgres import rows
from durable.vocabulary import StepKind, StepStatus


def _orm_values(instance):
    """What Django's ``SQLInsertCompiler`` sends for ``instance`` (pre_save, then
    get_db_prep_save), in ``rows.columns`` order."""
    return [
        f.get_db_prep_save(f.pre_save(instance, True), connection)
        for f in rows.insert_fields(type(instance))
    ]


def _comparable(values):
    # an enum member and its str are the same text to the database; JSON adapters
    # compare by what they dump
    out = []
    for v in values:
        if hasattr(v, "obj"):  # psycopg's Jsonb wrapper
            v = ("json", v.obj)
        elif isinstance(v, str):
            v = ("str", str.__str__(v))
        out.append(v)
    return out


NOW = timezone.now()

AWKWARD = [
    {},  # every default
    {"kind": StepKind.LLM, "status": StepStatus.SUCCEEDED},  # enum members
    {"kind": "tool", "status": "failed"},  # their plain values
    {"step_id": "a\x00b", "tool_name": "t\ud800ool", "input": "\x00", "output": "ü\udfff"},
    {"input": None, "output": None, "error": None, "next_attempt_at": None},
    {"error": {"x": float("nan"), "k\x00": [1, 2**80], "kind": StepKind.TOOL}},
    {"started_at": datetime(2026, 1, 2, 3, 4, 5), "finished_at": NOW + timedelta(seconds=1)},
    {"attempts": True, "budget_base": 3, "position": 7},  # a bool in an integer column
]


ON_POSTGRESQL = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="the one-statement paths, and their values, are PostgreSQL's",
)


@ON_POSTGRESQL
@pytest.mark.django_db
@pytest.mark.parametrize("fields", AWKWARD)
def test_a_steps_values_are_what_the_orm_prepares(fields):
    base = {"run_id": "r-1", "step_id": "s#1", "position": 0, "status": "succeeded"}
    step = Step(**{**base, **fields})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a naive datetime, on purpose
        ours, django = rows.values(step), _orm_values(step)
    assert _comparable(ours) == _comparable(django)


@ON_POSTGRESQL
@pytest.mark.django_db
def test_an_operations_values_are_what_the_orm_prepares():
    op = Operation(
        run_id="r-1",
        step_id="s\x00#1",
        tool_name="pay",
        idempotency_key="r-1:s#1",
        params={"amount": 5, "note": "ü\x00"},
    )
    assert _comparable(rows.values(op)) == _comparable(_orm_values(op))


@pytest.mark.parametrize("fields", AWKWARD)
def test_an_unsaved_step_is_the_one_keywords_build(fields):
    given = {"run_id": "r-1", "step_id": "s#1", "position": 0, **fields}
    ours, django = rows.unsaved(Step, **given), Step(**given)
    for f in Step._meta.concrete_fields:
        if f.name == "started_at" and "started_at" not in fields:  # timezone.now, called
            assert isinstance(getattr(ours, f.attname), datetime)
            continue
        assert getattr(ours, f.attname) == getattr(django, f.attname), f.name
    assert ours._state.adding and ours.pk is None


def test_unsaved_calls_a_callable_default_per_instance():
    a, b = rows.unsaved(Step, run_id="r", step_id="a"), rows.unsaved(Step, run_id="r")
    assert a.started_at is not b.started_at or a.started_at == b.started_at
    assert b.step_id == Step().step_id  # a constant default, as keywords give it


def test_unsaved_refuses_a_name_that_is_no_fields_attribute():
    with pytest.raises(TypeError, match="run"):
        rows.unsaved(Step, run="r-1")  # the relation's name, not its attribute
    with pytest.raises(TypeError, match="nope"):
        rows.unsaved(Step, nope=1)


@ON_POSTGRESQL
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("status", "succeeded"),
        ("result", '{"ok": "n\\u0000ul"}'),
        ("result", "raw \x00 nul and \udcff"),
        ("result", None),
        ("updated_at", NOW),
        ("external_id", "ch_1\x00"),
        ("resolution", ""),
        ("params", {"x": float("inf")}),
    ],
)
def test_an_update_value_is_what_the_orm_prepares(name, value):
    from durable.vocabulary import OperationStatus

    if name == "status":
        value = OperationStatus.SUCCEEDED  # an enum member, as the ledger passes it
    field = Operation._meta.get_field(name)
    assert _comparable([rows.prepared(Operation, name, value)]) == _comparable(
        [field.get_db_prep_save(value, connection)]
    )


def test_unsaved_sends_the_init_signals_when_a_receiver_listens():
    from django.db.models.signals import post_init

    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.step_id)

    post_init.connect(receiver, sender=Step)
    try:
        step = rows.unsaved(Step, run_id="r-1", step_id="heard")
    finally:
        post_init.disconnect(receiver, sender=Step)
    assert seen == ["heard"] and step.step_id == "heard"
    quiet = rows.unsaved(Step, run_id="r-1", step_id="unheard")
    assert seen == ["heard"] and quiet.step_id == "unheard"


def test_an_unsaved_step_saves_and_relates_as_one_built_by_keywords():
    from django.db.models.base import ModelState

    step = rows.unsaved(Step, run_id="r-1", step_id="s")
    assert isinstance(step._state, ModelState) and step._state.adding
    assert step._state.db is None and step.pk is None
    assert step.run_id == "r-1" and not Step.run.is_cached(step)
