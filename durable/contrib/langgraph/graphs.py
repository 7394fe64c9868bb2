"""The graph workflows registered in this process, and their compiled graphs.

Shared by the driver (:mod:`durable.contrib.langgraph.graph`), the forks
(:mod:`durable.contrib.langgraph.forks`) and the stream's reader
(:mod:`durable.contrib.langgraph.reader`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from durable.contrib.langgraph.interrupts import refuse_breakpoints
from durable.contrib.langgraph.saver import DurableSaver

#: (name, version) -> (build_graph, store) of every graph workflow, for fork_graph
_builders: dict[tuple[str, str], tuple[Callable[[], Any], Any]] = {}
#: (name, version) -> the stream modes every run of the graph workflow writes
STREAM_MODES: dict[tuple[str, str], tuple[str, ...]] = {}
_graphs: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


def compiled(name: str, version: str, build_graph: Callable[[], Any], store: Any = None) -> Any:
    """The compiled graph of workflow ``name``/``version`` (``build_graph()`` compiled
    with :class:`DurableSaver` once per process). Raises ``TypeError`` for a
    ``build_graph`` that returns no graph, and refuses static breakpoints."""
    with _lock:
        graph = _graphs.get((name, version))
        if graph is None:
            built = build_graph()
            if hasattr(built, "compile"):
                graph = built.compile(checkpointer=DurableSaver(), store=store)
            elif hasattr(built, "checkpointer") and hasattr(built, "stream"):
                update = {"checkpointer": DurableSaver()}
                if store is not None:
                    update["store"] = store
                graph = built.copy(update=update)
            else:
                raise TypeError(
                    f"graph_workflow({name!r}): build_graph must return a StateGraph or a "
                    f"compiled graph, not {type(built).__name__}"
                )
            refuse_breakpoints(f"graph_workflow({name!r})", graph)
            _graphs[(name, version)] = graph
    return graph
