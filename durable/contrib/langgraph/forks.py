"""Forks of graph runs: :func:`fork_graph` (LangGraph's time travel on a Durable fork)
and a fork's first live super-step (:func:`continue_fork`)."""

from __future__ import annotations

from typing import Any

from durable.contrib.langgraph.saver import DurableSaver
from durable.exceptions import PermanentError

__all__ = ["continue_fork", "fork_graph", "forked_at"]


def fork_graph(
    run_id: str,
    *,
    from_step: str,
    values: Any = None,
    as_node: str | None = None,
    by: Any = None,
    reason: str = "",
    new_run_id: str | None = None,
) -> Any:
    """Fork the graph run ``run_id`` at ``from_step`` with LangGraph's ``update_state``.

    The new run (:func:`durable.fork`: the steps before ``from_step`` are reused) gets a
    copy of the run's thread, and ``graph.update_state(<the checkpoint before
    from_step>, values, as_node=as_node)`` is applied to it, as LangGraph's time travel
    does; the graph then continues from that state. ``values=None`` with ``as_node=None``
    continues from the checkpoint unchanged (as a plain :func:`durable.fork` does).
    ``from_step``: a ``superstep-N`` with N >= 2 (``superstep-1`` has no state before
    it: start a new run instead). All in one transaction: a worker never sees the fork
    without its state. Returns the new :class:`~durable.models.Run`; raises ``ValueError``
    for a run that is not a graph run or a ``from_step`` that is not a later super-step,
    LangGraph's ``InvalidUpdateError`` for an update it refuses, and what
    :func:`durable.fork` raises.
    """
    import uuid

    from django.db import transaction

    import durable
    from durable.contrib.langgraph.graphs import _builders
    from durable.contrib.langgraph.graphs import compiled as _graph
    from durable.models import Run, Step

    source = Run.objects.get(pk=run_id)
    built = _builders.get((source.workflow_name, source.workflow_version))
    if built is None:
        raise ValueError(
            f"fork_graph: run {run_id} is not a run of a graph workflow registered here "
            f"({source.workflow_name} version {source.workflow_version})"
        )
    steps = list(Step.objects.filter(run_id=run_id).order_by("position"))
    ids = [st.step_id for st in steps]
    if not from_step.startswith("superstep-") or from_step not in ids:
        raise ValueError(f"fork_graph: {from_step!r} is not a super-step of run {run_id}")
    before = [st for st in steps[: ids.index(from_step)] if st.step_id.startswith("superstep-")]
    if not before:
        raise ValueError("fork_graph: superstep-1 has no state before it: start a new run")
    after = before[-1].output_value().get("checkpoint_id")
    graph = _graph(source.workflow_name, source.workflow_version, *built)
    new_id = new_run_id or f"{run_id}-fork-{uuid.uuid4().hex[:8]}"
    with transaction.atomic():
        run = durable.fork(run_id, from_step=from_step, by=by, reason=reason, new_run_id=new_id)
        DurableSaver().copy_thread(run_id, run.id)
        at = {"configurable": {"thread_id": run.id, "checkpoint_ns": "", "checkpoint_id": after}}
        graph.update_state(at, values, as_node=as_node or ("__copy__" if values is None else None))
    return run


def continue_fork(graph: Any, thread_id: str, after: str | None) -> Any:
    """A fork's first live super-step: its thread copied from the run it forks, at a
    copy of ``after`` (the checkpoint the fork continues from); returns that state."""
    from django.db import transaction

    from durable.models import Run

    source = Run.objects.filter(pk=thread_id).values_list("forked_from_id", flat=True).first()
    if not source or not after:
        raise PermanentError(
            f"the LangGraph state of run {thread_id} is not in the database (thread_id "
            f"{thread_id!r} has no checkpoint): a graph run resumes only from its own "
            "checkpoints or, forked, from those of the run it forks (a pruned thread "
            "cannot continue)"
        )
    at = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": after}}
    with transaction.atomic():
        DurableSaver().copy_thread(source, thread_id)
        if graph.get_state(at).created_at is None:
            raise PermanentError(
                f"run {thread_id} forks run {source}, whose thread has no checkpoint {after} "
                "(pruned?): the fork cannot continue"
            )
        graph.update_state(at, None, as_node="__copy__")
    return graph.get_state({"configurable": {"thread_id": thread_id}})


def forked_at(state: Any, after: str) -> bool:
    """The graph stands on fork_graph's ``update_state`` of ``after``: go on from it."""
    source = (state.metadata or {}).get("source")
    parent = ((state.parent_config or {}).get("configurable") or {}).get("checkpoint_id")
    return source == "update" and parent == after
