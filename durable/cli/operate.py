"""What ``manage.py durable`` does to keep a deployment for a year: ``prune`` and ``export``.

``prune`` deletes finished runs past their retention through :mod:`durable.services.retention`
(batched, never a run that something may still act on); ``prune --run ID`` deletes the
named runs now and exits 2 naming each run it kept and why. ``export`` writes a run's
audit document (:mod:`durable.services.export`) as JSON or as a readable HTML page.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from durable.cli.text import USER_ERROR, _clean
from durable.exceptions import RunNotFound
from durable.services import retention


def do_prune(command: BaseCommand, options: dict[str, Any]) -> None:
    write = command.stdout.write
    if options["runs"]:
        outcome = retention.prune_many(options["runs"], dry_run=options["dry_run"])
        if options["json"]:
            write(json.dumps(outcome, sort_keys=True))
        verb = "would prune" if options["dry_run"] else "pruned"
        for run_id in [] if options["json"] else outcome["pruned"]:
            write(f"{verb} run {run_id}")
        if outcome["kept"]:
            raise CommandError(
                "; ".join(_clean(reason) for reason in outcome["kept"].values()),
                returncode=USER_ERROR,
            )
        return
    if options["older_than"] is None and not _configured():
        write(
            "retention is not configured (DURABLE['RETENTION_SECONDS'] and "
            "RETENTION_SECONDS_BY_WORKFLOW are empty): nothing pruned; give --older-than "
            "SECONDS to prune anyway"
        )
        return
    report = retention.prune(
        older_than=options["older_than"],
        workflow=options["workflow"],
        batch_runs=options["batch"],
        pause=options["pause"],
        limit=options["limit"],
        dry_run=options["dry_run"],
    )
    if options["json"]:
        write(json.dumps(report, sort_keys=True))
        return
    verb = "would prune" if report["dry_run"] else "pruned"
    if report["dry_run"]:
        write(
            f"would prune {report['runs']} runs; {report['kept']} runs past their "
            "retention are kept"
        )
        for run_id, reason in report["kept_runs"].items():
            write(f"kept run {run_id}: {_clean(reason)}")
        if report["kept"] > len(report["kept_runs"]):
            write(f"... and {report['kept'] - len(report['kept_runs'])} more kept runs")
        return
    rows = ", ".join(f"{n} {name}" for name, n in sorted(report["rows"].items()) if n)
    write(
        f"{verb} {report['runs']} runs in {report['batches']} batches "
        f"({report['seconds']:.2f}s){': ' + rows if rows else ''}"
    )


def _configured() -> bool:
    from durable import conf

    by_workflow = conf.get("RETENTION_SECONDS_BY_WORKFLOW") or {}
    return conf.get("RETENTION_SECONDS") is not None or any(
        v is not None for v in by_workflow.values()
    )


def do_export(command: BaseCommand, options: dict[str, Any]) -> None:
    from durable.services import export

    try:
        document = export.export_run(options["run_id"])
    except RunNotFound as exc:
        raise CommandError(
            f"{_clean(exc)}; list runs with: manage.py durable runs", returncode=USER_ERROR
        ) from None
    render = export.render_html if options["format"] == "html" else export.to_json
    text = render(document)
    if options["output"]:
        with open(options["output"], "w", encoding="utf-8") as fh:
            fh.write(text)
        command.stdout.write(f"wrote {options['output']}")
    else:
        command.stdout.write(text)
