"""The tables of :class:`~durable.contrib.langgraph.DurableSaver`.

Three tables, as LangGraph's own PostgreSQL saver has: one row per checkpoint (the
checkpoint without its channel values, and its metadata), one per channel value and
version (a *blob*: a channel's value is stored once per version, not once per
checkpoint), and one per pending write of a task. Every payload is the
``(type, bytes)`` pair of the saver's serializer, stored as it is (``BinaryField``),
encrypted where it holds a secret (see :mod:`durable.contrib.langgraph.serde`).

No LangGraph import here: the app can be installed before the ``langgraph`` extra.
"""

from __future__ import annotations

from django.db import models


class LangGraphCheckpoint(models.Model):
    """One checkpoint of a thread in a namespace (``""`` is the root graph)."""

    thread_id = models.TextField()
    checkpoint_ns = models.TextField(default="", blank=True)
    checkpoint_id = models.CharField(max_length=64)
    parent_checkpoint_id = models.CharField(max_length=64, null=True, blank=True)
    # the metadata's run_id (LangGraph's run, not necessarily a Durable run), for
    # delete_for_runs; empty when the metadata has none
    run_id = models.TextField(default="", blank=True)
    type = models.CharField(max_length=100)
    checkpoint = models.BinaryField()
    metadata_type = models.CharField(max_length=100)
    metadata = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread_id", "checkpoint_ns", "checkpoint_id"],
                name="lg_checkpoint_unique",
            )
        ]
        indexes = [models.Index(fields=["run_id"], name="lg_checkpoint_run")]

    def __str__(self) -> str:
        return f"{self.thread_id} {self.checkpoint_ns!r} {self.checkpoint_id}"


class LangGraphBlob(models.Model):
    """The value of one channel at one version (``type == "empty"``: no value)."""

    thread_id = models.TextField()
    checkpoint_ns = models.TextField(default="", blank=True)
    channel = models.TextField()
    version = models.CharField(max_length=100)
    type = models.CharField(max_length=100)
    blob = models.BinaryField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread_id", "checkpoint_ns", "channel", "version"],
                name="lg_blob_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.thread_id} {self.checkpoint_ns!r} {self.channel}@{self.version}"


class LangGraphWrite(models.Model):
    """A pending write of a task made against a checkpoint (``idx`` < 0: special)."""

    thread_id = models.TextField()
    checkpoint_ns = models.TextField(default="", blank=True)
    checkpoint_id = models.CharField(max_length=64)
    task_id = models.TextField()
    task_path = models.TextField(default="", blank=True)
    idx = models.IntegerField()
    channel = models.TextField()
    type = models.CharField(max_length=100)
    blob = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                name="lg_write_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.thread_id} {self.checkpoint_id} {self.task_id}[{self.idx}]"


class LangGraphStoreItem(models.Model):
    """One item of :class:`~durable.contrib.langgraph.store.DurableStore` (LangGraph's
    long-term memory): a JSON ``value`` under ``namespace`` (its labels joined by
    ``"."``, which a label cannot hold) and ``key``. ``expires_at``: when a TTL was
    given, the time after which the item is gone (``ttl_minutes`` renews it on reads
    that refresh it)."""

    namespace = models.TextField()
    key = models.TextField()
    value = models.JSONField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    ttl_minutes = models.FloatField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "key"], name="lg_store_item_unique")
        ]
        indexes = [models.Index(fields=["expires_at"], name="lg_store_item_expires")]

    def __str__(self) -> str:
        return f"{self.namespace} {self.key}"
