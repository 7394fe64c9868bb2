"""LangGraph on Durable: a checkpointer in the Durable database, graphs as durable runs.

Install with ``pip install "durable[langgraph]"`` and add ``"durable.contrib.langgraph"``
to ``INSTALLED_APPS``. The public names are imported lazily, so installing the app does
not import LangGraph:

- :class:`DurableSaver` -- a LangGraph ``BaseCheckpointSaver`` (sync and async) over
  Django models (:mod:`durable.contrib.langgraph.saver`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durable.contrib.langgraph.saver import DurableSaver

__all__ = ["DurableSaver"]

_LAZY = {
    "DurableSaver": "durable.contrib.langgraph.saver",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
