"""``manage.py durable_demo``: what ``make up`` runs to give a fresh checkout something to see.

- ``--ensure-admin``: create the demo superuser ``admin`` / ``admin`` if it is missing and
  print where to log in. Meant for the embedded default on a developer's machine only.
- default: start one ``examples.hello`` run and print its id. The run id is stable per day
  (``demo-hello-YYYYMMDD``), so running it again the same day finds the same run instead
  of piling up new ones; ``--run-id`` picks another id and ``--new`` a random one. It
  also declares the schedule ``demo-hello-hourly`` (the same workflow every hour).
- ``--wait SECONDS``: wait for the run to finish and print its output.
- ``--seed``: the live demo of ``make up`` (``examples/demo.py``): once the example
  services answer, start the reference-agent runs that show a pending approval, runs in
  progress, a failed run to compensate and an unknown outcome to reconcile; ``--stay``
  then keeps the process alive (honcho stops every process when one exits).

The run is created in the database and dispatched on commit; a worker picks it up when
it starts (with the embedded ``filesystem://`` broker the message waits in ``var/``).
The command lives with the examples it starts: ``durable/`` never imports them.
"""

from __future__ import annotations

import json
import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from examples import demo

DEMO_WORKFLOW = "examples.hello"
DEMO_SCHEDULE = "demo-hello-hourly"
DEMO_INPUT = {"name": "world", "language": "en"}
ADMIN_USERNAME = "admin"
ADMIN_PASSWORD = "admin"


class Command(BaseCommand):
    help = "Create the demo superuser (--ensure-admin) or start a sample examples.hello run."

    def add_arguments(self, parser):
        parser.add_argument(
            "--ensure-admin",
            action="store_true",
            help="create the superuser admin/admin if missing and print the login; starts no run",
        )
        parser.add_argument(
            "--run-id",
            default=None,
            help="run id to use (default: demo-hello-YYYYMMDD, one per day)",
        )
        parser.add_argument(
            "--new",
            action="store_true",
            help="start a run with a random id instead of the daily one",
        )
        parser.add_argument(
            "--wait",
            type=float,
            default=None,
            metavar="SECONDS",
            help="wait up to SECONDS for the run to finish and print its output",
        )
        parser.add_argument(
            "--seed",
            action="store_true",
            help="seed the reference-agent demo runs (needs the example "
            "services and a worker; see the Procfile)",
        )
        parser.add_argument(
            "--stay", action="store_true", help="with --seed: keep running afterwards (for honcho)"
        )
        parser.add_argument(
            "--url",
            default=None,
            help="base URL printed with the login "
            "(default: http://127.0.0.1:$PORT/, PORT defaulting to 8000)",
        )

    def handle(self, *args, **options):
        if options["ensure_admin"]:
            self._ensure_admin(options["url"])
            return
        if options["seed"]:
            self._seed(options)
            return
        self._start_demo(options)

    # ------------------------------------------------------------------ live demo

    def _seed(self, options) -> None:
        import time

        def log(text: str) -> None:
            self.stdout.write(f"[demo] {text}")
            self.stdout.flush()

        try:
            ids = demo.seed(log)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        base = options["url"] or f"http://127.0.0.1:{os.environ.get('PORT') or '8000'}/"
        self.stdout.write(
            self.style.SUCCESS(
                f"\nThe demo is at {base} -- log in as {ADMIN_USERNAME} / {ADMIN_PASSWORD}."
            )
        )
        for label, run_id in ids.items():
            self.stdout.write(f"  {label:<18} {base}runs/{run_id}/")
        self.stdout.flush()
        while options["stay"]:
            time.sleep(3600)

    # ------------------------------------------------------------------ admin user

    def _ensure_admin(self, url: str | None) -> None:
        User = get_user_model()
        user = User.objects.filter(**{User.USERNAME_FIELD: ADMIN_USERNAME}).first()
        if user is None:
            User.objects.create_superuser(ADMIN_USERNAME, "admin@example.com", ADMIN_PASSWORD)
            self.stdout.write(f"Created the demo superuser {ADMIN_USERNAME!r}.")
            password_known = True
        else:
            password_known = user.check_password(ADMIN_PASSWORD)
        base = url or f"http://127.0.0.1:{os.environ.get('PORT') or '8000'}/"
        login = (
            f"{ADMIN_USERNAME} / {ADMIN_PASSWORD}"
            if password_known
            else f"{ADMIN_USERNAME} (its password was changed from the demo default)"
        )
        self.stdout.write(self.style.SUCCESS(f"Open {base} — log in as {login}"))

    # ------------------------------------------------------------------ demo run

    def _start_demo(self, options) -> None:
        import durable

        if options["new"]:
            run_id = None
        else:
            run_id = options["run_id"] or f"demo-hello-{timezone.now():%Y%m%d}"
        try:
            run = durable.start(DEMO_WORKFLOW, DEMO_INPUT, run_id=run_id, tags=["demo"])
        except durable.WorkflowNotFound as exc:
            raise CommandError(f"{exc} (is 'examples' in INSTALLED_APPS?)") from exc
        except (durable.RunInputConflict, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        run.refresh_from_db()
        self.stdout.write(
            f"Demo run {run.id} ({run.workflow_name} version {run.workflow_version}): {run.status}"
        )
        # the Schedules page's example: declaring it again keeps its next slot
        schedule = durable.schedule(
            DEMO_SCHEDULE, DEMO_WORKFLOW, DEMO_INPUT, cron="0 * * * *", timezone="Europe/Berlin"
        )
        self.stdout.write(
            f"Demo schedule {schedule.name}: {DEMO_WORKFLOW} every hour, next "
            f"{schedule.next_slot_at:%H:%M} UTC"
        )
        if options["wait"] is None:
            return
        try:
            output = durable.result(run.id, timeout=options["wait"])
        except TimeoutError as exc:
            raise CommandError(f"{exc}; is a worker running (celery -A config worker)?") from exc
        except durable.RunFailed as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            self.style.SUCCESS(f"Run {run.id} succeeded: {json.dumps(output, ensure_ascii=False)}")
        )
