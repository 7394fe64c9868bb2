"""What ``manage.py durable`` reads: ``workflows``, ``runs`` and ``show``.

None of these changes state: they query the registry and the run's rows (steps, failed
attempts, the operation ledger, waits, trace events) and print them as tables through
:mod:`durable.cli.text`. Separate from :mod:`durable.cli.actions`: nothing here changes
a run, so a change to a listing is made and reviewed apart from the state changes.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from durable import client as api
from durable import registry, requesters
from durable.cli.text import (
    TEXT_COLUMN_CHARS,
    USER_ERROR,
    _clean,
    _cut,
    _display,
    _first_line,
    _seconds,
    _when,
    table,
)
from durable.exceptions import RunNotFound
from durable.models import Operation, Run, Step, StepAttempt, TraceEvent, Wait
from durable.vocabulary import CANCELLED_ERROR_TYPE

# --- workflows -----------------------------------------------------------------------


def do_workflows(command: BaseCommand, options: dict[str, Any]) -> None:
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
        command.stdout.write(table(["workflow", "version", "latest", "module"], rows))
    else:
        command.stdout.write(
            "No workflows are registered. Declare them with "
            "@durable.workflow in an installed app's workflows.py or in "
            "a module listed in DURABLE['WORKFLOW_MODULES']."
        )
    tools = sorted(registry.tools(), key=lambda t: t.name)
    if tools:
        command.stdout.write("")
        command.stdout.write(
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
    errors = registry.import_errors()
    for module, tb in sorted(errors.items()):
        lines = tb.strip().splitlines()
        last = lines[-1].strip() if lines else "import failed"
        command.stderr.write(f"workflow module {module} failed to import: {_clean(last)}")
    if errors:
        command.stderr.write(
            "Its workflows cannot run in this process: fix the module "
            "(the worker's log has the full traceback)."
        )
        if options["strict"]:
            raise CommandError(
                f"{len(errors)} workflow module(s) failed to import", returncode=USER_ERROR
            )


# --- runs ----------------------------------------------------------------------------


def do_runs(command: BaseCommand, options: dict[str, Any]) -> None:
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
        command.stdout.write("No runs match.")
        return
    more = len(runs) > limit
    rows = [
        [
            r.id,
            f"{r.workflow_name}@{r.workflow_version}",
            r.status,
            _when(r.created_at),
            r.steps_executed,
            # a cancel is an operator's decision, shown by the status, not an error
            r.error_type if r.error_type and r.error_type != CANCELLED_ERROR_TYPE else "-",
        ]
        for r in runs[:limit]
    ]
    command.stdout.write(table(["id", "workflow", "status", "created", "steps", "error"], rows))
    if more:
        command.stdout.write(
            f"(more than {limit} runs match; raise --limit or filter with --status/--workflow)"
        )


# --- show ----------------------------------------------------------------------------


def do_show(command: BaseCommand, options: dict[str, Any]) -> None:
    run_id = options["run_id"]
    try:
        run = api.get_run(run_id)
    except RunNotFound as exc:
        raise CommandError(
            f"{_clean(exc)}; list runs with: manage.py durable runs", returncode=USER_ERROR
        ) from None
    write = command.stdout.write
    write(_header(run))

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
                    "durability",
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
                        s.durability,
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

    children = list(
        Run.objects.filter(parent_run=run)
        .order_by("created_at", "id")
        .only("id", "workflow_name", "status", "created_at")
    )
    if children:
        write("\nChild runs")
        write(
            table(
                ["run", "workflow", "status", "created"],
                [[c.id, c.workflow_name, c.status, _when(c.created_at)] for c in children],
            )
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


def _header(run: Run) -> str:
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
    if run.parent_run_id:
        fields.append(
            ("parent run", f"{run.parent_run_id} (on its end: {run.parent_close_policy})")
        )
    if run.forked_from_id or run.requester_unknown:
        fields.append(
            (
                "requesters",
                requesters.describe(run.requesters)
                + (" (four-eyes approvals need two approvers)" if run.requester_unknown else ""),
            )
        )
    if run.wake_at:
        fields.append(("retry at", _when(run.wake_at)))
    if run.error and run.error.get("type") == CANCELLED_ERROR_TYPE:
        fields.append(("cancelled", _first_line(run.error.get("message"))))
    elif run.error:
        error = run.error
        message = _first_line(error.get("message"))
        fields.append(("error", f"{error.get('type', '?')}: {message}"))
        if error.get("step_id"):
            fields.append(("error step", error["step_id"]))
        if error.get("classification"):
            fields.append(("classification", error["classification"]))
        if error.get("reason"):  # which rule made the failure final
            fields.append(("reason", _first_line(error["reason"])))
    fields.append(("input", _display(run.input)))
    if run.output is not None:
        fields.append(("output", _display(run.output)))
    label = max(len(k) for k, _ in fields)
    return "\n".join(f"{k + ':':<{label + 1}} {_clean(v)}" for k, v in fields)
