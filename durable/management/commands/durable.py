"""``manage.py durable <subcommand>``: inspect and operate Durable from a shell.

Subcommands: ``workflows``, ``start``, ``runs``, ``show``, ``sweep``, ``reconcile``
(``manage.py durable <subcommand> --help`` for each). State changes go through
:mod:`durable.api` and :mod:`durable.services`, as the dashboard's do. Payloads are shown
through :func:`durable.codec.decode_for_display`, so secrets print as ``[REDACTED]``.

Exit codes: 0 done; 1 ``start --wait`` saw the run end without succeeding, or gave up
waiting; 2 a user error (bad JSON, unknown workflow, run or operation, illegal
transition), with a message on stderr saying what to do next.
"""

from __future__ import annotations

import argparse
import getpass
import json
import time
import unicodedata
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from durable import api, codec, registry, requesters, services, sweeper
from durable.exceptions import (
    IllegalTransition,
    PayloadError,
    RunInputConflict,
    RunNotFound,
    WorkflowNotFound,
)
from durable.jsontext import JSONInputError, loads_bounded
from durable.models import TERMINAL, Operation, Run, RunStatus, Step, StepAttempt, TraceEvent, Wait

T = TypeVar("T")

USER_ERROR = 2
RUN_DID_NOT_SUCCEED = 1
#: characters of a payload shown by ``show`` before it is cut
PAYLOAD_PREVIEW_CHARS = 2000
#: widest cell of a free-text column (messages, titles)
TEXT_COLUMN_CHARS = 60


# --- text helpers --------------------------------------------------------------------


def _clean(value: Any) -> str:
    """One line of printable text: control characters (ANSI escapes too) are escaped."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Plain aligned text: a header, a rule, one line per row (cells made printable)."""
    cells = [[_clean(c) for c in row] for row in rows]
    widths = [max([_width(h)] + [_width(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        padded = (v + " " * (w - _width(v)) for v, w in zip(values, widths, strict=False))
        return "  ".join(padded).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}s" if value < 60 else f"{value:.0f}s"


def _display(text: str | None) -> str:
    """A stored payload as compact JSON for humans: never decrypted, cut when long."""
    if text is None:
        return "-"
    try:
        shown = json.dumps(codec.decode_for_display(text), ensure_ascii=False, default=str)
    except ValueError as exc:
        return f"(unreadable payload: {exc})"
    if len(shown) > PAYLOAD_PREVIEW_CHARS:
        shown = (
            shown[:PAYLOAD_PREVIEW_CHARS]
            + f"… ({len(shown)} characters; the admin shows all of it)"
        )
    return _clean(shown)


#: the largest JSON an option takes, in bytes (the codec's payload limit applies after)
MAX_INPUT_BYTES = 16 * 1_048_576


def _parse_json(text: str, option: str) -> Any:
    """Strict JSON (no NaN/Infinity; size and depth bounded before parsing,
    :func:`durable.jsontext.loads_bounded`) or a user error naming the option."""
    try:
        return loads_bounded(text, what=option, max_bytes=MAX_INPUT_BYTES)
    except JSONInputError as exc:
        hint = (
            f" Quote keys and strings with double quotes, e.g. {option} '{{\"a\": 1}}'."
            if exc.code == "invalid"
            else ""
        )
        raise CommandError(f"{exc}{hint}", returncode=USER_ERROR) from None
    except ValueError as exc:
        raise CommandError(
            f"{option} is not valid JSON: {exc}; use null or a number.", returncode=USER_ERROR
        ) from None


def _default_actor() -> str:
    """``os:<login name>``: who runs this command, recorded as such (a dashboard account
    of the same name is mapped to it by :func:`durable.requesters.resolve`); ``""``
    (unknown) when the process has no login name."""
    try:
        login = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        return ""
    return f"{requesters.OS_PREFIX}{login}" if login else ""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be 0 or more seconds")
    return value


# --- the command ---------------------------------------------------------------------


class Command(BaseCommand):
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
            ("cancel", "cancel a run (no new step starts)"),
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
        p.add_argument("--reason", default="")
        p.add_argument("--by", default=None, metavar="NAME")
        p = sub.add_parser("signal", help="send a signal to a run's wait_for_signal")
        p.add_argument("run_id")
        p.add_argument("name")
        p.add_argument("--payload", default="null", help="JSON (default: null)")
        p.add_argument("--dedupe-key", default=None)
        p.add_argument("--by", default=None, metavar="NAME")

    def handle(self, *args: Any, **options: Any) -> None:
        handler = getattr(self, f"do_{options['subcommand']}")
        handler(options)

    # --- transitions (the same services as the dashboard and the admin) ---------------

    def _transition(self, options: dict[str, Any], call: Callable[[], T]) -> T:
        try:
            return call()
        except RunNotFound as exc:
            raise CommandError(
                f"{_clean(exc)}; list runs with: manage.py durable runs", returncode=USER_ERROR
            ) from None
        except (IllegalTransition, PayloadError, ValueError) as exc:
            raise CommandError(_clean(exc), returncode=USER_ERROR) from None

    def _run_action(self, options: dict[str, Any], service: Any) -> None:
        run = self._transition(
            options,
            lambda: service(
                run_id=options["run_id"],
                by=options["by"] or _default_actor(),
                reason=options["reason"],
            ),
        )
        self.stdout.write(f"run {run.id} is {run.status}")

    def do_cancel(self, options: dict[str, Any]) -> None:
        self._run_action(options, services.run_cancel)

    def do_resume(self, options: dict[str, Any]) -> None:
        self._run_action(options, services.run_resume)

    def do_compensate(self, options: dict[str, Any]) -> None:
        self._run_action(options, services.run_compensate)

    def do_fork(self, options: dict[str, Any]) -> None:
        fork = self._transition(
            options,
            lambda: services.run_fork(
                run_id=options["run_id"],
                from_step=options["from_step"],
                by=options["by"] or _default_actor(),
                reason=options["reason"],
            ),
        )
        self.stdout.write(
            f"run {fork.id} started, forked from {options['run_id']} at step "
            f"{options['from_step']!r}"
        )

    def do_signal(self, options: dict[str, Any]) -> None:
        payload = _parse_json(options["payload"], "--payload")
        sent = self._transition(
            options,
            lambda: services.run_signal(
                run_id=options["run_id"],
                name=options["name"],
                payload=payload,
                dedupe_key=options["dedupe_key"],
                by=options["by"] or _default_actor(),
            ),
        )
        # e.g. "run R: signal 'goods-received': kept; this run waits on goods_received, ..."
        self.stdout.write(f"run {options['run_id']}: {_clean(sent.message)}")

    # --- workflows -------------------------------------------------------------------

    def do_workflows(self, options: dict[str, Any]) -> None:
        specs = registry.workflows()
        if specs:
            latest = {
                name: registry.get_workflow(name).version
                for name in dict.fromkeys(s.name for s in specs)
            }
            rows = [
                [s.name, s.version, "yes" if latest[s.name] == s.version else "", s.module]
                for s in sorted(specs, key=lambda s: s.name)
            ]
            self.stdout.write(table(["workflow", "version", "latest", "module"], rows))
        else:
            self.stdout.write(
                "No workflows are registered. Declare them with "
                "@durable.workflow in an installed app's workflows.py or in "
                "a module listed in DURABLE['WORKFLOW_MODULES']."
            )
        tools = sorted(registry.tools(), key=lambda t: t.name)
        if tools:
            self.stdout.write("")
            self.stdout.write(
                table(
                    ["tool", "safety", "approval", "reconcile", "compensate"],
                    [
                        [
                            t.name,
                            t.safety,
                            "yes" if t.requires_approval else "",
                            "yes" if t.reconcile else "",
                            "yes" if t.compensate else "",
                        ]
                        for t in tools
                    ],
                )
            )
        errors = dict(registry.load_errors)
        for module, tb in sorted(errors.items()):
            lines = tb.strip().splitlines()
            last = lines[-1].strip() if lines else "import failed"
            self.stderr.write(f"workflow module {module} failed to import: {_clean(last)}")
        if errors:
            self.stderr.write(
                "Its workflows cannot run in this process: fix the module "
                "(the worker's log has the full traceback)."
            )
            if options["strict"]:
                raise CommandError(
                    f"{len(errors)} workflow module(s) failed to import", returncode=USER_ERROR
                )

    # --- start -----------------------------------------------------------------------

    def do_start(self, options: dict[str, Any]) -> None:
        value = _parse_json(options["input"], "--input")
        run_id = options["run_id"]
        existed = run_id is not None and Run.objects.filter(pk=run_id).exists()
        try:
            run = api.start(
                options["workflow"],
                value,
                run_id,
                tags=options["tags"] or None,
                started_by=options["by"] or _default_actor(),
            )
        except WorkflowNotFound as exc:
            raise CommandError(
                f"{exc} List them with: manage.py durable workflows", returncode=USER_ERROR
            ) from None
        except RunInputConflict as exc:
            raise CommandError(str(exc), returncode=USER_ERROR) from None
        except PayloadError as exc:
            raise CommandError(
                f"{exc}; pass a smaller --input or store large data elsewhere and pass a reference",
                returncode=USER_ERROR,
            ) from None
        except ValueError as exc:
            raise CommandError(str(exc), returncode=USER_ERROR) from None
        if existed:
            self.stderr.write(
                f"run {run.id} already exists with this workflow and input "
                f"({run.status}); it was not started again"
            )
        self.stdout.write(run.id)
        if options["wait"] is not None:
            self._wait(run.id, options["wait"])

    def _wait(self, run_id: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            run = api.get_run(run_id)
            if run.status in TERMINAL or time.monotonic() >= deadline:
                break
            time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
            delay = min(delay * 1.5, 1.0)
        if run.status == RunStatus.SUCCEEDED:
            self.stdout.write(_display(run.output))
            return
        if run.status in TERMINAL:
            error = run.error or {}
            detail = f": {error.get('type')}: {_first_line(error.get('message'))}" if error else ""
            raise CommandError(
                f"run {run.id} ended {run.status}{_clean(detail)}. See why "
                f"with: manage.py durable show {run.id}",
                returncode=RUN_DID_NOT_SUCCEED,
            )
        raise CommandError(
            f"run {run.id} is still {run.status} after {timeout:g} s; follow it "
            f"with: manage.py durable show {run.id}",
            returncode=RUN_DID_NOT_SUCCEED,
        )

    # --- runs ------------------------------------------------------------------------

    def do_runs(self, options: dict[str, Any]) -> None:
        qs = Run.objects.order_by("-created_at", "-id")
        if options["status"]:
            qs = qs.filter(status=options["status"])
        if options["workflow"]:
            qs = qs.filter(workflow_name=options["workflow"])
        limit = options["limit"]
        runs = list(
            qs.only(
                "id",
                "workflow_name",
                "workflow_version",
                "status",
                "created_at",
                "steps_executed",
                "error_type",
            )[: limit + 1]
        )
        if not runs:
            self.stdout.write("No runs match.")
            return
        more = len(runs) > limit
        rows = [
            [
                r.id,
                f"{r.workflow_name}@{r.workflow_version}",
                r.status,
                _when(r.created_at),
                r.steps_executed,
                r.error_type or "-",
            ]
            for r in runs[:limit]
        ]
        self.stdout.write(table(["id", "workflow", "status", "created", "steps", "error"], rows))
        if more:
            self.stdout.write(
                f"(more than {limit} runs match; raise --limit or filter with --status/--workflow)"
            )

    # --- show ------------------------------------------------------------------------

    def do_show(self, options: dict[str, Any]) -> None:
        run_id = options["run_id"]
        try:
            run = api.get_run(run_id)
        except RunNotFound as exc:
            raise CommandError(
                f"{_clean(exc)}; list runs with: manage.py durable runs", returncode=USER_ERROR
            ) from None
        write = self.stdout.write
        write(self._header(run))

        steps = list(Step.objects.filter(run=run).order_by("position"))
        write("\nSteps")
        if steps:
            write(
                table(
                    [
                        "pos",
                        "step_id",
                        "kind",
                        "tool",
                        "status",
                        "attempts",
                        "duration",
                        "replayed",
                    ],
                    [
                        [
                            s.position,
                            s.step_id,
                            s.kind,
                            s.tool_name or "-",
                            s.status,
                            s.attempts,
                            _seconds(s.duration),
                            s.replay_count,
                        ]
                        for s in steps
                    ],
                )
            )
        else:
            write("(none yet)")

        attempts = list(
            StepAttempt.objects.filter(run=run)
            .select_related("step")
            .order_by("step__position", "attempt")
        )
        if attempts:
            write("\nFailed attempts")
            write(
                table(
                    [
                        "step_id",
                        "attempt",
                        "outcome",
                        "classification",
                        "error",
                        "message",
                        "retry in",
                    ],
                    [
                        [
                            a.step.step_id,
                            a.attempt,
                            a.outcome,
                            a.classification,
                            a.error_type or "-",
                            _cut(_first_line(a.message), TEXT_COLUMN_CHARS),
                            _seconds(a.retry_delay) if a.retry_delay is not None else "no retry",
                        ]
                        for a in attempts
                    ],
                )
            )

        operations = list(Operation.objects.filter(run=run).order_by("created_at", "pk"))
        if operations:
            write("\nOperations")
            write(
                table(
                    [
                        "id",
                        "idempotency_key",
                        "tool",
                        "safety",
                        "status",
                        "external_id",
                        "decision",
                    ],
                    [
                        [
                            o.pk,
                            o.idempotency_key,
                            o.tool_name,
                            o.safety,
                            o.status,
                            o.external_id or "-",
                            _cut(o.resolution, TEXT_COLUMN_CHARS) if o.resolution else "-",
                        ]
                        for o in operations
                    ],
                )
            )
            if any(o.status == "unknown" and not o.resolution for o in operations):
                write(
                    "An operation's outcome is unknown: decide with manage.py durable "
                    "reconcile <id> --happened --result JSON | --not-happened | --abort"
                )

        waits = list(Wait.objects.filter(run=run).order_by("position", "created_at"))
        if waits:
            write("\nWaits")
            write(
                table(
                    ["wait_id", "kind", "status", "title", "wake_at", "resolved by"],
                    [
                        [
                            w.wait_id,
                            w.kind,
                            w.status,
                            _cut(w.title, TEXT_COLUMN_CHARS) or "-",
                            _when(w.wake_at),
                            w.resolved_by or "-",
                        ]
                        for w in waits
                    ],
                )
            )

        events = list(TraceEvent.objects.filter(run=run).order_by("-id")[:20])[::-1]
        write("\nLast 20 events" if len(events) == 20 else "\nEvents")
        write(
            table(
                ["time", "event", "step_id", "actor", "message"],
                [
                    [
                        _when(e.created_at),
                        e.kind,
                        e.step_id or "-",
                        e.actor or "-",
                        _cut(_first_line(e.message), TEXT_COLUMN_CHARS) or "-",
                    ]
                    for e in events
                ],
            )
        )

    def _header(self, run: Run) -> str:
        duration = None
        if run.started_at and run.finished_at:
            duration = (run.finished_at - run.started_at).total_seconds()
        lease = "-"
        if run.lease_owner or run.lease_expires_at:
            lease = f"{run.lease_owner or '?'} until {_when(run.lease_expires_at)}"
        fields: list[tuple[str, Any]] = [
            ("run", run.id),
            ("workflow", run.workflow_name),
            ("version", run.workflow_version),
            ("status", run.status),
            ("started by", run.starter_label),
            ("created", _when(run.created_at)),
            ("started", _when(run.started_at)),
            ("finished", _when(run.finished_at)),
            ("duration", _seconds(duration)),
            ("lease", lease),
            (
                "steps",
                (
                    f"{run.steps_executed} executed, {run.steps_replayed} replayed, "
                    f"budget {run.max_steps}"
                ),
            ),
            ("deadline", _when(run.deadline_at)),
            ("claims", run.claims),
            ("tags", ", ".join(run.tags) if run.tags else "-"),
        ]
        if run.forked_from_id or run.requester_unknown:
            fields.append(
                (
                    "requesters",
                    requesters.describe(run.requesters)
                    + (
                        " (four-eyes approvals need two approvers)" if run.requester_unknown else ""
                    ),
                )
            )
        if run.wake_at:
            fields.append(("retry at", _when(run.wake_at)))
        if run.error:
            error = run.error
            message = _first_line(error.get("message"))
            fields.append(("error", f"{error.get('type', '?')}: {message}"))
            if error.get("step_id"):
                fields.append(("error step", error["step_id"]))
            if error.get("classification"):
                fields.append(("classification", error["classification"]))
        fields.append(("input", _display(run.input)))
        if run.output is not None:
            fields.append(("output", _display(run.output)))
        label = max(len(k) for k, _ in fields)
        return "\n".join(f"{k + ':':<{label + 1}} {_clean(v)}" for k, v in fields)

    # --- sweep -----------------------------------------------------------------------

    def do_sweep(self, options: dict[str, Any]) -> None:
        result = sweeper.sweep()
        labels = [
            ("expired", "expired leases"),
            ("due", "due retries"),
            ("timers", "due timers"),
            ("pending", "undispatched pending runs"),
        ]
        label = max(len(text) for _, text in labels)
        for key, text in labels:
            self.stdout.write(f"{text + ':':<{label + 1}} {result.get(key, 0)}")
        run_ids = result.get("run_ids") or []
        self.stdout.write(f"dispatched {len(run_ids)} run(s)")
        if options["verbosity"] >= 2:
            for run_id in run_ids:
                self.stdout.write(f"  {run_id}")

    # --- reconcile -------------------------------------------------------------------

    def do_reconcile(self, options: dict[str, Any]) -> None:
        outcome = options["outcome"]
        if outcome != "happened" and (options["result"] is not None or options["external_id"]):
            raise CommandError(
                "--result and --external-id go with --happened only", returncode=USER_ERROR
            )
        result = None
        if options["result"] is not None:
            result = _parse_json(options["result"], "--result")
        try:
            op = services.operation_reconcile(
                operation_id=options["operation"],
                outcome=outcome,
                result=result,
                external_id=options["external_id"],
                reason=options["reason"],
                by=options["by"] or _default_actor(),
            )
        except services.OperationNotFound as exc:
            raise CommandError(
                f"{_clean(exc)}; operations with an unknown outcome show up in "
                "manage.py durable show <run id>",
                returncode=USER_ERROR,
            ) from None
        except IllegalTransition as exc:
            raise CommandError(_clean(exc), returncode=USER_ERROR) from None
        except (PayloadError, ValueError) as exc:
            raise CommandError(_clean(exc), returncode=USER_ERROR) from None
        run = Run.objects.only("id", "status").get(pk=op.run_id)
        self.stdout.write(
            f"operation {op.pk} ({_clean(op.idempotency_key)}): {outcome.replace('_', ' ')}"
        )
        if outcome == "abort":
            self.stdout.write(f"run {run.id} is {run.status}")
        elif run.status == RunStatus.COMPENSATING:
            self.stdout.write(f"run {run.id} is compensating: a worker goes on with it")
        elif run.is_terminal:
            self.stdout.write(
                f"run {run.id} stays {run.status}: recorded in the ledger (its "
                "compensation undoes what happened)"
            )
        else:
            self.stdout.write(
                f"run {run.id} is {run.status}: a worker resumes it"
                + (
                    " and calls the tool again with the same idempotency key"
                    if outcome == "not_happened"
                    else ""
                )
            )
