"""LangGraph on Durable: a checkpointer in the Durable database, graphs as durable runs.

Install with ``pip install "durable[langgraph]"`` and add ``"durable.contrib.langgraph"``
to ``INSTALLED_APPS``. The public names are imported lazily, so installing the app does
not import LangGraph:

- :class:`DurableSaver` -- a LangGraph ``BaseCheckpointSaver`` (sync and async) over
  Django models (:mod:`durable.contrib.langgraph.saver`).
- :func:`graph_workflow` -- registers a Durable workflow that runs a graph, one
  super-step per step, interrupts as approvals (:mod:`durable.contrib.langgraph.graph`).
- :func:`call_tool` -- a Durable tool call (ledger, idempotency key, safety class) from
  inside a node of such a graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durable.contrib.langgraph.graph import call_tool, graph_workflow
    from durable.contrib.langgraph.saver import DurableSaver

__all__ = ["DurableSaver", "call_tool", "graph_workflow"]

_LAZY = {
    "DurableSaver": "durable.contrib.langgraph.saver",
    "call_tool": "durable.contrib.langgraph.graph",
    "graph_workflow": "durable.contrib.langgraph.graph",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
