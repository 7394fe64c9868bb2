"""Give every registered tool a :class:`~durable.models.Tool` row for the admin to edit.

:func:`sync_tools` creates the missing rows from the code's declarations and never
touches an existing row: what an operator set in the admin stays. Importing this module
connects it to ``post_migrate``, so ``manage.py migrate`` creates the rows
(``DurableConfig.ready()`` imports it).

Note that a row overrides the code for safety, approval, edit, timeout and retry
(:func:`durable.registry.effective_tool`): once the row exists, changing those in the
code changes nothing until the row is edited or reset to the code's declaration (the admin's
"Reset selected tools to their code declaration" action).
"""

from __future__ import annotations

import sys
from typing import Any

from django.apps import apps as global_apps
from django.db import DEFAULT_DB_ALIAS, router
from django.db.models.signals import post_migrate

from durable import registry

__all__ = ["sync_tools", "tool_defaults"]


def tool_defaults(spec: registry.ToolSpec) -> dict[str, Any]:
    """The Tool row fields a code declaration implies (``approver_group`` excepted:
    with the row's group empty, the code's group name applies)."""
    timeout = spec.timeout if spec.timeout is not None and spec.timeout > 0 else None
    return {
        "description": spec.description,
        "safety": spec.safety,
        "requires_approval": spec.requires_approval,
        "allow_edit": spec.allow_edit,
        "timeout_seconds": timeout,
        "retry_policy": spec.retry.to_dict() if spec.retry is not None else None,
    }


def sync_tools(*, using: str = DEFAULT_DB_ALIAS, model: Any = None) -> list[str]:
    """Create a Tool row for each registered tool that has none; return the names created.

    Existing rows are never changed. Two queries whatever the number of tools: the
    names that have a row, then one ``bulk_create`` of the rest. Safe to run
    concurrently: a row another process created in between is skipped by the unique
    name (``ignore_conflicts``), and is then still in the returned names. ``model`` is
    the Tool model to use (the migration state's in ``post_migrate``; default
    :class:`durable.models.Tool`).
    """
    if model is None:
        from durable.models import Tool

        model = Tool
    manager = model._default_manager.using(using)
    specs = {spec.name: spec for spec in registry.tools()}
    existing = set(manager.values_list("name", flat=True))  # one row a tool: small
    missing = [spec for name, spec in specs.items() if name not in existing]
    manager.bulk_create(
        [model(name=spec.name, **tool_defaults(spec)) for spec in missing],
        ignore_conflicts=True,
    )
    return [spec.name for spec in missing]


def _on_post_migrate(
    sender: Any,
    *,
    using: str = DEFAULT_DB_ALIAS,
    apps: Any = global_apps,
    verbosity: int = 1,
    **kwargs: Any,
) -> None:
    if getattr(sender, "label", None) != "durable":
        return
    try:
        model = apps.get_model("durable", "Tool")
    except LookupError:  # migrated backwards past the Tool table
        return
    if not router.allow_migrate_model(using, model):
        return
    created = sync_tools(using=using, model=model)
    if created and verbosity >= 2:
        stdout = kwargs.get("stdout") or sys.stdout
        stdout.write(f"Durable: created tool settings for {', '.join(created)}\n")


post_migrate.connect(_on_post_migrate, dispatch_uid="durable.services.toolsync.sync_tools")
