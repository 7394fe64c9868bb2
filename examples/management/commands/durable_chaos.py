"""``manage.py durable_chaos``: the chaos audit of the example agents (examples/chaos.py).

Starts N agent runs on worker processes it starts itself, SIGKILLs them at random,
decides approvals, sends signals, cancels and compensates as an operator would, ticks a
schedule and the outgoing webhooks' outbox as beat would, then audits the payments
service and the SMTP sink: duplicates, losses, end states, schedule slots, webhook
deliveries, compensations and the shared limit; and the scripted LLM's log for model
calls asked again. It lives with the agents it drives: ``durable/`` never imports the
examples. Exit 1 on any failed check.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from examples import chaos

#: the exit status when the audit found duplicates or losses
AUDIT_FAILED = 1


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _lease(text: str) -> float | None:
    if text == "default":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither seconds nor 'default'") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


class Command(BaseCommand):
    help = "chaos audit: N agent runs of eleven kinds on workers SIGKILLed at random"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = (
            "Start N agent runs (examples.support, .invoice, .procurement, .fanout, "
            ".family, .limited, .scheduled, .cascade, and the framework agents .langgraph, "
            ".pydantic_ai, .openai_agents, in turn; the .scheduled runs are "
            "started by a schedule this command declares and ticks, one slot a second) on "
            "worker processes this command starts, SIGKILL them at random, decide approvals, "
            "send signals, cancel the cascades mid-flight and compensate every other one as "
            "an operator would, deliver every run's end as a webhook to the payments "
            "service, then audit the payments service and the SMTP sink: duplicates, "
            "losses, end states, schedule slots, webhook deliveries, compensations and the "
            "shared limit measured at the service; and the scripted LLM's log for model "
            "calls asked again after they were recorded. Exits 1 on any failed check "
            "(examples/chaos.py, docs/examples.md)."
        )
        parser.add_argument(
            "--runs",
            type=_positive_int,
            default=30,
            metavar="N",
            help="how many runs to start, the eleven kinds in turn, the schedule's slots "
            "included (default 30)",
        )
        parser.add_argument(
            "--kill-every",
            type=float,
            default=3.0,
            metavar="SECONDS",
            help="mean seconds between two SIGKILLs (default 3; 0: no kills)",
        )
        parser.add_argument(
            "--workers",
            type=_positive_int,
            default=3,
            metavar="N",
            help="worker processes kept alive (default 3)",
        )
        parser.add_argument(
            "--lease",
            type=_lease,
            default=3.0,
            metavar="SECONDS",
            help="the workers' lease in seconds, or 'default' for the product's default lease "
            "and heartbeat (DURABLE['LEASE_SECONDS']; default 3)",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=900.0,
            metavar="SECONDS",
            help="give up waiting for the runs after SECONDS (default 900)",
        )
        parser.add_argument(
            "--seed",
            type=int,
            default=None,
            help="seed of the kill schedule and the agents' inputs, to replay an audit",
        )
        parser.add_argument(
            "--service-faults",
            type=float,
            default=0.0,
            metavar="RATE",
            help="also answer this share of the payments service's writes "
            "with 429, 503 or commit-then-drop (default 0)",
        )
        parser.add_argument(
            "--restart-services",
            action="store_true",
            help="restart PostgreSQL and Redis half way (CI machines only)",
        )
        parser.add_argument(
            "--clock-step",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="step one worker host's wall clock by SECONDS (negative: back) once it holds "
            "a run (examples/clock_skew.py; default 0: no step)",
        )
        parser.add_argument(
            "--partition",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="run one worker in a network namespace and, once it holds a run, cut its "
            "link to the database, the broker and the services for SECONDS (longer than "
            "the lease; kept cut until its runs were taken over); PostgreSQL + Redis and "
            "root only (default 0: no partition)",
        )
        parser.add_argument("--json", action="store_true", help="also print a JSON summary")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["kill_every"] < 0 or options["partition"] < 0:
            raise CommandError("--kill-every and --partition take 0 or more seconds")
        for name in ("kill_every", "partition", "clock_step", "timeout", "service_faults"):
            if not math.isfinite(options[name]):
                raise CommandError(f"--{name.replace('_', '-')} must be a finite number")
        try:
            status = chaos.main(options, self.stdout)
        except chaos.ChaosConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        if status != 0:
            raise CommandError(
                "the chaos audit found duplicates, losses or failed checks", returncode=AUDIT_FAILED
            )
