"""The chaos audit: ``manage.py durable_chaos --runs N --kill-every SECONDS``.

It starts its own example services (scripted LLM, payments service, SMTP sink) and its
own Celery workers, starts N runs of eleven kinds in turn -- the reference agents
(support, invoice, procurement), the agents of examples/chaos_agents.py (fanout: a
parallel group of writes and reads; family: a parent and two child runs; limited: calls
under a rate and concurrency limit shared by all the runs; scheduled: runs a schedule
starts, one per slot; cascade: a parent of billing children, cancelled mid-flight and
compensated) and those of examples/chaos_frameworks.py (langgraph, pydantic_ai,
openai_agents: the framework adapters with a scripted model, a ticket and a refund each)
-- and then, until every run has ended and every webhook is delivered:

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
identity), framework runs' model calls asked again after they were recorded, effects
missing from succeeded runs, lost runs (started but absent), runs not terminal, and
(examples/chaos_checks.py) end states per kind, schedule slots, webhook deliveries,
writes after a cancel, compensations and the shared limit measured at the service. It
prints a table and the command exits non-zero on any failed check. The runs' inputs are
in examples/chaos_inputs.py.

``restart_services()`` restarts PostgreSQL and Redis in the middle of a run (opt-in:
``--restart-services``, for CI machines where those services belong to the test run).

``--partition SECONDS`` (PostgreSQL + Redis, root) starts one worker on a host of its
own -- a network namespace, examples/chaos_partition.py -- and, once it holds a run, cuts
that host off from the database, the broker and the services for at least SECONDS
(longer than the lease) and until another worker recovered every run it held; then
restores the link. The report names the runs held, taken over and whose late writes the
lease fence refused (the cut-off worker's log says it lost their lease).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, close_old_connections, connection
from django.utils import timezone

from durable import conf

from . import chaos_agents as _chaos_agents  # noqa: F401 - registers the new kinds' agents
from . import chaos_frameworks as _chaos_frameworks  # noqa: F401 - the framework kinds
from .chaos_audit import EXPECTED, Report, audit
from .chaos_inputs import KINDS, NOT_STARTED, inputs
from .chaos_operator import Extras
from .chaos_partition import Partition, unavailable
from .procs import REPO, Forked, ServiceSet, admin

__all__ = [
    "EXPECTED",
    "KINDS",
    "Chaos",
    "ChaosConfigurationError",
    "Report",
    "main",
    "restart_services",
    "run_chaos",
]

CELERY = Path(sys.executable).parent / "celery"
#: seconds the other workers wait for the cut-off or clock-stepped worker to hold a run
DEFER_OTHERS = 30.0
APPROVER_GROUPS = ("support-leads", "billing", "procurement", "finance")
OPERATOR = "chaos-operator"
#: who the chaos runs are started by (four-eyes: not the operator who approves them)
REQUESTER = "os:chaos-requester"


# ---------------------------------------------------------------------- workers


class ClockStep:
    """The wall clock of one worker *host* stepped by ``seconds`` (examples/clock_skew.py).

    Every worker started in this slot (the first one, and each that replaces it after a
    kill) reads its clock's offset from one file that starts at ``+0``; :meth:`step`
    writes the offset, which the workers read within 0.2 s (their
    ``django.utils.timezone.now()`` jumps; monotonic clocks do not, as when NTP steps a
    host's clock). ``seconds`` may be negative (a step back).
    """

    def __init__(self, seconds: float, folder: Path) -> None:
        self.seconds = seconds
        self.file = folder / "clock-offset"
        self.file.write_text("+0\n")
        self.stepped = False

    def command(self) -> list[str]:
        """What runs a worker with this clock, before Celery's own arguments."""
        return [sys.executable, "-m", "examples.clock_skew", str(self.file)]

    def step(self) -> None:
        self.file.write_text(f"{self.seconds:+.0f}\n")
        self.stepped = True


class ChaosWorker:
    """A Celery worker process (solo pool), forked from the audit's fork server;
    ``partition``: started inside that network namespace instead (``ip netns exec``),
    with ``env`` pointed at its gateway; ``clock``: with that host's stepped clock."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        folder: Path,
        partition: Partition | None = None,
        clock: ClockStep | None = None,
    ) -> None:
        self.name = name
        self.partition = partition
        self.log_path = folder / f"{name}.log"
        argv = [
            "celery",
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
        ]
        self.proc: Any
        if partition is None:
            stepped = {"CLOCK_OFFSET_FILE": str(clock.file)} if clock is not None else {}
            self.proc = Forked(argv, {**env, **stepped}, self.log_path)
        else:
            command = [*(clock.command() if clock is not None else [str(CELERY)]), *argv[1:]]
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    partition.command(command),
                    cwd=REPO,
                    env=partition.env(env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        #: started with the clock-stepped host's clock (:class:`ClockStep`)
        self.skewed = clock is not None

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def lease_prefix(self) -> str:
        """How the leases this process holds begin (``host:pid:``; ``ip netns exec``
        execs the worker, so the pid is the process's)."""
        return f"{socket.gethostname()}:{self.proc.pid}:"

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
        lease: float | None = 3.0,
        timeout: float = 600.0,
        seed: int | None = None,
        service_faults: float = 0.0,
        clock_step: float = 0.0,
        folder: Path | None = None,
        midway: Callable[[], None] | None = None,
        partition: float = 0.0,
        partitioned_workers: int = 1,
        log: Callable[[str], None] = print,
    ) -> None:
        self.n_runs = runs
        self.kill_every = kill_every
        self.n_workers = workers
        self.lease = lease
        self.timeout = timeout
        self.rng = random.Random(seed)
        self.service_faults = service_faults
        self.clock_step_seconds = clock_step
        self.clock_step: ClockStep | None = None
        self.folder = folder or Path(tempfile.mkdtemp(prefix="chaos-", dir=settings.VAR_DIR))
        self.midway = midway
        self.partition_seconds = partition
        self.n_partitioned = partitioned_workers if partition else 0
        self.partition: Partition | None = None
        #: run id -> lease token, of the runs a cut-off worker held when the link dropped
        self.cut_held: dict[str, str] = {}
        self.cut_at = 0.0
        self.cut_since: datetime | None = None
        self.log = log
        self.report = Report()
        self.workers: list[ChaosWorker] = []
        self.services: ServiceSet | None = None
        self.plans: dict[str, dict[str, Any]] = {}
        self.signalled: set[str] = set()
        self.extras: Extras | None = None
        self._names = 0
        #: the workers not started yet: they wait for the cut-off or clock-stepped one
        self.deferred = 0
        #: the run ids of this audit begin ``chaos-<stamp>-`` (set when the runs start)
        self.stamp = ""

    # ------------------------------------------------------------------ running

    def run(self) -> Report:
        started = time.monotonic()
        saved_env = dict(os.environ)
        saved_durable = dict(settings.DURABLE)
        if self.partition_seconds:
            self._check_partition()
        if self.clock_step_seconds and connection.vendor != "postgresql":
            raise ChaosConfigurationError(
                "--clock-step needs PostgreSQL (DATABASE_URL=postgres://...): on the "
                f"embedded default ({connection.vendor}) every worker runs on the one machine "
                "that holds the database file, and shares its one clock"
            )
        try:
            self.services = ServiceSet.start(self.folder / "services")
            os.environ.update(self.services.env())
            if self.partition_seconds:
                self.partition = Partition(self._partition_ports())
                self.partition.start()
                self.log(
                    f"{self.n_partitioned} worker(s) in network namespace "
                    f"{self.partition.name} (gateway {self.partition.gateway})"
                )
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
            if self.clock_step_seconds:
                self.clock_step = ClockStep(self.clock_step_seconds, self.folder)
            # the first workers are cut off, the last one's host has the stepped clock;
            # those start alone, and the others once one of them held a run (or after
            # DEFER_OTHERS seconds): with every worker up at once, the few short runs of
            # a small audit may all go to the others, and the fault never happens
            kinds = [
                (i < self.n_partitioned, self.clock_step is not None and i == self.n_workers - 1)
                for i in range(self.n_workers)
            ]
            special = [kind for kind in kinds if any(kind)]
            for partitioned, skewed in special or kinds:
                self._start_worker(env, partitioned=partitioned, skewed=skewed)
            self.deferred = len(kinds) - len(special) if special else 0
            self._start_runs()
            stop = threading.Event()
            killer = threading.Thread(
                target=self._kill_and_replace, args=(env, stop), name="chaos-killer", daemon=True
            )
            killer.start()
            try:
                self._loop(env, started)
            finally:
                stop.set()
                killer.join(timeout=30)
            if self.partition is not None and self.partition.is_cut:
                self.partition.restore()  # the loop gave up while cut: the audit needs it
            if self.service_faults:
                admin(self.services.payments_url, "DELETE", "/_admin/chaos")
            self._audit()
            self._audit_partition()
        finally:
            for worker in self.workers:
                worker.kill()
            if self.partition is not None:
                self.partition.stop()
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
                # must not spend them importing the framework agents' libraries (the
                # chaos framework agents import theirs on their first execution)
                "DURABLE_AUTODISCOVER": "false",
                "DURABLE_WORKFLOW_MODULES": "examples.workflows,examples.chaos_agents,"
                "examples.chaos_frameworks,api.workflows",
                "DURABLE_INPROCESS_RETRY_MAX_SECONDS": "5",
                # the audit is about duplicates and losses under random kills; with a kill
                # every few seconds a slow step (under load) can be hit three times, which
                # the poison-step guard rightly fails (tests/processes covers that guard);
                # a framework run's first execution on each fresh worker also imports its
                # framework (1-3 s), so near the end, when kills hit the few runs left, one
                # can lose 9 workers in a row at one step (seen on a loaded 2-core machine)
                "DURABLE_MAX_WORKER_LOST_ATTEMPTS": "20",
                # the audit's webhook receiver is the payments service on 127.0.0.1, and
                # outgoing webhooks reach public addresses only unless allow-listed
                # (docs/security.md#outgoing-webhooks). A range, not 127.0.0.1/32: a
                # partitioned worker's environment has 127.0.0.1 pointed at its gateway
                # (Partition.env), while the subscription's URL still names 127.0.0.1
                "DURABLE_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
                **self.services.env(),
            }
        )
        env.pop("DURABLE_HEARTBEAT_SECONDS", None)
        env.pop("DURABLE_LEASE_SECONDS", None)
        if self.lease is not None:  # None: the default lease and heartbeat (docs/settings.md)
            env["DURABLE_LEASE_SECONDS"] = str(self.lease)
        return env

    def _start_worker(
        self, env: dict[str, str], partitioned: bool = False, skewed: bool = False
    ) -> None:
        self._names += 1
        name = f"chaos{os.getpid()}w{self._names}{'p' if partitioned else ''}"
        if skewed:
            name += "-skewed"
        partition = self.partition if partitioned else None
        worker = ChaosWorker(name, env, self.folder, partition, self.clock_step if skewed else None)
        self.workers.append(worker)
        self.report.workers_started += 1

    def _start_runs(self) -> None:
        import durable

        stamp = self.stamp = datetime.now().strftime("%Y%m%d%H%M%S")
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
        self.log(
            f"started {self.n_runs} runs; "
            + (
                f"killing a worker every ~{self.kill_every:g} s"
                if self.kill_every > 0
                else "no kills"
            )
        )

    def _loop(self, env: dict[str, str], started: float) -> None:
        from durable.worker.sweeper import sweep

        deadline = started + self.timeout
        next_sweep = 0.0
        next_note = time.monotonic() + 10
        midway_done = self.midway is None
        waiting = ""
        defer_until = time.monotonic() + DEFER_OTHERS
        while time.monotonic() < deadline:
            now = time.monotonic()
            try:
                remaining = self._remaining()
                waiting = (self.extras and self.extras.pending()) if not remaining else ""
                cut = self.partition is not None and self.partition.is_cut
                if not remaining and not waiting and not cut:
                    return  # (a cut link is restored first: its late writes are audited)
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
            step = self.clock_step
            if step is not None and not step.stepped and self._skewed_worker_holds_a_run():
                self.log(f"stepping one worker's clock by {step.seconds:+g} s")
                step.step()
                self.report.clock_steps += 1
            if self.partition is not None:
                try:
                    self._partition_step(now)
                except (DatabaseError, InterfaceError) as exc:
                    self.log(f"database unavailable ({type(exc).__name__}); retrying")
                    close_old_connections()
                    connection.close()
            if self.deferred and (
                self.report.partitions or self.report.clock_steps or now >= defer_until
            ):
                self.log(f"starting the {self.deferred} other worker(s)")
                for _ in range(self.deferred):
                    self._start_worker(env)
                self.deferred = 0
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

    def _kill_and_replace(self, env: dict[str, str], stop: threading.Event) -> None:
        """SIGKILL a random worker every ~``kill_every`` seconds and keep ``workers`` of
        them alive, on a thread of its own: the operator's loop over 1,000 runs takes
        seconds a turn, and must not space the kills out."""
        next_kill = time.monotonic() + self._jitter()
        try:
            self._kill_loop(env, stop, next_kill)
        finally:
            connection.close()  # this thread's own connection (the holders' query)

    def _kill_loop(self, env: dict[str, str], stop: threading.Event, next_kill: float) -> None:
        while not stop.wait(0.1):
            now = time.monotonic()
            # the first kill does not wait for the timer: it comes as soon as a worker
            # holds a run, so even an audit whose runs end within seconds has one
            # (once every worker is up: not before a cut-off or clock-stepped one's fault)
            first = (
                self._holding_workers()
                if self.kill_every > 0 and not self.report.kills and not self.deferred
                else []
            )
            if self.kill_every > 0 and (now >= next_kill or first):
                # a cut-off worker is not killed while cut: its late writes are the point
                cut_off = self.partition is not None and self.partition.is_cut
                alive = [w for w in self.workers if w.alive() and not (cut_off and w.partition)]
                alive = [w for w in first if w in alive] or alive
                if alive:
                    victim = self.rng.choice(alive)
                    victim.kill()
                    self.report.kills += 1
                    self._start_worker(
                        env, partitioned=victim.partition is not None, skewed=victim.skewed
                    )
                next_kill = now + self._jitter()
            for worker in [w for w in self.workers if not w.alive()]:
                self.workers.remove(worker)
                alive = len([w for w in self.workers if w.alive()])
                if alive < self.n_workers - self.deferred:
                    self._start_worker(
                        env, partitioned=worker.partition is not None, skewed=worker.skewed
                    )

    def _holding_workers(self) -> list[ChaosWorker]:
        """The live workers that hold a run's lease now (none while the database is
        down: a restart hook may be running)."""
        from durable.models import Run

        try:
            owners = list(
                Run.objects.filter(lease_token__gt="")
                .exclude(lease_owner="")
                .values_list("lease_owner", flat=True)
            )
        except (DatabaseError, InterfaceError):
            connection.close()
            return []
        return [
            w
            for w in list(self.workers)
            if w.alive() and any(owner.startswith(w.lease_prefix) for owner in owners)
        ]

    def _skewed_worker_holds_a_run(self) -> bool:
        """Whether a run's lease is held by the clock-stepped worker (the moment to step)."""
        import socket

        from django.db.models import Q

        from durable.models import Run

        owners = Q()
        for worker in list(self.workers):
            if worker.skewed and worker.alive():
                owners |= Q(lease_owner__startswith=f"{socket.gethostname()}:{worker.proc.pid}:")
        return bool(owners) and Run.objects.filter(owners, lease_token__gt="").exists()

    # ---------------------------------------------------------------- partition

    def _check_partition(self) -> None:
        """Refuse ``partition`` where a host cannot be cut off: it needs PostgreSQL and
        Redis (reached over TCP; SQLite and the filesystem broker are local files) and
        root with iproute2. Raises :class:`ChaosConfigurationError`."""
        broker = str(settings.CELERY_BROKER_URL)
        if connection.vendor != "postgresql" or not broker.startswith(("redis://", "rediss://")):
            raise ChaosConfigurationError(
                "--partition needs PostgreSQL and Redis (DATABASE_URL=postgres://..., "
                "CELERY_BROKER_URL=redis://...): with SQLite or the filesystem broker a "
                f"worker host cannot be cut off (here: {connection.vendor}, "
                f"{urlsplit(broker).scheme or broker})"
            )
        why = unavailable()
        if why:
            raise ChaosConfigurationError(f"--partition: {why}")
        lease = self.lease if self.lease is not None else conf.lease_seconds()
        if self.partition_seconds <= lease:
            raise ChaosConfigurationError(
                f"--partition must cut the link for longer than the lease "
                f"({self.partition_seconds:g} s <= {lease:g} s)"
            )
        if not 0 < self.n_partitioned < self.n_workers:
            raise ChaosConfigurationError(
                "--partition needs a worker inside the partition and one outside "
                f"({self.n_partitioned} of {self.n_workers} partitioned)"
            )

    def _partition_ports(self) -> list[int]:
        """The ports of 127.0.0.1 the partitioned workers reach through the link."""
        assert self.services is not None
        broker = urlsplit(str(settings.CELERY_BROKER_URL))
        ports = [int(connection.settings_dict.get("PORT") or 5432), broker.port or 6379]
        for service in self.services.all():
            ports += service.ports.values()
        return ports

    def _partition_step(self, now: float) -> None:
        """Cut the link once a cut-off-to-be worker holds a run; restore it once the cut
        has lasted ``partition`` seconds and every run it held was taken over (at most
        three times as long: a run whose row the cut-off worker locked cannot be)."""
        assert self.partition is not None
        if self.partition.is_cut:
            elapsed = now - self.cut_at
            if elapsed < self.partition_seconds:
                return
            taken = self._taken_over()
            if len(taken) < len(self.cut_held) and elapsed < 3 * self.partition_seconds:
                return
            self.report.partition_taken_over = taken
            self.partition.restore()
            self.report.partition_seconds = elapsed
            self.log(
                f"link restored after {elapsed:.1f} s; {len(taken)} of {len(self.cut_held)} "
                "runs taken over meanwhile"
            )
            return
        if self.report.partitions:
            return  # one partition per audit
        if not self._held_by_partitioned():
            return
        self.partition.cut()
        # what they hold now, with nothing more coming from them: a run they ended just
        # before the cut is not held, and a cut inside one of their transactions (its
        # row locks would block the takeover until the link is back) is tried again
        held = self._held_by_partitioned()
        if not held or self._in_transaction():
            self.partition.restore()
            return
        self.cut_at = time.monotonic()
        self.cut_since = timezone.now()
        self.cut_held = held
        self.report.partitions += 1
        self.report.partition_held = sorted(held)
        self.log(f"link cut; the cut-off worker(s) held {', '.join(sorted(held))}")

    def _taken_over(self) -> list[str]:
        """The held runs another worker recovered since the cut: claimed while running
        under the cut-off worker's lease (a ``recovered`` event by a worker outside)."""
        from django.db.models import Q

        from durable.models import TraceEvent
        from durable.vocabulary import EventKind

        inside = Q()
        for worker in list(self.workers):
            if worker.partition is not None:
                inside |= Q(actor__startswith=worker.lease_prefix)
        return sorted(
            set(
                TraceEvent.objects.filter(
                    run_id__in=list(self.cut_held),
                    kind=EventKind.RECOVERED,
                    created_at__gte=self.cut_since,
                )
                .exclude(inside)
                .values_list("run_id", flat=True)
            )
        )

    def _in_transaction(self) -> bool:
        """Whether a database session of the partition is inside a transaction (between
        two statements of one, or running one that is not its first)."""
        assert self.partition is not None
        port = int(connection.settings_dict.get("PORT") or 5432)
        ports = list(self.partition.relays.get(port, ()))
        if not ports:
            return False
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY(%s) "
                "AND client_addr = '127.0.0.1' AND (state LIKE 'idle in transaction%%' "
                "OR (state = 'active' AND xact_start < query_start))",
                [ports],
            )
            return bool(cursor.fetchone()[0])

    def _held_by_partitioned(self) -> dict[str, str]:
        """Run id -> lease token of the running runs a partitioned worker holds."""
        from django.db.models import Q

        from durable.models import Run, RunStatus

        inside = [w for w in self.workers if w.partition is not None and w.alive()]
        if not inside:
            return {}
        owned = Q()
        for worker in inside:
            owned |= Q(lease_owner__startswith=worker.lease_prefix)
        # this audit's runs and their children (an earlier, interrupted audit's runs may
        # still be in the database, and a worker may pick them up)
        ours = Q(id__startswith=f"chaos-{self.stamp}-")
        return dict(
            Run.objects.filter(owned, ours, status=RunStatus.RUNNING).values_list(
                "id", "lease_token"
            )
        )

    def _audit_partition(self, wait: float = 60.0) -> None:
        """Count the held runs whose cut-off worker, back on the network, was refused
        (its log says it lost the lease). Its retransmissions back off exponentially, so
        wait up to ``wait`` seconds for each (or for its worker to have ended)."""
        if not self.cut_held:
            return
        inside = [w for w in self.workers if w.partition is not None]
        deadline = time.monotonic() + wait
        while True:
            text = "".join(w.log_path.read_text(errors="replace") for w in inside)
            fenced = [rid for rid in self.cut_held if f"lost the lease of run {rid}" in text]
            if len(fenced) == len(self.cut_held) or time.monotonic() > deadline:
                break
            if not any(w.alive() for w in inside):
                break
            time.sleep(0.5)
        self.report.partition_fenced = sorted(fenced)
        self.log(
            f"{len(fenced)} of {len(self.cut_held)} held runs' late writes fenced "
            f"(waited {time.monotonic() - deadline + wait:.1f} s after the runs ended)"
        )

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


class ChaosConfigurationError(ImproperlyConfigured):
    """The audit cannot inject the fault it was asked for on this configuration."""


def run_chaos(**options: Any) -> Report:
    """Run the chaos audit (see :class:`Chaos` for the options); returns its report."""
    return Chaos(**options).run()


def main(options: dict[str, Any], stdout: Any) -> int:
    """``manage.py durable_chaos``: run, print the table, return the exit status."""

    def log(text: str) -> None:
        stdout.write(f"[chaos] {text}\n")
        stdout.flush()

    midway = (lambda: restart_services(log)) if options.get("restart_services") else None
    # a SIGTERM (``timeout``, a CI job cancelled) ends the audit as Ctrl-C does: through
    # the cleanup that kills the workers and services and deletes the network namespaces
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        report = run_chaos(
            runs=options["runs"],
            kill_every=options["kill_every"],
            workers=options["workers"],
            lease=options["lease"],
            timeout=options["timeout"],
            seed=options.get("seed"),
            service_faults=options["service_faults"],
            clock_step=options.get("clock_step") or 0.0,
            partition=options.get("partition") or 0.0,
            midway=midway,
            log=log,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
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
                    "partitions": report.partitions,
                    "partition_held": report.partition_held,
                    "partition_taken_over": report.partition_taken_over,
                    "partition_fenced": report.partition_fenced,
                }
            )
            + "\n"
        )
    return 0 if report.ok else 1


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM: leave through the ``finally`` blocks that clean up, as Ctrl-C does."""
    raise SystemExit(128 + signum)
