"""DurableStore: LangGraph's long-term memory in the Durable database, with TTL.

LangGraph's published store tests run in ``test_langgraph_store_published.py``; these
cover what they do not: TTL (expiry, refresh on read, the default TTL, the sweep), the
async API, and the store as a graph workflow's memory across runs.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from durable.contrib.langgraph import DurableStore, start_graph
from durable.contrib.langgraph.models import LangGraphStoreItem
from durable.models import RunStatus
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)

NS = ("memories", "u1")


def expire(key: str, *, in_minutes: float) -> None:
    LangGraphStoreItem.objects.filter(key=key).update(
        expires_at=timezone.now() + timedelta(minutes=in_minutes)
    )


def test_an_item_past_its_ttl_is_gone_and_swept():
    store = DurableStore()
    store.put(NS, "old", {"data": "old"}, ttl=5)
    store.put(NS, "kept", {"data": "kept"})  # no TTL: never expires
    row = LangGraphStoreItem.objects.get(key="old")
    assert row.ttl_minutes == 5
    assert timedelta(minutes=4) < row.expires_at - timezone.now() <= timedelta(minutes=5)
    assert LangGraphStoreItem.objects.get(key="kept").expires_at is None
    expire("old", in_minutes=-1)
    assert store.get(NS, "old") is None
    assert [i.key for i in store.search(NS)] == ["kept"]
    store.put(("other",), "gone", {"x": 1}, ttl=1)
    expire("gone", in_minutes=-1)
    assert store.list_namespaces() == [NS]
    assert store.sweep_ttl() == 2
    assert set(LangGraphStoreItem.objects.values_list("key", flat=True)) == {"kept"}


def test_a_read_renews_the_ttl_unless_told_not_to():
    store = DurableStore()
    store.put(NS, "k", {"data": 1}, ttl=10)
    expire("k", in_minutes=1)
    store.get(NS, "k", refresh_ttl=False)
    left = LangGraphStoreItem.objects.get(key="k").expires_at - timezone.now()
    assert left <= timedelta(minutes=1)
    store.get(NS, "k")  # refresh_on_read defaults to True
    left = LangGraphStoreItem.objects.get(key="k").expires_at - timezone.now()
    assert left > timedelta(minutes=9)
    expire("k", in_minutes=1)
    store.search(NS)
    left = LangGraphStoreItem.objects.get(key="k").expires_at - timezone.now()
    assert left > timedelta(minutes=9)


def test_the_default_ttl_and_refresh_come_from_the_ttl_config():
    store = DurableStore(ttl={"default_ttl": 30, "refresh_on_read": False})
    store.put(NS, "k", {"data": 1})
    assert LangGraphStoreItem.objects.get(key="k").ttl_minutes == 30
    expire("k", in_minutes=1)
    store.get(NS, "k")
    left = LangGraphStoreItem.objects.get(key="k").expires_at - timezone.now()
    assert left <= timedelta(minutes=1)
    store.put(NS, "forever", {"data": 2}, ttl=None)
    # an explicit None: this item does not expire, whatever the default
    assert LangGraphStoreItem.objects.get(key="forever").expires_at is None


def test_the_async_api_reads_and_writes_the_same_rows():
    store = DurableStore()

    async def main():
        try:
            await store.aput(NS, "a", {"data": "async"})
            item = await store.aget(NS, "a")
            found = await store.asearch(("memories",), filter={"data": "async"})
            names = await store.alist_namespaces(prefix=("memories",))
            await store.adelete(NS, "a")
            return item, found, names, await store.aget(NS, "a")
        finally:
            await sync_to_async(connections.close_all)()

    item, found, names, after = asyncio.run(main())
    assert item.value == {"data": "async"} and item.namespace == NS
    assert [i.key for i in found] == ["a"]
    assert names == [NS]
    assert after is None


def test_a_graph_remembers_across_runs(lg_workflows):
    """Persistence page, "Memory store": a node reads and writes ``runtime.store``; the
    next run of the user sees the first run's memory, another user's does not."""
    first = drive(start_graph("lg.memory", {"message": "likes tea"}, context={"user_id": "u1"}).id)
    assert first.status == RunStatus.SUCCEEDED, first.error
    assert first.output_value()["seen"] == []
    second = drive(
        start_graph("lg.memory", {"message": "hates rain"}, context={"user_id": "u1"}).id
    )
    assert second.output_value()["seen"] == ["likes tea"]
    other = drive(start_graph("lg.memory", {"message": "hi"}, context={"user_id": "u2"}).id)
    assert other.output_value()["seen"] == []
    row = LangGraphStoreItem.objects.get(namespace="memories.u1", key="likes tea")
    assert row.ttl_minutes == 60 * 24 * 30  # the workflow's store's default TTL
