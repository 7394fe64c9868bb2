from __future__ import annotations

from django.apps import AppConfig


class DurableLangGraphConfig(AppConfig):
    """The Django app of :mod:`durable.contrib.langgraph` (its checkpoint tables).

    Add ``"durable.contrib.langgraph"`` to ``INSTALLED_APPS`` after ``"durable"`` and run
    ``migrate``. Importing the app does not import LangGraph: the saver and the graph
    workflows do, when they are first used.
    """

    name = "durable.contrib.langgraph"
    label = "durable_langgraph"
    verbose_name = "Durable: LangGraph checkpoints"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from durable.contrib.langgraph import receivers

        receivers.connect()  # pruning a run deletes its thread's checkpoints
