"""LangGraph's long-term memory (a ``BaseStore``) in the Durable database, with TTL.

:class:`DurableStore` keeps items in :class:`~durable.contrib.langgraph.models.
LangGraphStoreItem` rows (the Django database: SQLite or PostgreSQL), so memory written
by one graph run is read by the next, on any worker. It implements LangGraph's store
contract -- ``get``/``put``/``delete``/``search``/``list_namespaces`` and their async
twins through ``batch``/``abatch`` -- with TTL (``supports_ttl``), and without a vector
index: a search's ``query`` is ignored, as by LangGraph's ``InMemoryStore`` without
``index``. Reads in one batch see the store as it was before the batch's writes (as the
``InMemoryStore`` does); the batch's writes are applied in one transaction, the last
write of a key winning. A search ``filter`` compares values as LangGraph's stores do
(equality, ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``); a dotted key is a
path into nested dicts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base import validate_op_namespace as _validate_op
from langgraph.store.memory import _compare_values, _does_match

from durable.contrib.langgraph.models import LangGraphStoreItem
from durable.contrib.langgraph.saver import _thread_connection

__all__ = ["DurableStore"]

SEP = "."  # a namespace label cannot hold a period (LangGraph refuses it)
#: filter keys LangGraph's SQL stores accept (a dotted key is a path into nested dicts)
FILTER_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


class DurableStore(BaseStore):
    """A LangGraph ``BaseStore`` over Django models, with TTL.

    ``ttl``: LangGraph's ``TTLConfig`` -- ``default_ttl`` (minutes) for a ``put`` that
    gives none, ``refresh_on_read`` (default ``True``: a read renews an item's TTL).
    An item past its TTL is never returned; :meth:`sweep_ttl` deletes such rows.
    Raises LangGraph's ``InvalidNamespaceError`` for a bad namespace and ``ValueError``
    for an unknown operation or filter operator.
    """

    supports_ttl = True

    def __init__(self, *, ttl: TTLConfig | None = None) -> None:
        self.ttl_config = ttl

    def setup(self) -> None:
        """Nothing to do: the table comes with Durable's migrations (``manage.py
        migrate``). Here so code written for LangGraph's SQL stores runs unchanged."""

    # --- the contract: batch / abatch ------------------------------------------------

    @_thread_connection  # a node in LangGraph's pool thread: close that thread's connection
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order; returns one result per op (``None`` for a put)."""
        ops = list(ops)
        for op in ops:
            _validate_op(op)
        now = timezone.now()
        results: list[Result] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        refresh: set[int] = set()
        for op in ops:
            if isinstance(op, GetOp):
                row = self._live().filter(namespace=_join(op.namespace), key=op.key).first()
                if row is not None and op.refresh_ttl:
                    refresh.add(row.pk)
                results.append(_item(row) if row is not None else None)
            elif isinstance(op, SearchOp):
                rows = self._search(op)
                if op.refresh_ttl:
                    refresh.update(r.pk for r in rows)
                results.append([_item(r, search=True) for r in rows])
            elif isinstance(op, ListNamespacesOp):
                results.append(self._namespaces(op))
            elif isinstance(op, PutOp):
                puts[(op.namespace, op.key)] = op
                results.append(None)
            else:
                raise ValueError(f"DurableStore: unknown operation {type(op).__name__}")
        if refresh or puts:
            with transaction.atomic():
                self._refresh(refresh, now)
                for op in puts.values():
                    self._put(op, now)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` on Django's sync thread."""
        return await sync_to_async(self.batch)(list(ops))

    @_thread_connection
    def sweep_ttl(self) -> int:
        """Delete the items past their TTL; returns how many."""
        deleted, _ = LangGraphStoreItem.objects.filter(expires_at__lte=timezone.now()).delete()
        return deleted

    async def asweep_ttl(self) -> int:
        """:meth:`sweep_ttl` on Django's sync thread."""
        return await sync_to_async(self.sweep_ttl)()

    # --- helpers -------------------------------------------------------------------

    @staticmethod
    def _live() -> Any:
        return LangGraphStoreItem.objects.filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
        )

    def _search(self, op: SearchOp) -> list[LangGraphStoreItem]:
        prefix = tuple(op.namespace_prefix)
        for name in op.filter or {}:
            if not isinstance(name, str) or not FILTER_KEY.match(name):
                raise ValueError(
                    f"Invalid filter key: {name!r}. Filter keys must contain only "
                    "alphanumeric characters, underscores, dots, and hyphens."
                )
        rows = self._live()
        if prefix:
            text = _join(prefix)
            # a superset (LIKE is case-insensitive on SQLite): checked exactly below
            rows = rows.filter(Q(namespace=text) | Q(namespace__startswith=text + SEP))
        rows = rows.order_by("-updated_at", "namespace", "key")
        kept = []
        start, stop = max(op.offset, 0), max(op.offset, 0) + max(op.limit, 0)
        for row in rows.iterator():
            if _split(row.namespace)[: len(prefix)] != prefix:
                continue
            if op.filter and not all(
                _compare_values(_lookup(row.value, k), v) for k, v in op.filter.items()
            ):
                continue
            kept.append(row)
            if len(kept) >= stop:
                break
        return kept[start:stop]

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        names = {_split(n) for n in self._live().values_list("namespace", flat=True).distinct()}
        if op.match_conditions:
            names = {n for n in names if all(_does_match(c, n) for c in op.match_conditions)}
        if op.max_depth is not None:
            names = {n[: op.max_depth] for n in names}
        return sorted(names)[op.offset : op.offset + op.limit]

    @staticmethod
    def _refresh(pks: set[int], now: datetime) -> None:
        for row in LangGraphStoreItem.objects.filter(pk__in=pks, ttl_minutes__isnull=False):
            assert row.ttl_minutes is not None
            row.expires_at = now + timedelta(minutes=row.ttl_minutes)
            row.save(update_fields=["expires_at"])

    def _put(self, op: PutOp, now: datetime) -> None:
        namespace = _join(op.namespace)
        if op.value is None:
            LangGraphStoreItem.objects.filter(namespace=namespace, key=op.key).delete()
            return
        ttl = op.ttl  # put() applied the default TTL; None: the item does not expire
        expires = now + timedelta(minutes=ttl) if ttl is not None else None
        row = LangGraphStoreItem.objects.select_for_update().filter(namespace=namespace, key=op.key)
        updated = row.update(
            value=dict(op.value), updated_at=now, ttl_minutes=ttl, expires_at=expires
        )
        if not updated:
            LangGraphStoreItem.objects.create(
                namespace=namespace,
                key=op.key,
                value=dict(op.value),
                created_at=now,
                updated_at=now,
                ttl_minutes=ttl,
                expires_at=expires,
            )


def _lookup(value: Any, key: str) -> Any:
    """``value[key]``, or along a dotted path (``"user.name"``) when there is no such key."""
    if not isinstance(value, dict):
        return None
    if key in value or SEP not in key:
        return value.get(key)
    for part in key.split(SEP):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _join(namespace: Iterable[str]) -> str:
    return SEP.join(namespace)


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split(SEP)) if text else ()


def _item(row: LangGraphStoreItem, *, search: bool = False) -> Item:
    fields = dict(
        namespace=_split(row.namespace),
        key=row.key,
        value=row.value,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )
    return SearchItem(**fields) if search else Item(**fields)
