"""``manage.py durable mcp``: serve the registered tools over MCP on stdio.

Needs the ``mcp`` extra (``pip install "durable[mcp]"``) and the app
``durable.contrib.mcp`` installed (it registers the call workflow); the SDK is imported
only here, when the subcommand runs. Standard output carries the protocol only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from durable.cli.text import USER_ERROR, _default_actor


def do_mcp(command: BaseCommand, options: dict[str, Any], *, execute: Callable[..., Any]) -> None:
    """``execute``: the engine's (given by the command, so this module's import chain
    stays short): the server runs the calls' runs in its own process."""
    try:
        from durable.contrib.mcp.server import run_stdio
    except ImportError as exc:
        raise CommandError(
            f'manage.py durable mcp needs the mcp extra: pip install "durable[mcp]" ({exc})',
            returncode=USER_ERROR,
        ) from exc
    from django.apps import apps

    if not apps.is_installed("durable.contrib.mcp"):
        raise CommandError(
            'add "durable.contrib.mcp" to INSTALLED_APPS: it registers the workflow of '
            "the calls (and the workers need it too)",
            returncode=USER_ERROR,
        )
    from durable.models import Run

    # an unmigrated database is said now, on stderr, not as each call's failure
    Run.objects.filter(pk="").exists()
    by = options["by"] if options["by"] is not None else _default_actor()
    # the runs record the name (and the dashboard account of that name, if any)
    run_stdio(by or None, by or "unknown", execute=execute)
