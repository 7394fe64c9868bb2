"""Multi-process test harness: real Celery workers against the test database.

The fixtures that use this live in ``tests/processes/conftest.py``. A worker is
``celery -A config worker --pool=solo`` started in its own session (so a kill takes its
whole process group) with the environment of the running test: the test database
(``DATABASE_URL`` built from ``connection.settings_dict``), the same broker URL, the
same ``filesystem://`` folder (a private one per test session, see
``use_session_broker``), the same ``SECRET_KEY`` (the key of encrypted redacted values
derives from it), a 2 s lease and a per-test ``CRASH_TEST_DIR`` (see
``tests/crash_workflows.py``).

Kill = ``os.killpg(pid, SIGKILL)``: no cleanup, no ack, exactly what a crash does.
``wait_until`` polls a predicate and runs the sweeper from the test process every
``SWEEP_INTERVAL`` (in production Celery beat runs it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from examples.procs import Forked

REPO = Path(__file__).resolve().parent.parent
CELERY = Path(sys.executable).parent / "celery"

LEASE_SECONDS = 2.0
SWEEP_INTERVAL = 0.5
#: worker start-up (import Django, connect the broker) on a loaded 2-core machine
READY_TIMEOUT = 30.0

_names = itertools.count(1)

#: seconds from spawn to "ready" of every worker this process saw become ready: the
#: time-per-folder table (tests/timing.py) reports their count and sum
READY_SECONDS: list[float] = []


# --------------------------------------------------------------------- environment


def database_url() -> str:
    """A ``DATABASE_URL`` naming the database the running test uses."""
    from django.db import connection

    sd = connection.settings_dict
    if connection.vendor == "sqlite":
        name = str(sd["NAME"])
        if name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
            raise RuntimeError("process tests need a file database, not an in-memory one")
        return f"sqlite:///{Path(name).resolve()}"
    if connection.vendor == "postgresql":
        user = quote(sd.get("USER") or "", safe="")
        password = quote(sd.get("PASSWORD") or "", safe="")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = sd.get("HOST") or "127.0.0.1"
        port = f":{sd['PORT']}" if sd.get("PORT") else ""
        return f"postgres://{auth}{host}{port}/{quote(sd['NAME'], safe='')}"
    raise RuntimeError(f"process tests do not support the {connection.vendor} backend")


#: the var folder whose ``broker/`` this session's workers share with the test process
#: (``use_session_broker``); None: the test process's own ``settings.VAR_DIR``
_session_var_dir: Path | None = None


def use_session_broker(var_dir: Path) -> dict[str, Any] | None:
    """Give this test session a private ``filesystem://`` broker folder under ``var_dir``.

    The default folder (``var/broker``) is shared with every other process started from
    the checkout -- a developer's worker, a benchmark, another test session -- which
    would take this session's messages, and whose messages the per-test purge would
    delete. Workers get ``DURABLE_VAR_DIR=var_dir``, so their settings derive the same
    folders. Returns the previous transport options for ``restore_broker`` (``None``
    when the broker is not the filesystem transport: nothing to do).
    """
    global _session_var_dir
    from django.conf import settings

    from config.celery import app

    if not str(settings.CELERY_BROKER_URL).startswith("filesystem://"):
        return None
    previous = dict(app.conf.broker_transport_options or {})
    folders = {name: var_dir / "broker" / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    _set_transport_options(
        {
            **previous,
            "data_folder_in": str(folders["queue"]),
            "data_folder_out": str(folders["queue"]),
            "processed_folder": str(folders["processed"]),
            "control_folder": str(folders["control"]),
        }
    )
    _session_var_dir = var_dir
    return previous


def restore_broker(previous: dict[str, Any] | None) -> None:
    global _session_var_dir
    if previous is not None:
        _set_transport_options(previous)
    _session_var_dir = None


def _set_transport_options(options: dict[str, Any]) -> None:
    from config.celery import app

    app.conf.broker_transport_options = options
    # drop the cached connection and producer pools, as Celery does after a fork, so
    # the next message is sent with the new options
    app._pool = None
    app.amqp._producer_pool = None


def worker_env(crash_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a worker process for the running test."""
    from django.conf import settings

    from durable.registry import app_workflow_modules

    # pass the test process's environment through (DURABLE_ENCRYPTION_KEY,
    # DURABLE_EXTRA_APPS, ...), minus what this harness decides per worker
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CRASH_", "PYTEST_"))
        and k not in ("DURABLE_HEARTBEAT_SECONDS", "DURABLE_REDISPATCH_AFTER_SECONDS")
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": str(settings.CELERY_BROKER_URL),
            "DURABLE_VAR_DIR": str(_session_var_dir or settings.VAR_DIR),
            "DJANGO_SECRET_KEY": str(settings.SECRET_KEY),
            "DURABLE_DISPATCH": "celery",
            "DURABLE_WORKFLOW_MODULES": "tests.crash_workflows",
            # the apps' workflows.py named, not discovered: without autodiscovery the
            # example agents leave out LangGraph, PydanticAI and the OpenAI Agents SDK,
            # seconds of CPU at every worker start (tests that need them name them)
            "DURABLE_AUTODISCOVER": "false",
            "DURABLE_LEASE_SECONDS": str(LEASE_SECONDS),
            "DURABLE_SWEEP_INTERVAL_SECONDS": str(SWEEP_INTERVAL),
            "DURABLE_INPROCESS_RETRY_MAX_SECONDS": "5",
            "CRASH_TEST_DIR": str(crash_dir),
        }
    )
    env.update(extra)
    modules = env["DURABLE_WORKFLOW_MODULES"].split(",")
    env["DURABLE_WORKFLOW_MODULES"] = ",".join(
        modules + [m for m in app_workflow_modules() if m not in modules]
    )
    return env


def purge_broker() -> int:
    """Drop every queued message so that no earlier test's hint reaches this test."""
    from django.conf import settings

    from config.celery import app

    removed = 0
    if str(settings.CELERY_BROKER_URL).startswith("filesystem://"):
        folder = Path(app.conf.broker_transport_options["data_folder_in"])
        for path in folder.glob("*.msg"):
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
    removed += app.control.purge() or 0
    if str(settings.CELERY_BROKER_URL).startswith(("redis://", "rediss://")):
        import redis

        client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        try:
            # messages a killed worker held (restored after the visibility timeout)
            removed += client.delete("unacked", "unacked_index", "unacked_mutex")
        finally:
            client.close()
    return removed


# the fork server workers are forked from lives with the example processes
# (examples/procs.py): the chaos audit forks its workers from the same one


# -------------------------------------------------------------------------- workers


class Worker:
    """One ``celery worker`` process (``--pool=solo`` unless told) in its own session."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        log_path: Path,
        *,
        pool: str = "solo",
        concurrency: int = 1,
        args: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.env = env
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in reap()
        self.started_at = time.monotonic()
        self.ready_at: float | None = None
        argv = [
            str(CELERY),
            "-A",
            "config",
            "worker",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            "--without-mingle",
            "--without-gossip",
            "-n",
            f"{name}@%h",
            "--loglevel=INFO",
            *args,
        ]
        self.proc = Forked(argv, env, log_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def is_ready(self) -> bool:
        if (
            self.ready_at is None
            and f"{self.name}@" in (text := self.log_text())
            and (" ready." in text)
        ):
            self.ready_at = time.monotonic()
            READY_SECONDS.append(self.ready_at - self.started_at)
        return self.ready_at is not None

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> float:
        """Block until the worker logged "ready"; returns the seconds it took."""
        deadline = time.monotonic() + timeout
        while not self.is_ready():
            if not self.alive():
                raise AssertionError(
                    f"worker {self.name} exited with {self.proc.returncode} "
                    f"before it was ready:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"worker {self.name} not ready after {timeout} s:\n{self.tail()}"
                )
            time.sleep(0.05)
        assert self.ready_at is not None
        return self.ready_at - self.started_at

    def wait_exit(self, timeout: float) -> int:
        """Block until the process ends (e.g. it SIGKILLed itself); returns its code."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.name} still running after {timeout} s:\n{self.tail()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (a crash: no cleanup, no ack)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def reap(self) -> None:
        self.kill()
        if not self._log.closed:
            self._log.close()

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


class WorkerPool:
    """Starts workers for one test and kills them all at teardown."""

    def __init__(self, crash_dir: Path, log_dir: Path) -> None:
        self.crash_dir = crash_dir
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.workers: list[Worker] = []

    def start(
        self,
        *,
        crash_at: str = "",
        crash_dir: Path | None = None,
        wait: bool = False,
        pool: str = "solo",
        concurrency: int = 1,
        args: Sequence[str] = (),
        **extra_env: str,
    ) -> Worker:
        """Start a worker; ``crash_at`` arms ``CRASH_AT``; ``wait``: until it is ready;
        ``pool``/``concurrency``: Celery's (``prefork`` runs tasks in child processes);
        ``args``: more ``celery worker`` options (``--max-tasks-per-child=1``)."""
        name = f"w{next(_names)}"
        env = worker_env(crash_dir or self.crash_dir, **extra_env)
        if crash_at:
            env["CRASH_AT"] = crash_at
        worker = Worker(
            name, env, self.log_dir / f"{name}.log", pool=pool, concurrency=concurrency, args=args
        )
        self.workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def kill(self, worker: Worker) -> None:
        worker.kill()

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.reap()

    def report(self, lines: int = 120) -> str:
        parts = []
        for w in self.workers:
            state = "alive" if w.alive() else f"exit {w.proc.returncode}"
            parts.append(
                f"----- worker {w.name} pid {w.pid} ({state}) "
                f"crash_at={w.env.get('CRASH_AT', '')!r} -----\n{w.tail(lines)}"
            )
        return "\n".join(parts)


# ------------------------------------------------------------------------- waiting


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    *,
    what: str = "the condition",
    sweep: bool = True,
    interval: float = 0.1,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; return that.

    Runs ``durable.worker.sweeper.sweep()`` every ``SWEEP_INTERVAL`` seconds (as Celery beat
    would), so expired leases and due retries are dispatched. Raises ``AssertionError``
    after ``timeout`` seconds.
    """
    from durable.worker.sweeper import sweep as run_sweep

    deadline = time.monotonic() + timeout
    next_sweep = 0.0
    while True:
        now = time.monotonic()
        if sweep and now >= next_sweep:
            run_sweep()
            next_sweep = now + SWEEP_INTERVAL
        value = predicate()
        if value:
            return value
        if now > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_for_run(run_id: str, timeout: float = 30.0, *, statuses: tuple[str, ...] | None = None):
    """Wait until the run is in one of ``statuses`` (default: terminal); return it."""
    from durable.models import TERMINAL, Run

    wanted = tuple(statuses or TERMINAL)

    def settled():
        run = Run.objects.filter(pk=run_id).first()
        return run if run is not None and run.status in wanted else None

    try:
        return wait_until(settled, timeout, what=f"run {run_id} to reach {', '.join(wanted)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe_run(run_id)}") from None


def describe_run(run_id: str) -> str:
    """The run's row and its last trace events, for a failure message."""
    from durable.models import Run, TraceEvent

    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return f"run {run_id} does not exist"
    events = list(TraceEvent.objects.filter(run_id=run_id).order_by("-id")[:12])
    head = (
        f"run {run_id}: status={run.status} claims={run.claims} "
        f"lease_owner={run.lease_owner!r} lease_expires_at={run.lease_expires_at} "
        f"dispatched_at={run.dispatched_at} error={run.error}"
    )
    lines = [head]
    lines += [
        f"  {e.created_at:%H:%M:%S.%f} {e.kind} {e.step_id} {e.actor} {e.message[:160]}"
        for e in reversed(events)
    ]
    return "\n".join(lines)
