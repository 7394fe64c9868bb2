"""The column list the one-statement paths share with the ORM paths beside them.

A one-statement path inserts the row the ORM path would create: it takes an unsaved
model instance (built by the same code the ORM path saves) and writes every concrete
column but the id, each value prepared as ``Model.objects.create`` prepares it
(``Field.pre_save`` then ``Field.get_db_prep_save``, Django's ``SQLInsertCompiler``). A
column added to the model is written by both paths, with no list to keep in step.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models import Field, Model


@cache
def insert_fields(model: type[Model]) -> tuple[Field, ...]:
    """Every concrete field of ``model`` but the primary key, in the model's order."""
    return tuple(f for f in model._meta.concrete_fields if not f.primary_key)


def columns(model: type[Model]) -> str:
    """``"run_id, step_id, ..."``: the insert columns of ``model``."""
    return ", ".join(f.column for f in insert_fields(model))


def typed_marks(model: type[Model]) -> str:
    """``"%s::varchar(255), %s::integer, ..."``: a typed placeholder a column (a ``VALUES``
    list or a ``SELECT`` gives PostgreSQL no column to infer the type from)."""
    # Field.cast_db_type (what Cast() uses) is missing from django-stubs
    return ", ".join(
        f"%s::{f.cast_db_type(connection)}"  # type: ignore[attr-defined]
        for f in insert_fields(model)
    )


#: Django's own fields whose prepared value is the value itself when it already has the
#: field's type (an int, a str, an aware datetime, or None): PostgreSQL's adapters take
#: them as they are. Preparing them costs ~2 us each, which a batch pays per row.
_PLAIN: dict[type[Field], tuple[type, ...]] = {
    models.IntegerField: (int,),
    models.PositiveIntegerField: (int,),
    models.CharField: (str,),
    models.DateTimeField: (datetime,),
}


@cache
def _preparers(model: type[Model]) -> tuple[tuple[Field, tuple[type, ...] | None], ...]:
    """Each insert field with the types it passes as they are (None: always prepared)."""
    out = []
    for f in insert_fields(model):
        plain = _PLAIN.get(type(f))
        if isinstance(f, models.DateTimeField) and (f.auto_now or f.auto_now_add):
            plain = None  # pre_save sets the time
        out.append((f, plain))
    return tuple(out)


def values(instance: Model) -> list[Any]:
    """The insert values of an unsaved ``instance``, in :func:`columns`' order, as the
    ORM prepares them for this connection (``Field.pre_save`` then
    ``Field.get_db_prep_save``; a value of a plain field's own type as it is)."""
    out: list[Any] = []
    db = connections[DEFAULT_DB_ALIAS]  # not the proxy: a thread-local lookup per use
    for f, plain in _preparers(type(instance)):
        if plain is not None:
            value = getattr(instance, f.attname)
            if value is None or (
                type(value) in plain and not (isinstance(value, datetime) and value.tzinfo is None)
            ):
                out.append(value)
                continue
        out.append(f.get_db_prep_save(f.pre_save(instance, True), db))
    return out
