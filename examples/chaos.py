"""The chaos audit: ``manage.py durable_chaos --runs N --kill-every SECONDS``.

It starts its own example services (scripted LLM, payments service, SMTP sink) and its
own Celery workers, starts N runs of eight kinds in turn -- the reference agents
(support, invoice, procurement) and the agents of examples/chaos_agents.py (fanout: a
parallel group of writes and reads; family: a parent and two child runs; limited: calls
under a rate and concurrency limit shared by all the runs; scheduled: runs a schedule
starts, one per slot; cascade: a parent of billing children, cancelled mid-flight and
compensated) -- and then, until every run has ended and every webhook is delivered:

- SIGKILLs a random worker every ``--kill-every`` seconds (with jitter) and starts a
  fresh one, so runs lose their worker in the middle of LLM calls, refunds and emails;
- decides approvals as an operator would (``approvals.services.approval_decide`` with
  a user it creates, member of every approver group), letting some procurement
  approvals expire first so they escalate to finance;
- sends the procurement runs their "goods_received" signal (some before the run
  waits for it, some after);
- runs the sweeper, as Celery beat would;
- ticks the schedule and the outgoing webhooks' outbox, cancels and compensates the
  cascades (examples/chaos_operator.py).

Then it audits the services against the database (examples/chaos_audit.py): duplicate
refunds, tickets, orders, invoices and emails (the payments service's objects and the
SMTP sink's messages, per run with its child runs, per idempotency key and per business
identity), effects missing from succeeded runs, lost runs (started but absent), runs
not terminal, and (examples/chaos_checks.py) end states per kind, schedule slots,
webhook deliveries, writes after a cancel, compensations and the shared limit measured at
the service. It prints a table and the command exits non-zero on any failed check.
The runs' inputs are in examples/chaos_inputs.py.

``restart_services()`` restarts PostgreSQL and Redis in the middle of a run (opt-in:
``--restart-services``, for CI machines where those services belong to the test run).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.db import DatabaseError, InterfaceError, close_old_connections, connection

from . import chaos_agents as _chaos_agents  # noqa: F401 - registers the new kinds' agents
from .chaos_audit import EXPECTED, Report, audit
from .chaos_inputs import KINDS, NOT_STARTED, inputs
from .chaos_operator import Extras
from .procs import REPO, ServiceSet, admin

__all__ = ["EXPECTED", "KINDS", "Chaos", "Report", "main", "restart_services", "run_chaos"]

CELERY = Path(sys.executable).parent / "celery"
APPROVER_GROUPS = ("support-leads", "billing", "procurement", "finance")
OPERATOR = "chaos-operator"
#: who the chaos runs are started by (four-eyes: not the operator who approves them)
REQUESTER = "os:chaos-requester"


# ---------------------------------------------------------------------- workers


class ChaosWorker:
    def __init__(self, name: str, env: dict[str, str], folder: Path) -> None:
        self.name = name
        self.log_path = folder / f"{name}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [
                str(CELERY),
                "-A",
                "config",
                "worker",
                "--pool=solo",
                "--concurrency=1",
                "--without-mingle",
                "--without-gossip",
                "-n",
                f"{name}@%h",
                "--loglevel=INFO",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def database_url() -> str:
    """A ``DATABASE_URL`` for the database this process uses (workers must share it)."""
    sd = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(str(sd['NAME'])).resolve()}"
    if connection.vendor == "postgresql":
        user = quote(sd.get("USER") or "", safe="")
        password = quote(sd.get("PASSWORD") or "", safe="")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        port = f":{sd['PORT']}" if sd.get("PORT") else ""
        host = sd.get("HOST") or "127.0.0.1"
        return f"postgres://{auth}{host}{port}/{quote(sd['NAME'], safe='')}"
    raise RuntimeError(f"the chaos audit does not support the {connection.vendor} backend")


def broker_var_dir() -> Path:
    """The var folder whose ``broker/`` this process sends to (filesystem transport)."""
    from config.celery import app

    options = app.conf.broker_transport_options or {}
    folder = options.get("data_folder_in")
    return Path(folder).parent.parent if folder else Path(settings.VAR_DIR)


# ------------------------------------------------------------ services and operator


def restart_services(log: Callable[[str], None] = print) -> None:
    """Restart PostgreSQL and Redis (CI's): ``pg_ctlcluster ... restart``, then
    ``redis-cli shutdown nosave`` and the ``redis-server`` command of ``.ci/run``.

    ``DURABLE_CHAOS_PG_CLUSTER`` (default ``main``) names the cluster; the version is the
    newest under /etc/postgresql. Redis' port comes from ``CELERY_BROKER_URL``.
    """
    versions = sorted(
        os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".") if p.isdigit()]
    )
    cluster = os.environ.get("DURABLE_CHAOS_PG_CLUSTER", "main")
    log(f"restarting PostgreSQL {versions[-1]}/{cluster}")
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], cluster, "restart"],
        check=True,
        timeout=120,
    )
    broker = urlsplit(str(settings.CELERY_BROKER_URL))
    if broker.scheme in ("redis", "rediss"):
        port = str(broker.port or 6379)
        log(f"restarting Redis on port {port}")
        subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", port, "shutdown", "nosave"],
            timeout=30,
            check=False,
            capture_output=True,
        )
        Path("/var/lib/redis").mkdir(parents=True, exist_ok=True)
        Path("/var/log/redis").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "redis-server",
                "--daemonize",
                "yes",
                "--bind",
                "127.0.0.1",
                "-::1",
                "--port",
                port,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                "/var/lib/redis",
                "--logfile",
                "/var/log/redis/ci.log",
            ],
            check=True,
            timeout=30,
        )
        for _ in range(60):
            ping = subprocess.run(
                ["redis-cli", "-h", "127.0.0.1", "-p", port, "ping"],
                capture_output=True,
                text=True,
                check=False,
            )
            if ping.stdout.strip() == "PONG":
                break
            time.sleep(0.5)


def _operator() -> Any:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    User = get_user_model()
    user = User.objects.filter(username=OPERATOR).first()
    if user is None:
        user = User.objects.create_user(OPERATOR, f"{OPERATOR}@example.com", None)
    user.user_permissions.add(
        Permission.objects.get(codename="decide_approval", content_type__app_label="approvals")
    )
    for name in APPROVER_GROUPS:
        group, _ = Group.objects.get_or_create(name=name)
        user.groups.add(group)
    return User.objects.get(pk=user.pk)


class Chaos:
    def __init__(
        self,
        *,
        runs: int,
        kill_every: float,
        workers: int = 3,
        lease: float = 3.0,
        timeout: float = 600.0,
        seed: int | None = None,
        service_faults: float = 0.0,
        folder: Path | None = None,
        midway: Callable[[], None] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.n_runs = runs
        self.kill_every = kill_every
        self.n_workers = workers
        self.lease = lease
        self.timeout = timeout
        self.rng = random.Random(seed)
        self.service_faults = service_faults
        self.folder = folder or Path(tempfile.mkdtemp(prefix="chaos-", dir=settings.VAR_DIR))
        self.midway = midway
        self.log = log
        self.report = Report()
        self.workers: list[ChaosWorker] = []
        self.services: ServiceSet | None = None
        self.plans: dict[str, dict[str, Any]] = {}
        self.signalled: set[str] = set()
        self.extras: Extras | None = None
        self._names = 0

    # ------------------------------------------------------------------ running

    def run(self) -> Report:
        started = time.monotonic()
        saved_env = dict(os.environ)
        saved_durable = dict(settings.DURABLE)
        try:
            self.services = ServiceSet.start(self.folder / "services")
            os.environ.update(self.services.env())
            # this process dispatches, sweeps and decides as beat and an operator would
            settings.DURABLE = {
                **settings.DURABLE,
                "DISPATCH": "celery",
                "REDISPATCH_AFTER_SECONDS": 5.0,
            }
            if self.service_faults:
                admin(
                    self.services.payments_url,
                    "POST",
                    "/_admin/chaos",
                    {
                        "rate": self.service_faults,
                        "faults": ["429", "503", "drop"],
                        "methods": ["POST"],
                    },
                )
            self.operator = _operator()
            env = self._worker_env()
            for _ in range(self.n_workers):
                self._start_worker(env)
            self._start_runs()
            self._loop(env, started)
            if self.service_faults:
                admin(self.services.payments_url, "DELETE", "/_admin/chaos")
            self._audit()
        finally:
            for worker in self.workers:
                worker.kill()
            if self.services is not None:
                self.services.stop()
            os.environ.clear()
            os.environ.update(saved_env)
            settings.DURABLE = saved_durable
            self.report.seconds = time.monotonic() - started
        return self.report

    def _worker_env(self) -> dict[str, str]:
        assert self.services is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CRASH_"))}
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "config.settings",
                "PYTHONPATH": str(REPO),
                "PYTHONUNBUFFERED": "1",
                "DATABASE_URL": database_url(),
                "CELERY_BROKER_URL": str(settings.CELERY_BROKER_URL),
                "DURABLE_VAR_DIR": str(broker_var_dir()),
                "DJANGO_SECRET_KEY": str(settings.SECRET_KEY),
                "DURABLE_DISPATCH": "celery",
                # the reference and chaos agents only: a worker killed every few seconds
                # must not spend them importing the framework agents' libraries
                "DURABLE_AUTODISCOVER": "false",
                "DURABLE_WORKFLOW_MODULES": "examples.workflows,examples.chaos_agents,"
                "api.workflows",
                "DURABLE_LEASE_SECONDS": str(self.lease),
                "DURABLE_INPROCESS_RETRY_MAX_SECONDS": "5",
                # the audit is about duplicates and losses under random kills; with a kill
                # every few seconds a slow step (under load) can be hit three times, which
                # the poison-step guard rightly fails (tests/processes covers that guard)
                "DURABLE_MAX_WORKER_LOST_ATTEMPTS": "10",
                **self.services.env(),
            }
        )
        env.pop("DURABLE_HEARTBEAT_SECONDS", None)
        return env

    def _start_worker(self, env: dict[str, str]) -> None:
        self._names += 1
        self.workers.append(ChaosWorker(f"chaos{os.getpid()}w{self._names}", env, self.folder))
        self.report.workers_started += 1

    def _start_runs(self) -> None:
        import durable

        stamp = datetime.now().strftime("%Y%m%d%H%M%S")
        kinds = [KINDS[i % len(KINDS)] for i in range(self.n_runs)]
        # schedule, webhooks, cascades: examples/chaos_operator.py
        self.extras = Extras(self, stamp, slots=sum(k in NOT_STARTED for k in kinds))
        assert self.services is not None
        self.extras.setup(self.services.payments_url)
        for i, kind in enumerate(kinds):
            data, plan = inputs(i, kind, self.rng)
            if kind in NOT_STARTED:
                continue  # a slot of the schedule: the tick starts its run
            # a known requester, not the operator: four-eyes lets the operator approve
            run = durable.start(
                f"examples.{kind}",
                data,
                run_id=f"chaos-{stamp}-{i:03d}-{kind}",
                tags=["chaos"],
                max_tokens=100_000,
                started_by=REQUESTER,
            )
            self.report.runs[run.id] = kind
            self.plans[run.id] = plan
            if plan.get("early_signal"):
                self._signal(run.id)
        self.log(f"started {self.n_runs} runs; killing a worker every ~{self.kill_every:g} s")

    def _loop(self, env: dict[str, str], started: float) -> None:
        from durable.worker.sweeper import sweep

        deadline = started + self.timeout
        next_kill = time.monotonic() + self._jitter()
        next_sweep = 0.0
        next_note = time.monotonic() + 10
        midway_done = self.midway is None
        waiting = ""
        while time.monotonic() < deadline:
            now = time.monotonic()
            try:
                remaining = self._remaining()
                if not remaining and not (waiting := self.extras and self.extras.pending()):
                    return
                if now >= next_sweep:
                    sweep()
                    next_sweep = now + 0.5
                self._operate(remaining)
                if self.extras is not None:
                    self.extras.operate(remaining)
            except (DatabaseError, InterfaceError) as exc:  # PostgreSQL restarting
                self.log(f"database unavailable ({type(exc).__name__}: {exc}); retrying")
                close_old_connections()
                connection.close()
                time.sleep(0.5)
                continue
            if not midway_done and len(remaining) <= self.n_runs // 2:
                midway_done = True
                self.log("midway: running the restart hook")
                self.midway()
                self.report.restarts += 1
            if now >= next_kill:
                alive = [w for w in self.workers if w.alive()]
                if alive:
                    victim = self.rng.choice(alive)
                    victim.kill()
                    self.report.kills += 1
                    self._start_worker(env)
                next_kill = now + self._jitter()
            for worker in [w for w in self.workers if not w.alive()]:
                self.workers.remove(worker)
                if len([w for w in self.workers if w.alive()]) < self.n_workers:
                    self._start_worker(env)
            if now >= next_note:
                kinds = Counter(self.report.runs[r] for r in remaining)
                self.log(
                    f"{len(remaining)} runs not finished ({', '.join(sorted(kinds))}); "
                    f"{self.report.kills} kills"
                    + (f"; {waiting}" if not remaining and waiting else "")
                )
                next_note = now + 5
            time.sleep(0.2)
        self.log(f"gave up waiting after {self.timeout:g} s")

    def _jitter(self) -> float:
        return self.kill_every * self.rng.uniform(0.5, 1.5)

    def _remaining(self) -> list[str]:
        from durable.models import TERMINAL, Run

        return list(
            Run.objects.filter(pk__in=list(self.report.runs))
            .exclude(status__in=TERMINAL)
            .values_list("id", flat=True)
        )

    def _operate(self, remaining: list[str]) -> None:
        """Decide pending approvals and send due signals, as an operator would."""
        from approvals.models import ApprovalRequest, ApprovalStatus
        from approvals.services import approval_decide
        from durable.exceptions import DurableError
        from durable.models import Wait, WaitKind, WaitStatus

        pending = ApprovalRequest.objects.filter(
            run_id__in=remaining, status=ApprovalStatus.PENDING
        )
        for req in pending:
            if self.plans.get(req.run_id, {}).get("escalate") and req.escalated_at is None:
                continue  # let it expire into finance's hands first
            try:
                approval_decide(
                    request_id=req.pk, user=self.operator, approve=True, comment="chaos operator"
                )
            except DurableError:
                continue  # decided meanwhile, or the run moved on
            self.report.approvals += 1
            if req.escalated_at is not None:
                self.report.escalations += 1
        waiting = Wait.objects.filter(
            run_id__in=remaining,
            kind=WaitKind.SIGNAL,
            status=WaitStatus.PENDING,
            key="goods_received",
        )
        for run_id in waiting.values_list("run_id", flat=True):
            self._signal(run_id)

    def _signal(self, run_id: str) -> None:
        import durable

        if run_id in self.signalled:
            return
        durable.signal(
            run_id,
            "goods_received",
            {"received_by": OPERATOR},
            dedupe_key=f"{run_id}:goods_received",
            by=OPERATOR,
        )
        self.signalled.add(run_id)
        self.report.signals += 1

    # -------------------------------------------------------------------- audit

    def _audit(self) -> None:
        assert self.services is not None
        audit(
            self.report,
            payments_url=self.services.payments_url,
            sink_url=self.services.sink_url,
            llm_url=self.services.llm_url,
            plans=self.plans,
            extras=self.extras,
        )
        if self.extras is not None:
            self.extras.teardown()


def run_chaos(**options: Any) -> Report:
    """Run the chaos audit (see :class:`Chaos` for the options); returns its report."""
    return Chaos(**options).run()


def main(options: dict[str, Any], stdout: Any) -> int:
    """``manage.py durable_chaos``: run, print the table, return the exit status."""

    def log(text: str) -> None:
        stdout.write(f"[chaos] {text}\n")
        stdout.flush()

    midway = (lambda: restart_services(log)) if options.get("restart_services") else None
    report = run_chaos(
        runs=options["runs"],
        kill_every=options["kill_every"],
        workers=options["workers"],
        lease=options["lease"],
        timeout=options["timeout"],
        seed=options.get("seed"),
        service_faults=options["service_faults"],
        midway=midway,
        log=log,
    )
    stdout.write(report.table() + "\n")
    if options.get("json"):
        stdout.write(
            json.dumps(
                {
                    "ok": report.ok,
                    "duplicates": report.duplicate_count,
                    "lost": len(report.lost),
                    "not_terminal": len(report.not_terminal),
                    "statuses": dict(report.statuses),
                }
            )
            + "\n"
        )
    return 0 if report.ok else 1
