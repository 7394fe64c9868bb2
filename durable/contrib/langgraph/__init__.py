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
- :func:`call_model` -- a chat completion from inside a node, recorded as an LLM step.
- :func:`durable_chat_model` -- a LangChain chat model whose ``invoke`` inside a node is
  an LLM step (:mod:`durable.contrib.langgraph.chat`).
- :func:`ask` -- ``interrupt(value)`` that returns what the graph expects of the inbox's
  decision (``True``/``False``, the edited value, the answer).
- :class:`DurableStore` -- a LangGraph ``BaseStore`` (long-term memory, with TTL) over
  Django models (:mod:`durable.contrib.langgraph.store`).
- :func:`fork_graph` -- fork a graph run with LangGraph's ``update_state``.
- :func:`start_graph` -- start a graph run with LangGraph's run-time ``context=``.
- :func:`stream` -- a graph run's stream modes as LangGraph's ``graph.stream`` yields
  them, live (:mod:`durable.contrib.langgraph.reader`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durable.contrib.langgraph.chat import durable_chat_model
    from durable.contrib.langgraph.forks import fork_graph
    from durable.contrib.langgraph.graph import call_model, call_tool, graph_workflow, start_graph
    from durable.contrib.langgraph.interrupts import ask
    from durable.contrib.langgraph.reader import stream
    from durable.contrib.langgraph.saver import DurableSaver
    from durable.contrib.langgraph.store import DurableStore

__all__ = [
    "DurableSaver",
    "DurableStore",
    "ask",
    "call_model",
    "call_tool",
    "durable_chat_model",
    "fork_graph",
    "graph_workflow",
    "start_graph",
    "stream",
]

_LAZY = {
    "DurableSaver": "durable.contrib.langgraph.saver",
    "DurableStore": "durable.contrib.langgraph.store",
    "ask": "durable.contrib.langgraph.interrupts",
    "call_model": "durable.contrib.langgraph.graph",
    "call_tool": "durable.contrib.langgraph.graph",
    "durable_chat_model": "durable.contrib.langgraph.chat",
    "fork_graph": "durable.contrib.langgraph.forks",
    "start_graph": "durable.contrib.langgraph.graph",
    "stream": "durable.contrib.langgraph.reader",
    "graph_workflow": "durable.contrib.langgraph.graph",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
