"""What ``manage.py durable`` changes: ``start``, the run transitions, ``sweep``, ``reconcile``.

Every state change goes through :mod:`durable.client`, :mod:`durable.services.runs` or
:mod:`durable.worker.sweeper`, the same functions the dashboard and the admin call, and each
refusal they raise (unknown run or operation, illegal transition, bad payload) becomes a
``CommandError`` with exit code 2 and a message saying what to do next. Separate from
:mod:`durable.cli.inspection`, which only reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.management.base import BaseCommand, CommandError

from durable import client as api
from durable.cli.text import (
    RUN_DID_NOT_SUCCEED,
    USER_ERROR,
    _clean,
    _default_actor,
    _first_line,
    _output_json,
    _parse_json,
)
from durable.exceptions import (
    IllegalTransition,
    KeyConflict,
    PayloadError,
    RunInputConflict,
    RunNotFound,
    WorkflowNotFound,
)
from durable.models import TERMINAL, Run, RunStatus
from durable.services import runs as services
from durable.worker import sweeper

T = TypeVar("T")


# --- transitions (the same services as the dashboard and the admin) ------------------


def _transition(call: Callable[[], T]) -> T:
    try:
        return call()
    except RunNotFound as exc:
        raise CommandError(
            f"{_clean(exc)}; list runs with: manage.py durable runs", returncode=USER_ERROR
        ) from None
    except (IllegalTransition, KeyConflict, PayloadError, ValueError) as exc:
        raise CommandError(_clean(exc), returncode=USER_ERROR) from None


def _run_action(command: BaseCommand, options: dict[str, Any], service: Any) -> None:
    run = _transition(
        lambda: service(
            run_id=options["run_id"],
            by=options["by"] or _default_actor(),
            reason=options["reason"],
        ),
    )
    command.stdout.write(f"run {run.id} is {run.status}")


def do_cancel(command: BaseCommand, options: dict[str, Any]) -> None:
    _run_action(command, options, services.run_cancel)


def do_resume(command: BaseCommand, options: dict[str, Any]) -> None:
    _run_action(command, options, services.run_resume)


def do_compensate(command: BaseCommand, options: dict[str, Any]) -> None:
    _run_action(command, options, services.run_compensate)


def do_fork(command: BaseCommand, options: dict[str, Any]) -> None:
    from durable.services.forks import SAME_INPUT

    edited = options.get("input") is not None
    new_input = _parse_json(options["input"], "--input") if edited else SAME_INPUT
    fork = _transition(
        lambda: services.run_fork(
            run_id=options["run_id"],
            from_step=options["from_step"],
            by=options["by"] or _default_actor(),
            reason=options["reason"],
            input=new_input,
        ),
    )
    command.stdout.write(
        f"run {fork.id} started, forked from {options['run_id']} at step {options['from_step']!r}"
        + (" with the input given" if edited else "")
    )


def do_signal(command: BaseCommand, options: dict[str, Any]) -> None:
    payload = _parse_json(options["payload"], "--payload")
    sent = _transition(
        lambda: services.run_signal(
            run_id=options["run_id"],
            name=options["name"],
            payload=payload,
            dedupe_key=options["dedupe_key"],
            by=options["by"] or _default_actor(),
        ),
    )
    # e.g. "run R: signal 'goods-received': kept; this run waits on goods_received, ..."
    command.stdout.write(f"run {options['run_id']}: {_clean(sent.message)}")


# --- start ---------------------------------------------------------------------------


def do_start(command: BaseCommand, options: dict[str, Any]) -> None:
    value = _parse_json(options["input"], "--input")
    run_id = options["run_id"]
    try:
        run, created = api.start_or_get(
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
    if not created:
        command.stderr.write(
            f"run {run.id} already exists with this workflow and input "
            f"({run.status}); it was not started again"
        )
    command.stdout.write(run.id)
    if options["wait"] is not None:
        _wait(command, run.id, options["wait"])


def _wait(command: BaseCommand, run_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        run = api.get_run(run_id)
        if run.status in TERMINAL or time.monotonic() >= deadline:
            break
        time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
        delay = min(delay * 1.5, 1.0)
    if run.status == RunStatus.SUCCEEDED:
        command.stdout.write(_output_json(run.output))
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


# --- sweep ---------------------------------------------------------------------------


def do_sweep(command: BaseCommand, options: dict[str, Any]) -> None:
    result = sweeper.sweep()
    labels = [
        ("expired", "expired leases"),
        ("due", "due retries"),
        ("timers", "due timers"),
        ("pending", "undispatched pending runs"),
    ]
    label = max(len(text) for _, text in labels)
    for key, text in labels:
        command.stdout.write(f"{text + ':':<{label + 1}} {result.get(key, 0)}")
    run_ids = result.get("run_ids") or []
    command.stdout.write(f"dispatched {len(run_ids)} run(s)")
    if options["verbosity"] >= 2:
        for run_id in run_ids:
            command.stdout.write(f"  {run_id}")


# --- reconcile -----------------------------------------------------------------------


def _do_lookup(command: BaseCommand, operation: str) -> None:
    try:
        found = services.operation_lookup(operation_id=operation)
    except services.OperationNotFound as exc:
        raise CommandError(_clean(exc), returncode=USER_ERROR) from None
    except IllegalTransition as exc:
        raise CommandError(_clean(exc), returncode=USER_ERROR) from None
    if found.found is True:
        command.stdout.write(
            f"operation {found.operation_id} ({found.tool_name}): found, it happened"
        )
        if found.external_id:
            command.stdout.write(f"external id: {_clean(found.external_id)}")
        command.stdout.write("result: " + json.dumps(found.result, default=str, ensure_ascii=False))
        command.stdout.write(
            f"record it: manage.py durable reconcile {found.operation_id} --happened --result JSON"
        )
    elif found.found is False:
        command.stdout.write(
            f"operation {found.operation_id} ({found.tool_name}): not found, it did not happen"
        )
        command.stdout.write(
            f"record it: manage.py durable reconcile {found.operation_id} --not-happened"
        )
    else:
        raise CommandError(
            f"operation {found.operation_id} ({found.tool_name}): the lookup could not tell: "
            f"{_clean(found.error)}",
            returncode=USER_ERROR,
        )


def do_reconcile(command: BaseCommand, options: dict[str, Any]) -> None:
    outcome = options["outcome"]
    if outcome == "lookup":
        if options["result"] is not None or options["external_id"] or options["reason"]:
            raise CommandError(
                "--lookup changes nothing: it takes no --result, --external-id or --reason",
                returncode=USER_ERROR,
            )
        _do_lookup(command, options["operation"])
        return
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
    command.stdout.write(
        f"operation {op.pk} ({_clean(op.idempotency_key)}): {outcome.replace('_', ' ')}"
    )
    if outcome == "abort":
        command.stdout.write(f"run {run.id} is {run.status}")
    elif run.status == RunStatus.COMPENSATING:
        command.stdout.write(f"run {run.id} is compensating: a worker goes on with it")
    elif run.is_terminal:
        command.stdout.write(
            f"run {run.id} stays {run.status}: recorded in the ledger (its "
            "compensation undoes what happened)"
        )
    else:
        command.stdout.write(
            f"run {run.id} is {run.status}: a worker resumes it"
            + (
                " and calls the tool again with the same idempotency key"
                if outcome == "not_happened"
                else ""
            )
        )
