"""A ``values_list`` query of one parameter, its SQL compiled once a process and database.

The ORM builds and compiles a query's SQL at every call (~0.5 ms of CPU for the API's
token lookup or a run's steps); the hot reads of the API compile it once, with a
stand-in for the parameter, and run that SQL with each call's value, converting the
columns with the converters Django's compiler gives (``SQLCompiler.get_converters``:
JSON, SQLite's datetimes...), as ``values_list`` would. When the SQL cannot be reused --
two builds differ, or the stand-in is not exactly one parameter -- the ORM runs the
query each time. tests/api/test_read_cost.py and tests/api/test_auth.py hold the rows
equal to the ORM's.

On PostgreSQL the rows' datetimes are loaded by psycopg's own ``timestamptz`` loader (its
C implementation) instead of Django's (``BaseTzLoader``: psycopg's Python loader, then
``replace(tzinfo=...)``, ~2.5 us a datetime), on this query's cursor alone and only when
the two give the same values: the session's time zone is the one Django's loader sets
(:func:`_load_datetimes_in_c`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.db import connections, router
from django.db.models import Model, QuerySet

#: what stands for the parameter while the query is compiled
_VALUE = "\x00the query's parameter"

_Compiled = tuple[str, tuple[Any, ...], dict[int, Any]]


class CompiledRows:
    """``build(value)``: the ``values_list`` query of ``model`` for one ``value``;
    :meth:`rows` runs it with its SQL compiled once per database alias."""

    def __init__(self, model: type[Model], build: Callable[[Any], QuerySet]) -> None:
        self.model, self.build = model, build
        self.compiled: dict[str, _Compiled | None] = {}

    def _compile(self, alias: str) -> _Compiled:
        compiler = self.build(_VALUE).using(alias).query.get_compiler(alias)
        sql, params = compiler.as_sql()
        converters = compiler.get_converters([col for col, _, _ in compiler.select])
        # the backend's converters are methods of this connection's ``ops`` and read its
        # state (SQLite's datetimes: ``self.connection.timezone``): kept by name, taken
        # from the ``ops`` of the connection each call reads from (another thread's, or
        # one whose zone changed), as the ORM's compiler would take them
        ops = compiler.connection.ops
        converters = {
            index: (
                [f.__name__ if getattr(f, "__self__", None) is ops else f for f in functions],
                expression,
            )
            for index, (functions, expression) in converters.items()
        }
        return sql, tuple(params), converters

    def rows(self, value: Any) -> list[tuple[Any, ...]]:
        """The query's rows for ``value``, as tuples of its columns, converted as the
        ORM converts them."""
        alias = router.db_for_read(self.model)
        if alias not in self.compiled:
            first, again = self._compile(alias), self._compile(alias)
            reusable = first[:2] == again[:2] and first[1].count(_VALUE) == 1
            self.compiled[alias] = first if reusable else None
        compiled = self.compiled[alias]
        if compiled is None:
            return [tuple(row) for row in self.build(value).using(alias)]
        sql, params, converters = compiled
        connection = connections[alias]
        with connection.cursor() as cursor:
            _load_datetimes_in_c(connection, cursor)
            cursor.execute(sql, [value if p == _VALUE else p for p in params])
            found = cursor.fetchall()
        if not converters:
            return [tuple(row) for row in found]
        ops = connection.ops
        bound = [
            (
                index,
                [getattr(ops, f) if isinstance(f, str) else f for f in functions],
                expression,
            )
            for index, (functions, expression) in converters.items()
        ]
        rows = []
        for row in found:
            values = list(row)
            for index, functions, expression in bound:
                for convert in functions:
                    values[index] = convert(values[index], expression, connection)
            rows.append(tuple(values))
        return rows


class CompiledModel:
    """``model``'s instance by one ``value`` of its field ``lookup``, with the row of its
    foreign key ``related`` read with it: ``model.objects.select_related(related)
    .filter(**{lookup: value}).first()`` for a unique ``lookup``, its SQL compiled once
    (:class:`CompiledRows`) and the two models built from the row with
    ``Model.from_db``, as the ORM builds them (a null key: the relation cached as
    ``None``, as ``select_related`` caches it)."""

    def __init__(self, model: type[Model], lookup: str, related: str) -> None:
        self.model, self.lookup, self.related = model, lookup, related
        self.rows = CompiledRows(model, self._query)

    @functools.cached_property
    def columns(self) -> tuple[list[str], type[Model], list[str]]:
        """``(model's columns, related model, its columns)``, in their fields' order."""
        related = self.model._meta.get_field(self.related).related_model
        assert isinstance(related, type) and issubclass(related, Model)
        return (
            [f.attname for f in self.model._meta.concrete_fields],
            related,
            [f.attname for f in related._meta.concrete_fields],
        )

    def _query(self, value: Any) -> QuerySet:
        columns, _, related_columns = self.columns
        return (
            self.model._default_manager.filter(**{self.lookup: value})
            .order_by()
            .values_list(*columns, *(f"{self.related}__{c}" for c in related_columns))
        )

    def get(self, value: Any) -> Any:
        """The instance (its ``related`` read with it), or ``None``."""
        found = self.rows.rows(value)
        if not found:
            return None
        columns, related_model, related_columns = self.columns
        alias = router.db_for_read(self.model)
        n = len(columns)
        instance = self.model.from_db(alias, columns, found[0][:n])
        other = None
        # no related row (a null key): its primary key reads null, as select_related sees
        if found[0][n + related_columns.index(related_model._meta.pk.attname)] is not None:
            other = related_model.from_db(alias, related_columns, found[0][n:])
        field: Any = self.model._meta.get_field(self.related)
        field.set_cached_value(instance, other)
        return instance


def _load_datetimes_in_c(connection: Any, cursor: Any) -> None:
    """Have ``cursor`` (Django's wrapper of a psycopg 3 cursor) load ``timestamptz``
    values with psycopg's loader, whose C implementation is ~10 times Django's.

    Django's loader (``django.db.backends.postgresql.psycopg_any.BaseTzLoader``) is
    psycopg's Python ``TimestamptzLoader``, whose datetime is in the session's time zone,
    then ``replace(tzinfo=connection.timezone)``: when the session's zone is that very
    object (Django sets the session to it: UTC, ``timezone.utc``, for this project) the
    replace changes nothing, and psycopg's loader alone gives the same datetimes, their
    ``tzinfo`` included. Otherwise (``USE_TZ`` off: naive datetimes; a session whose
    zone was changed) Django's loader stays. Registered on this cursor's adapters only:
    the project's other queries keep Django's loader."""
    if connection.vendor != "postgresql":
        return
    raw: Any = getattr(cursor, "cursor", None)
    adapters = getattr(raw, "adapters", None)
    if adapters is None or raw.connection.info.timezone is not connection.timezone:
        return
    from psycopg.types.datetime import TimestamptzLoader

    adapters.register_loader("timestamptz", TimestamptzLoader)
