"""The column list the one-statement paths share with the ORM paths beside them.

A one-statement path inserts the row the ORM path would create: it takes an unsaved
model instance (built by the same code the ORM path saves) and writes every concrete
column but the id, each value prepared as ``Model.objects.create`` prepares it
(``Field.pre_save`` then ``Field.get_db_prep_save``, Django's ``SQLInsertCompiler``). A
column added to the model is written by both paths, with no list to keep in step.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection
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


def values(instance: Model) -> list[Any]:
    """The insert values of an unsaved ``instance``, in :func:`columns`' order, as the
    ORM prepares them for this connection."""
    return [
        f.get_db_prep_save(f.pre_save(instance, True), connection)
        for f in insert_fields(type(instance))
    ]
