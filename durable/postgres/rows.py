"""The column list the one-statement paths share with the ORM paths beside them.

A one-statement path inserts the row the ORM path would create: it takes an unsaved
model instance (built by the same code the ORM path saves) and writes every concrete
column but the id, each value prepared as ``Model.objects.create`` prepares it
(``Field.pre_save`` then ``Field.get_db_prep_save``, Django's ``SQLInsertCompiler``). A
column added to the model is written by both paths, with no list to keep in step.
"""

from __future__ import annotations

import re
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models import Field, Model
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from durable.values.fields import StorableCharField, StorableTextField, storable_text

M = TypeVar("M", bound=Model)


@cache
def insert_fields(model: type[Model]) -> tuple[Field, ...]:
    """Every concrete field of ``model`` but the primary key, in the model's order."""
    return tuple(f for f in model._meta.concrete_fields if not f.primary_key)


_CALL = object()  # a slot whose default is called per instance


@cache
def _attnames(model: type[Model]) -> tuple[str, ...]:
    return tuple(f.attname for f in model._meta.concrete_fields)


@cache
def _init_plan(
    model: type[Model],
) -> tuple[list[Any], dict[str, int], tuple[tuple[int, Field], ...]]:
    """For :func:`unsaved`: the positional arguments with every default that is a
    constant (Django's ``get_default`` answers the same object each time), the slot of
    each attribute name, and the slots whose default is a callable."""
    template: list[Any] = []
    called: list[tuple[int, Field]] = []
    for i, f in enumerate(model._meta.concrete_fields):
        if f.has_default() and callable(f.default):
            template.append(_CALL)
            called.append((i, f))
        else:
            template.append(f.get_default())
    slots = {f.attname: i for i, f in enumerate(model._meta.concrete_fields)}
    return template, slots, tuple(called)


def unsaved(model: type[M], **fields: Any) -> M:
    """``model(**fields)``: the same unsaved instance, built in ~1.5 us instead of ~8
    (a checkpoint builds one a step). ``fields`` are named by attribute (``run_id``, not
    ``run``); a field not given gets its default, as with keywords; ``pre_init`` and
    ``post_init`` receivers of ``model``, if any, are sent as ``Model.__init__`` sends
    them. Raises ``TypeError`` naming a name that is no concrete field's attribute."""
    template, slots, called = _init_plan(model)
    args = template.copy()
    try:
        for name, value in fields.items():
            args[slots[name]] = value
    except KeyError as exc:
        raise TypeError(f"{model.__qualname__} has no concrete field attribute {exc}") from None
    for i, f in called:
        if args[i] is _CALL:
            args[i] = f.get_default()
    # the receivers' list is read first: asking has_listeners costs ~0.4 us a signal
    if (pre_init.receivers and pre_init.has_listeners(model)) or (
        post_init.receivers and post_init.has_listeners(model)
    ):
        return model(*args)
    # what Model.__init__ does with positional values and no signal receivers: a fresh
    # state and each value in the instance's dict (a field's descriptor sets it there
    # too; a foreign key's clears a cached object, which a new instance has not), at a
    # fifth of the cost
    instance = model.__new__(model)
    instance._state = ModelState()
    instance.__dict__.update(zip(_attnames(model), args, strict=True))
    return instance


def columns(model: type[Model]) -> str:
    """``"run_id, step_id, ..."``: the insert columns of ``model``."""
    return ", ".join(f.column for f in insert_fields(model))


def cast_type(field: Field) -> str:
    """The type a one-statement path casts ``field``'s value to (a ``SELECT`` gives
    PostgreSQL no column to infer it from): the column's type without a character
    length. An explicit cast to ``varchar(n)`` cuts a longer text silently (PostgreSQL's
    rule for explicit casts); the INSERT's own assignment to the column refuses it
    ("value too long"), as the ORM path's INSERT does."""
    # Field.cast_db_type (what Cast() uses) is missing from django-stubs
    db_type: str = field.cast_db_type(connection)  # type: ignore[attr-defined]
    return re.sub(r"^varchar\(\d+\)$", "varchar", db_type)


def typed_marks(model: type[Model]) -> str:
    """``"%s::varchar, %s::integer, ..."``: a typed placeholder a column
    (:func:`cast_type`)."""
    return ", ".join(f"%s::{cast_type(f)}" for f in insert_fields(model))


def _plain_types(field: Field) -> tuple[type, ...] | None:
    """The value types ``field`` stores as they are (an int in an integer column, a str
    in a char column...), or None: every value is prepared by the field."""
    if isinstance(field, models.DateTimeField):
        # pre_save sets the time of an auto field; a naive datetime is made aware
        return None if (field.auto_now or field.auto_now_add) else (datetime,)
    if type(field) in (models.IntegerField, models.PositiveIntegerField):
        return (int,)
    if type(field) is models.CharField:
        return (str,)
    if isinstance(field, models.ForeignKey):
        return _plain_types(field.target_field)
    if isinstance(field, models.JSONField):
        return ()  # None is SQL NULL (JSONField.get_db_prep_save); any other value prepared
    return None


def _storable_text_field(field: Field) -> bool:
    return type(field) in (StorableCharField, StorableTextField)


@cache
def _preparers(model: type[Model]) -> tuple[tuple[str, Field, tuple[type, ...] | None, bool], ...]:
    """Each insert field: its attribute name, the field, the value types it passes as
    they are (None: always prepared) and whether it is a storable text field (an exact
    ``str`` goes through :func:`~durable.values.fields.storable_text` alone, what its
    ``get_prep_value`` does)."""
    return tuple(
        (f.attname, f, _plain_types(f), _storable_text_field(f)) for f in insert_fields(model)
    )


_PREPARE = object()  # no shortcut: the field prepares the value


def _shortcut(plain: tuple[type, ...] | None, storable: bool, value: Any) -> Any:
    """What the field's preparation gives ``value``, where that is known without it;
    else ``_PREPARE``."""
    if plain is not None:
        t = type(value)
        if value is None or (t in plain and not (t is datetime and value.tzinfo is None)):
            return value
        if str in plain and isinstance(value, str):
            # a TextChoices member: CharField.to_python keeps it, psycopg sends its str
            # value; the plain str is the same text, on psycopg's cached dumper
            return str.__str__(value)
    elif storable:
        if value is None:
            return None
        if type(value) is str:
            return storable_text(value)
    return _PREPARE


def values(instance: Model) -> list[Any]:
    """The insert values of an unsaved ``instance``, in :func:`columns`' order, as the
    ORM prepares them for this connection (``Field.pre_save`` then
    ``Field.get_db_prep_save``), with shortcuts that give the same value at a fraction
    of the cost (a step's checkpoint pays them per row): a value of a plain field's own
    type as it is (an aware datetime, an int, a ``str``), an enum member of a char field
    as its plain ``str`` value, an exact ``str`` of a storable text field through
    ``storable_text`` only."""
    out: list[Any] = []
    db = None  # looked up at the first value the field prepares (a thread-local lookup)
    # a loaded value is in the instance's dict, where the field's descriptor reads it
    loaded = instance.__dict__
    for attname, f, plain, storable in _preparers(type(instance)):
        # _shortcut's rules, inlined: a function call per column costs a third more
        value = loaded.get(attname, _PREPARE)
        if value is _PREPARE:
            value = getattr(instance, attname)  # deferred: the descriptor loads it
        if plain is not None:
            t = type(value)
            if value is None or (t in plain and not (t is datetime and value.tzinfo is None)):
                out.append(value)
                continue
            if str in plain and isinstance(value, str):
                out.append(str.__str__(value))
                continue
        elif storable and (value is None or type(value) is str):
            out.append(value if value is None else storable_text(value))
            continue
        if db is None:
            db = connections[DEFAULT_DB_ALIAS]  # not the proxy: a lookup per use
        out.append(f.get_db_prep_save(f.pre_save(instance, True), db))
    return out


@cache
def _by_name(model: type[Model]) -> dict[str, tuple[Field, tuple[type, ...] | None, bool]]:
    return {
        f.name: (f, _plain_types(f), _storable_text_field(f)) for f in model._meta.concrete_fields
    }


def prepared(model: type[Model], name: str, value: Any) -> Any:
    """``value`` as the field ``name`` of ``model`` stores it in an UPDATE
    (``Field.get_db_prep_save``), with the shortcuts of :func:`values`. Raises
    ``KeyError`` for a name that is no concrete field's."""
    f, plain, storable = _by_name(model)[name]
    fast = _shortcut(plain, storable, value)
    if fast is not _PREPARE:
        return fast
    return f.get_db_prep_save(value, connections[DEFAULT_DB_ALIAS])
