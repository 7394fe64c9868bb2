"""The LangGraph tables follow the runs they belong to: when retention prunes a run, the
checkpoints, blobs and pending writes of its thread (``thread_id`` = the run id, as
:func:`~durable.contrib.langgraph.graph_workflow` uses it) go in the same transaction."""

from __future__ import annotations

from typing import Any

from durable.contrib.langgraph.models import LangGraphBlob, LangGraphCheckpoint, LangGraphWrite
from durable.hooks import runs_pruning


def on_runs_pruning(sender: Any, run_ids: list[str], **kwargs: Any) -> dict[str, int]:
    """Delete the threads named by ``run_ids``; ``{model_name: rows deleted}``."""
    counts: dict[str, int] = {}
    for model in (LangGraphWrite, LangGraphBlob, LangGraphCheckpoint):
        deleted, _ = model.objects.filter(thread_id__in=run_ids).delete()
        counts[model._meta.model_name or model.__name__.lower()] = deleted
    return counts


def connect() -> None:
    runs_pruning.connect(on_runs_pruning, dispatch_uid="durable_langgraph.on_runs_pruning")
