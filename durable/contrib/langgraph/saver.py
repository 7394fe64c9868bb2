"""``DurableSaver``: LangGraph checkpoints in the Durable database (PostgreSQL or SQLite).

A ``BaseCheckpointSaver`` over the three models of
:mod:`durable.contrib.langgraph.models`, with every method LangGraph's checkpoint
contract has, sync and async: ``get_tuple``, ``list``, ``put``, ``put_writes``,
``delete_thread``, ``delete_for_runs``, ``copy_thread`` and ``prune``. The async
methods run the sync ones through ``asgiref.sync.sync_to_async`` (Django's ORM is
synchronous), so they are safe in an event loop.

Layout: a checkpoint row holds the checkpoint without its channel values; each channel
value is a blob row keyed by ``(thread, namespace, channel, version)``, written once
per new version (``new_versions`` of ``put``); pending writes are rows keyed by
``(thread, namespace, checkpoint, task, idx)``. Payloads are the serializer's
``(type, bytes)`` pairs (:class:`~durable.contrib.langgraph.serde.DurableSerializer`:
LangGraph's ``JsonPlusSerializer``, encrypted where a value holds a secret).

Metadata filters of ``list`` are applied in Python on the thread's (or the whole
table's) checkpoints, newest first; ``limit`` counts matches.
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal, cast

from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.db.models import Q
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)

from durable.contrib.langgraph.models import LangGraphBlob, LangGraphCheckpoint, LangGraphWrite
from durable.contrib.langgraph.serde import DurableSerializer

__all__ = ["DurableSaver"]


def _ident(value: Any, what: str) -> str:
    """A thread id, namespace, channel or task id as storable text, or a clear error."""
    if value is None:
        raise ValueError(f"DurableSaver: {what} is missing from the config")
    text = str(value)
    if "\x00" in text:
        raise ValueError(f"DurableSaver: {what} {text!r} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"DurableSaver: {what} {text!r} is not valid UTF-8") from exc
    return text


def _thread_connection(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Close the connection a helper thread opened once the call is done.

    A sync graph checkpoints from LangGraph's short-lived pool threads, and the async
    methods run in asgiref's thread: each gets its own Django connection, which nobody
    would close (a PostgreSQL session left behind per thread). The main thread, a
    worker's, keeps its connection; so does a call inside a transaction.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            if threading.current_thread() is not threading.main_thread() and not (
                connection.in_atomic_block
            ):
                connection.close()

    return wrapper


def _where(config: RunnableConfig) -> tuple[str, str]:
    configurable = config.get("configurable") or {}
    thread_id = _ident(configurable.get("thread_id"), "thread_id")
    ns = _ident(configurable.get("checkpoint_ns", "") or "", "checkpoint_ns")
    return thread_id, ns


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class DurableSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpointer storing checkpoints, blobs and writes in Django models.

    ``serde``: a LangGraph serializer (default ``JsonPlusSerializer()``; pass an
    ``EncryptedSerializer`` to encrypt everything with your own cipher); it is wrapped
    in :class:`~durable.contrib.langgraph.serde.DurableSerializer` so payloads that hold
    secrets are encrypted with Durable's key. ``encrypt="all"`` encrypts every payload.

    Needs ``"durable.contrib.langgraph"`` in ``INSTALLED_APPS`` (migrated). Raises
    ``ValueError`` for a config without ``thread_id`` or with an id that contains NUL.
    """

    def __init__(
        self,
        *,
        serde: SerializerProtocol | None = None,
        encrypt: Literal["secrets", "all"] = "secrets",
    ) -> None:
        super().__init__(serde=DurableSerializer(serde, encrypt=encrypt))

    # --- reading ------------------------------------------------------------------

    def _channel_values(self, thread_id: str, ns: str, versions: ChannelVersions) -> dict[str, Any]:
        if not versions:
            return {}
        wanted = Q()
        for channel, version in versions.items():
            wanted |= Q(channel=channel, version=str(version))
        rows = LangGraphBlob.objects.filter(wanted, thread_id=thread_id, checkpoint_ns=ns)
        values: dict[str, Any] = {}
        for row in rows.only("channel", "type", "blob"):
            if row.type != "empty":
                values[row.channel] = self.serde.loads_typed((row.type, bytes(row.blob or b"")))
        return values

    def _pending_writes(
        self, thread_id: str, ns: str, checkpoint_id: str
    ) -> list[tuple[str, str, Any]]:
        rows = list(
            LangGraphWrite.objects.filter(
                thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
            )
        )
        rows.sort(key=lambda r: writes_sort_key(r.task_path, r.task_id, r.idx))
        return [
            (r.task_id, r.channel, self.serde.loads_typed((r.type, bytes(r.blob)))) for r in rows
        ]

    def _tuple(self, row: LangGraphCheckpoint, metadata: Any = None) -> CheckpointTuple:
        checkpoint = self.serde.loads_typed((row.type, bytes(row.checkpoint)))
        if metadata is None:
            metadata = self.serde.loads_typed((row.metadata_type, bytes(row.metadata)))
        values = self._channel_values(
            row.thread_id, row.checkpoint_ns, checkpoint.get("channel_versions") or {}
        )
        parent = row.parent_checkpoint_id
        full = cast(Checkpoint, {**checkpoint, "channel_values": values})
        return CheckpointTuple(
            config=_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id),
            checkpoint=full,
            metadata=metadata,
            parent_config=_config(row.thread_id, row.checkpoint_ns, parent) if parent else None,
            pending_writes=self._pending_writes(
                row.thread_id, row.checkpoint_ns, row.checkpoint_id
            ),
        )

    @_thread_connection
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (``checkpoint_id``) or the thread's latest.

        Returns ``None`` when there is none in the config's namespace (default ``""``).
        """
        thread_id, ns = _where(config)
        rows = LangGraphCheckpoint.objects.filter(thread_id=thread_id, checkpoint_ns=ns)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            row = rows.filter(checkpoint_id=checkpoint_id).first()
        else:
            row = rows.order_by("-checkpoint_id").first()
        return None if row is None else self._tuple(row)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of ``config``'s thread (and namespace if given).

        ``config=None`` lists every thread. ``filter``: metadata keys that must all be
        equal; ``before``: only checkpoints older than its ``checkpoint_id``;
        ``limit``: at most this many.
        """
        rows = LangGraphCheckpoint.objects.all()
        if config is not None:
            configurable = config.get("configurable") or {}
            rows = rows.filter(thread_id=_ident(configurable.get("thread_id"), "thread_id"))
            ns = configurable.get("checkpoint_ns")
            if ns is not None:
                rows = rows.filter(checkpoint_ns=_ident(ns, "checkpoint_ns"))
            if checkpoint_id := get_checkpoint_id(config):
                rows = rows.filter(checkpoint_id=checkpoint_id)
        if before is not None and (before_id := get_checkpoint_id(before)):
            rows = rows.filter(checkpoint_id__lt=before_id)
        rows = rows.order_by("-checkpoint_id", "thread_id", "checkpoint_ns")
        if limit is not None and limit <= 0:
            return
        if not filter:
            for row in rows[:limit] if limit is not None else rows:
                yield self._tuple(row)
            return
        found = 0
        light = rows.only("pk", "metadata_type", "metadata")
        for lite in light:
            metadata = self.serde.loads_typed((lite.metadata_type, bytes(lite.metadata)))
            if all(metadata.get(k) == v for k, v in filter.items()):
                full_row = LangGraphCheckpoint.objects.filter(pk=lite.pk).first()
                if full_row is None:  # deleted meanwhile
                    continue
                yield self._tuple(full_row, metadata)
                found += 1
                if limit is not None and found >= limit:
                    return

    # --- writing ------------------------------------------------------------------

    @_thread_connection
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` (as a child of ``config``'s checkpoint) and its new blobs.

        Returns the config naming the stored checkpoint. Putting the same checkpoint id
        again replaces it.
        """
        thread_id, ns = _where(config)
        parent_id = (config.get("configurable") or {}).get("checkpoint_id")
        stored: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values", None) or {}
        full_metadata = get_checkpoint_metadata(config, metadata)
        blobs = []
        for channel, version in new_versions.items():
            if channel in values:
                typ, data = self.serde.dumps_typed(values[channel])
            else:
                typ, data = "empty", b""
            blobs.append(
                LangGraphBlob(
                    thread_id=thread_id,
                    checkpoint_ns=ns,
                    channel=_ident(channel, "channel"),
                    version=str(version),
                    type=typ,
                    blob=data,
                )
            )
        typ, data = self.serde.dumps_typed(stored)
        metadata_type, metadata_data = self.serde.dumps_typed(full_metadata)
        row = LangGraphCheckpoint(
            thread_id=thread_id,
            checkpoint_ns=ns,
            checkpoint_id=_ident(checkpoint["id"], "checkpoint id"),
            parent_checkpoint_id=parent_id,
            run_id=str(full_metadata.get("run_id") or ""),
            type=typ,
            checkpoint=data,
            metadata_type=metadata_type,
            metadata=metadata_data,
        )
        with transaction.atomic():
            if blobs:
                LangGraphBlob.objects.bulk_create(blobs, ignore_conflicts=True)
            LangGraphCheckpoint.objects.bulk_create(
                [row],
                update_conflicts=True,
                unique_fields=["thread_id", "checkpoint_ns", "checkpoint_id"],
                update_fields=[
                    "parent_checkpoint_id",
                    "run_id",
                    "type",
                    "checkpoint",
                    "metadata_type",
                    "metadata",
                ],
            )
        return _config(thread_id, ns, checkpoint["id"])

    @_thread_connection
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes against ``config``'s checkpoint.

        A regular write (``idx`` >= 0) is stored once: putting it again keeps the first.
        A special write (error, interrupt, resume: negative ``idx``) replaces the old.
        """
        thread_id, ns = _where(config)
        checkpoint_id = _ident(
            (config.get("configurable") or {}).get("checkpoint_id"), "checkpoint_id"
        )
        task = _ident(task_id, "task_id")
        regular: list[LangGraphWrite] = []
        special: list[LangGraphWrite] = []
        for idx, (channel, value) in enumerate(writes):
            typ, data = self.serde.dumps_typed(value)
            row = LangGraphWrite(
                thread_id=thread_id,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=task,
                task_path=task_path or "",
                idx=WRITES_IDX_MAP.get(channel, idx),
                channel=_ident(channel, "channel"),
                type=typ,
                blob=data,
            )
            (special if row.idx < 0 else regular).append(row)
        with transaction.atomic():
            if regular:
                LangGraphWrite.objects.bulk_create(regular, ignore_conflicts=True)
            if special:
                LangGraphWrite.objects.bulk_create(
                    special,
                    update_conflicts=True,
                    unique_fields=["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                    update_fields=["channel", "type", "blob", "task_path"],
                )

    # --- deleting and copying -----------------------------------------------------

    @_thread_connection
    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, blob and write of ``thread_id`` (no error if none)."""
        tid = _ident(thread_id, "thread_id")
        with transaction.atomic():
            LangGraphWrite.objects.filter(thread_id=tid).delete()
            LangGraphBlob.objects.filter(thread_id=tid).delete()
            LangGraphCheckpoint.objects.filter(thread_id=tid).delete()

    @_thread_connection
    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints whose metadata's ``run_id`` is listed, and their writes.

        Blobs stay (a later checkpoint of the thread may still point at them); see
        :meth:`prune` to drop unreferenced ones.
        """
        ids = [str(r) for r in run_ids]
        if not ids:
            return
        with transaction.atomic():
            rows = LangGraphCheckpoint.objects.filter(run_id__in=ids)
            keys = list(rows.values_list("thread_id", "checkpoint_ns", "checkpoint_id"))
            for thread_id, ns, checkpoint_id in keys:
                LangGraphWrite.objects.filter(
                    thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
                ).delete()
            rows.delete()

    @_thread_connection
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write of one thread to another (same ids).

        Rows the target already has are kept. A missing source copies nothing.
        """
        src = _ident(source_thread_id, "source thread_id")
        dst = _ident(target_thread_id, "target thread_id")
        with transaction.atomic():
            for model in (LangGraphBlob, LangGraphCheckpoint, LangGraphWrite):
                copies: list[Any] = []
                for row in model.objects.filter(thread_id=src).order_by("pk"):
                    row.pk = None
                    row.thread_id = dst
                    copies.append(row)
                if copies:
                    model.objects.bulk_create(copies, ignore_conflicts=True)

    @_thread_connection
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``"keep_latest"`` keeps each namespace's newest checkpoint.

        With ``"keep_latest"`` the kept checkpoint keeps its writes and the blobs it
        references; everything older goes. ``"delete"`` deletes the threads. Raises
        ``ValueError`` for another strategy. Not aware of LangGraph's beta
        ``DeltaChannel`` (do not prune threads of graphs that use it).
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(
                f"DurableSaver.prune: unknown strategy {strategy!r}; use 'keep_latest' or 'delete'"
            )
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
            else:
                self._keep_latest(_ident(thread_id, "thread_id"))

    def _keep_latest(self, tid: str) -> None:
        with transaction.atomic():
            namespaces = set(
                LangGraphCheckpoint.objects.filter(thread_id=tid).values_list(
                    "checkpoint_ns", flat=True
                )
            )
            for ns in namespaces:
                rows = LangGraphCheckpoint.objects.filter(thread_id=tid, checkpoint_ns=ns)
                latest = rows.order_by("-checkpoint_id").first()
                if latest is None:
                    continue
                rows.exclude(pk=latest.pk).delete()
                LangGraphWrite.objects.filter(thread_id=tid, checkpoint_ns=ns).exclude(
                    checkpoint_id=latest.checkpoint_id
                ).delete()
                checkpoint = self.serde.loads_typed((latest.type, bytes(latest.checkpoint)))
                keep = Q(pk__in=[])
                for channel, version in (checkpoint.get("channel_versions") or {}).items():
                    keep |= Q(channel=channel, version=str(version))
                LangGraphBlob.objects.filter(thread_id=tid, checkpoint_ns=ns).exclude(keep).delete()

    # --- versions -----------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The next channel version: a zero-padded counter and a random tie-breaker.

        Text versions sort as numbers (``"00...12.0.43"`` after ``"00...11.0.97"``), as
        LangGraph's PostgreSQL saver makes them.
        """
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # --- async: the same, off the event loop ----------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple`."""
        return await sync_to_async(self.get_tuple)(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list` (the matches are read in one go, then yielded)."""

        @_thread_connection
        def read() -> list[CheckpointTuple]:
            return list(self.list(config, filter=filter, before=before, limit=limit))

        for item in await sync_to_async(read)():
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async :meth:`put`."""
        return await sync_to_async(self.put)(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async :meth:`put_writes`."""
        await sync_to_async(self.put_writes)(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread`."""
        await sync_to_async(self.delete_thread)(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs`."""
        await sync_to_async(self.delete_for_runs)(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async :meth:`copy_thread`."""
        await sync_to_async(self.copy_thread)(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async :meth:`prune`."""
        await sync_to_async(self.prune)(thread_ids, strategy=strategy)
