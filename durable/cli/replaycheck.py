"""``manage.py durable replay-check``: recorded runs against the code installed now.

Reads only (:mod:`durable.worker.replay_check`), so it may run in CI against production
under a role that can only ``SELECT``. Prints each diverged run (the step the history
expects beside the call the code makes, with its file and line), grouped by workflow
and version, or the JSON report with ``--json``. Exit codes: 0 every run is
compatible; 1 a run diverged (or its version is not registered); 2 a user error.
See docs/deploying.md.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from durable.cli.text import _clean

#: exit code when a run diverged
DIVERGED = 1

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def since_arg(text: str) -> datetime:
    """``--since``: an ISO date or date-time (naive: the current time zone), or an age
    such as ``30m``, ``12h``, ``7d``, ``2w``."""
    text = text.strip()
    m = _RELATIVE.match(text)
    if m:
        return timezone.now() - timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    try:
        when = parse_datetime(text)
        if when is None:
            day = parse_date(text)
            when = datetime(day.year, day.month, day.day) if day is not None else None
    except ValueError:
        when = None
    if when is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO date or date-time nor an age like 12h or 7d"
        )
    return timezone.make_aware(when) if timezone.is_naive(when) else when


def do_replay_check(
    command: BaseCommand, options: dict[str, Any], *, check: Callable[..., dict[str, Any]]
) -> None:
    """Run ``check`` (``durable.worker.dry.check_runs``, given by the command's wiring:
    this module formats, the engine replays) and print its report."""
    report = check(
        workflow=options["workflow"],
        version=options["version"],
        status=options["status"],
        sample=options["sample"],
        since=options["since"],
        seed=options["seed"],
    )
    write = command.stdout.write
    if options["json"]:
        write(json.dumps(report, sort_keys=True))
    else:
        for line in _lines(report):
            write(line)
    if report["diverged"]:
        raise CommandError(
            f"{report['diverged']} of {report['checked']} runs diverged from their history: "
            "deploy the change under a new workflow version, or keep the old code "
            "registered until those runs end (docs/deploying.md)",
            returncode=DIVERGED,
        )


def _lines(report: dict[str, Any]) -> list[str]:
    sel = report["selection"]
    which = "open runs" if sel["status"] == "open" else "runs (any status)"
    what = which + (f" of {sel['workflow']}" if sel["workflow"] else "")
    out = [
        f"replay check: {report['checked']} {what} checked in {report['seconds']:.2f}s, "
        f"{report['diverged']} diverged"
    ]
    for g in report["groups"]:
        outcomes = ", ".join(f"{n} {name}" for name, n in sorted(g["outcomes"].items()))
        head = f"{g['workflow']} version {g['version']}: {g['checked']} checked"
        if not g["registered"]:
            out.append(f"{head}: NOT REGISTERED in this code")
        else:
            out.append(f"{head}, {g['diverged']} diverged ({outcomes})")
        for r in g["runs"]:
            d = r["divergence"]
            out.append(f"  run {_clean(r['run_id'])} ({r['status']}): {_clean(d['message'])}")
            if d["expected"] is not None or d["got"] is not None:
                out.append(f"    history expects: {_call(d['expected'])}")
                out.append(f"    code calls:      {_call(d['got'])}")
            if d["file"]:
                out.append(f"    at {_clean(d['file'])}:{d['line']}")
    return out


def _call(call: dict[str, str] | None) -> str:
    if call is None:
        return "(nothing)"
    tool = f", tool {call['tool']}" if call.get("tool") else ""
    return _clean(f"{call['step_id']} ({call['kind']}{tool})")
