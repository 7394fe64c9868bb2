"""``manage.py durable <subcommand>``: inspect and operate Durable from a shell.

Subcommands: ``workflows``, ``start``, ``runs``, ``show``, ``sweep``, ``reconcile``,
the run actions, ``prune``, ``export`` and ``replay-check``
(``manage.py durable <subcommand> --help`` for each). State changes go through
:mod:`durable.client` and :mod:`durable.services.runs`, as the dashboard's do. Payloads are shown
through :func:`durable.values.codec.decode_for_display`, so secrets print as ``[REDACTED]``.

Exit codes: 0 done; 1 ``start --wait`` saw the run end without succeeding, or gave up
waiting, or ``replay-check`` found a run that diverged; 2 a user error (bad JSON, unknown
workflow, run or operation, illegal transition), with a message on stderr saying what to do next.

This module is the argument wiring only; the subcommands are in :mod:`durable.cli`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from durable.cli import actions, inspection, mcp, operate, replaycheck

# the names this module held before the subcommands moved to durable.cli, still
# importable from here (tests import _parse_json)
from durable.cli.text import (  # noqa: F401
    MAX_INPUT_BYTES,
    PAYLOAD_PREVIEW_CHARS,
    RUN_DID_NOT_SUCCEED,
    TEXT_COLUMN_CHARS,
    USER_ERROR,
    _clean,
    _cut,
    _default_actor,
    _display,
    _first_line,
    _non_negative_float,
    _parse_json,
    _positive_int,
    _seconds,
    _when,
    _width,
    table,
)
from durable.models import RunStatus


def _do_mcp(command: BaseCommand, options: dict[str, Any]) -> None:
    from durable.worker import engine  # imported by the two subcommands that run it only

    mcp.do_mcp(command, options, execute=engine.execute)


def _do_replay_check(command: BaseCommand, options: dict[str, Any]) -> None:
    from durable.worker import dry

    replaycheck.do_replay_check(command, options, check=dry.check_runs)


#: ``options["subcommand"]`` -> its implementation, called with the command and options
SUBCOMMANDS: dict[str, Callable[[BaseCommand, dict[str, Any]], None]] = {
    "workflows": inspection.do_workflows,
    "start": actions.do_start,
    "runs": inspection.do_runs,
    "show": inspection.do_show,
    "sweep": actions.do_sweep,
    "reconcile": actions.do_reconcile,
    "cancel": actions.do_cancel,
    "resume": actions.do_resume,
    "compensate": actions.do_compensate,
    "fork": actions.do_fork,
    "signal": actions.do_signal,
    "prune": operate.do_prune,
    "export": operate.do_export,
    # the engine is given to these two: durable.cli's import chain stays short, and a
    # command that reads runs does not import the engine at all
    "mcp": _do_mcp,
    "replay-check": _do_replay_check,
}


# --- the command ---------------------------------------------------------------------


class Command(BaseCommand):
    # as Django's own shell: no system checks first, which would import every workflow
    # module (seconds, with agent frameworks) before a command that reads a run; a
    # subcommand that needs the registry imports it then (durable.registry.ensure_discovered)
    requires_system_checks: list[str] = []
    help = (
        "Inspect and operate Durable: list workflows and runs, start a run, show a "
        "run's trace, sweep, reconcile an unknown outcome."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(
            dest="subcommand", required=True, metavar="subcommand", title="subcommands"
        )

        p = sub.add_parser("workflows", help="list registered workflows and import errors")
        p.add_argument(
            "--strict",
            action="store_true",
            help="exit with status 2 when a workflow module failed to import",
        )

        p = sub.add_parser("start", help="start a run and print its id")
        p.add_argument("workflow", help="registered workflow name")
        p.add_argument(
            "--input",
            default="null",
            metavar="JSON",
            help="the run's input as JSON (default: null)",
        )
        p.add_argument(
            "--run-id",
            default=None,
            metavar="ID",
            help="the run's id; starting the same id with the same input again "
            "returns the existing run",
        )
        p.add_argument(
            "--tag",
            action="append",
            default=[],
            dest="tags",
            metavar="TAG",
            help="a tag for the run (repeatable)",
        )
        p.add_argument(
            "--wait",
            type=_non_negative_float,
            default=None,
            metavar="SECONDS",
            help="wait up to SECONDS for the run to end and print its output "
            "as JSON (exit 1 if it did not succeed in time)",
        )
        p.add_argument(
            "--by",
            default=None,
            metavar="NAME",
            help="who asks for the run: a dashboard username or another name "
            "(default: os:<login name>; a dashboard account with that "
            "name is recorded as the starter)",
        )

        p = sub.add_parser("runs", help="list recent runs")
        p.add_argument("--status", choices=RunStatus.values, default=None)
        p.add_argument("--workflow", default=None, metavar="NAME")
        p.add_argument(
            "--limit",
            type=_positive_int,
            default=50,
            metavar="N",
            help="at most N runs, newest first (default 50)",
        )

        p = sub.add_parser(
            "show", help="a run's header, step trace, attempts, ledger, waits and recent events"
        )
        p.add_argument("run_id")

        p = sub.add_parser(
            "sweep",
            help="dispatch runs whose lease expired or whose retry, timer or dispatch is due",
        )
        p.add_argument(
            "-v",
            "--verbosity",
            type=int,
            choices=[0, 1, 2, 3],
            default=argparse.SUPPRESS,
            help="2 or more: list the dispatched run ids",
        )

        p = sub.add_parser(
            "reconcile",
            help="decide the unknown outcome of a write",
            description="Tell Durable whether a write whose outcome is unknown took effect. "
            "OPERATION is the Operation id or its idempotency key.",
        )
        p.add_argument("operation", metavar="OPERATION")
        outcome = p.add_mutually_exclusive_group(required=True)
        outcome.add_argument(
            "--happened",
            dest="outcome",
            action="store_const",
            const="happened",
            help="the write took effect; --result is the step's result",
        )
        outcome.add_argument(
            "--not-happened",
            dest="outcome",
            action="store_const",
            const="not_happened",
            help="it did not; the run calls the tool again with the same key",
        )
        outcome.add_argument(
            "--abort", dest="outcome", action="store_const", const="abort", help="fail the run here"
        )
        outcome.add_argument(
            "--lookup",
            dest="outcome",
            action="store_const",
            const="lookup",
            help="ask the tool's reconcile hook again and print what it found; changes nothing",
        )
        p.add_argument(
            "--result",
            default=None,
            metavar="JSON",
            help="with --happened: the tool's result as JSON (default: null)",
        )
        p.add_argument(
            "--external-id",
            default="",
            metavar="ID",
            help="with --happened: the id the external system gave the write",
        )
        p.add_argument("--reason", default="", help="why (kept in the trace)")
        p.add_argument(
            "--by", default=None, metavar="NAME", help="who decides (default: os:<login name>)"
        )

        for action, what in (
            ("cancel", "cancel a run (it stops at its next fence; no write starts)"),
            ("resume", "retry a failed run from its failed step"),
            ("compensate", "undo a failed or cancelled run's writes"),
        ):
            p = sub.add_parser(action, help=what)
            p.add_argument("run_id")
            p.add_argument("--reason", default="", help="why (kept in the trace)")
            p.add_argument(
                "--by", default=None, metavar="NAME", help="who acts (default: os:<login name>)"
            )
        p = sub.add_parser("fork", help="start a new run reusing results before a step")
        p.add_argument("run_id")
        p.add_argument("--from-step", required=True, metavar="STEP_ID")
        p.add_argument(
            "--input",
            default=None,
            metavar="JSON",
            help="the fork's own input (default: the source run's); the steps before "
            "--from-step keep their results",
        )
        p.add_argument("--reason", default="")
        p.add_argument("--by", default=None, metavar="NAME")
        p = sub.add_parser("signal", help="send a signal to a run's wait_for_signal")
        p.add_argument("run_id")
        p.add_argument("name")
        p.add_argument("--payload", default="null", help="JSON (default: null)")
        p.add_argument("--dedupe-key", default=None)
        p.add_argument("--by", default=None, metavar="NAME")

        p = sub.add_parser(
            "prune",
            help="delete finished runs past their retention (batched; never a run with a "
            "write of unknown outcome or compensation owed)",
        )
        p.add_argument(
            "--older-than",
            type=_non_negative_float,
            default=None,
            metavar="SECONDS",
            help="prune runs finished more than SECONDS ago, instead of the configured retention",
        )
        p.add_argument("--workflow", default=None, metavar="NAME", help="only this workflow")
        p.add_argument(
            "--batch",
            type=_positive_int,
            default=None,
            metavar="N",
            help="runs deleted per transaction (default DURABLE['PRUNE_BATCH_RUNS'])",
        )
        p.add_argument(
            "--pause",
            type=_non_negative_float,
            default=None,
            metavar="SECONDS",
            help="sleep between transactions (default DURABLE['PRUNE_PAUSE_SECONDS'])",
        )
        p.add_argument("--limit", type=_positive_int, default=None, metavar="N")
        p.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        p.add_argument(
            "--run",
            action="append",
            default=[],
            dest="runs",
            metavar="RUN_ID",
            help="delete this finished run now, whatever its age (repeatable); exit 2 "
            "naming each run kept and why",
        )

        p = sub.add_parser(
            "export", help="a run's audit document: input, steps, attempts, ledger, waits"
        )
        p.add_argument("run_id")
        p.add_argument("--format", choices=["json", "html"], default="json")
        p.add_argument("--output", "-o", default=None, metavar="FILE")

        p = sub.add_parser(
            "replay-check",
            help="replay recorded runs against the code installed now, running nothing and "
            "writing nothing; exit 1 if one diverges",
        )
        p.add_argument("--workflow", default=None, metavar="NAME", help="only this workflow")
        p.add_argument("--version", default=None, metavar="VERSION", help="only this version")
        p.add_argument(
            "--status",
            choices=["open", "all"],
            default="open",
            help="open (default): pending, running, retrying and waiting runs; all: every run",
        )
        p.add_argument(
            "--sample", type=_positive_int, default=None, metavar="N", help="N runs at random"
        )
        p.add_argument(
            "--seed", type=int, default=None, metavar="INT", help="the sample's random seed"
        )
        p.add_argument(
            "--since",
            type=replaycheck.since_arg,
            default=None,
            metavar="WHEN",
            help="runs created since an ISO date or date-time, or an age (12h, 7d)",
        )
        p.add_argument("--json", action="store_true", help="print the report as JSON")

        p = sub.add_parser(
            "mcp",
            help="serve the registered tools over MCP on stdio (the mcp extra); every call "
            "is a run, a write that needs approval waits in the inbox",
        )
        p.add_argument(
            "--by",
            default=None,
            metavar="NAME",
            help="who calls: the starter of the calls' runs (default: os:<login name>)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            SUBCOMMANDS[options["subcommand"]](self, options)
        except DatabaseError as exc:
            missing = _unmigrated(exc)
            if missing is None:
                raise
            raise CommandError(missing) from exc


def _unmigrated(exc: DatabaseError) -> str | None:
    """What to do when ``exc`` says a Durable table does not exist (the database was
    never migrated, or ``DATABASE_URL`` names another one), or ``None``. The command runs
    no system checks first, as ``shell`` does, so this is where it is said."""
    from django.db import connection, connections

    text = str(exc)
    if "no such table" not in text and not ("relation" in text and "does not exist" in text):
        return None
    name = connection.settings_dict.get("NAME")
    with contextlib.suppress(Exception):  # an aborted transaction on PostgreSQL
        connections.close_all()
    return (
        f"{text.strip().splitlines()[0]}: the database {str(name)!r} has no Durable tables "
        "yet. Run `python manage.py migrate` (or check that DATABASE_URL names the "
        "database you meant)."
    )
