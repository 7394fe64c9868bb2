"""The database server drops the workers' connections; the broker restarts (S28).

Real worker processes (one ``--pool=solo`` worker and one ``--pool=prefork`` worker with
two children) run ``dbf.two_steps`` (``tests/dbfault_workflows.py``): a plain step whose
effect dedupes by key, then an unsafe write with a reconcile hook. The test process
terminates every backend of its test database but its own (``pg_terminate_backend``:
what a failover, a restart or an idle-session timeout does to the workers) several
times while runs are in flight. Each run must end SUCCEEDED, each effect must have
happened once, and the workers must go on running later tasks.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections import Counter

import pytest
from django.db import connection

import durable
from durable.models import TERMINAL, Operation, OperationStatus, Run, RunStatus, TraceEvent
from durable.worker.tasks import sweep as sweep_task
from tests import dbfault_workflows as dw
from tests.harness import wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]

MODULES = "tests.crash_workflows,tests.dbfault_workflows"


def needs_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip(
            "terminates PostgreSQL server backends (pg_terminate_backend); the "
            "embedded SQLite database has no server connection to lose"
        )


def terminate_other_backends() -> int:
    """Terminate every client backend of the test database except this process's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return int(cursor.fetchone()[0])


def sweep_for(seconds: float) -> None:
    """Let ``seconds`` pass, running the sweeper as Celery beat would."""
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= end, seconds + 30, what="time to pass")


def wait_all(run_ids: list[str], timeout: float) -> dict[str, Run]:
    def settled():
        rows = {r.id: r for r in Run.objects.filter(pk__in=run_ids)}
        return rows if all(r.status in TERMINAL for r in rows.values()) else None

    try:
        return wait_until(settled, timeout, what=f"{len(run_ids)} runs to finish")
    except AssertionError:
        states = Counter(Run.objects.filter(pk__in=run_ids).values_list("status", flat=True))
        raise AssertionError(f"runs not finished after {timeout} s: {dict(states)}") from None


def assert_each_effect_once(folder, runs: dict[str, Run]) -> None:
    counts = dw.effect_counts(folder)
    for run_id, run in runs.items():
        assert run.status == RunStatus.SUCCEEDED, f"run {run_id} is {run.status}: {run.error}"
        assert counts.get(("tickets", f"{run_id}:first")) == 1, (run_id, counts)
        assert counts.get(("charges", f"{run_id}:dbf.charge")) == 1, (run_id, counts)
        out = run.output_value()
        assert out["ticket"].startswith("T-") and out["charge"].startswith("C-"), out
    assert sum(counts.values()) == 2 * len(runs), "an effect of a run that does not exist"
    assert (
        not Operation.objects.filter(run_id__in=list(runs))
        .exclude(status=OperationStatus.SUCCEEDED)
        .exists()
    )


@pytest.mark.processes
def test_s28_workers_survive_terminated_connections_and_finish_every_run(workers, proc_env):
    needs_postgresql()
    # the sweeps' "succeeded" lines are read below: logged, as they are not by default
    env = {"DURABLE_WORKFLOW_MODULES": MODULES, "DURABLE_LOG_HOUSEKEEPING": "true"}
    solo = workers.start(**env)
    prefork = workers.start(pool="prefork", concurrency=2, **env)
    solo.wait_ready()
    prefork.wait_ready()

    run_ids = [durable.start("dbf.two_steps", {"n": i, "seconds": 0.4}).id for i in range(20)]
    wait_until(
        lambda: Run.objects.filter(pk__in=run_ids, status=RunStatus.RUNNING).exists(),
        30,
        what="a run to start",
    )
    terminated = []
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        terminated.append(terminate_other_backends())
        sweep_for(1.5)
    assert sum(1 for n in terminated if n) >= 3, f"backends terminated per round: {terminated}"

    runs = wait_all(run_ids, 120)
    assert_each_effect_once(proc_env.dir, runs)
    # an execution stopped by a fault, or a checkpoint that rode one out in place
    faults = TraceEvent.objects.filter(run_id__in=run_ids, kind="db_fault")
    ridden_out = TraceEvent.objects.filter(
        run_id__in=run_ids, kind="step_executed", data__has_key="db_faults"
    )
    assert faults.exists() or ridden_out.exists(), "no fault was met: the test tested nothing"
    # a database fault is not a lost worker: no poison-step counting, no failed attempt
    assert not TraceEvent.objects.filter(run_id__in=run_ids, kind="failed").exists()

    # every later task runs, on both workers: sweeps and new runs
    terminate_other_backends()
    sweeps = [sweep_task.delay().id for _ in range(6)]
    later = [durable.start("dbf.two_steps", {"n": 100 + i, "seconds": 0.2}).id for i in range(6)]
    later_runs = wait_all(later, 60)
    for run in later_runs.values():
        assert run.status == RunStatus.SUCCEEDED, (run.id, run.error)

    def ended() -> str | None:  # every sweep succeeded or raised: the logs, else None
        logs = solo.log_text() + prefork.log_text()
        done = all(f"[{tid}] succeeded" in logs or f"[{tid}] raised" in logs for tid in sweeps)
        return logs if done else None

    logs = wait_until(ended, 90, what="the sweeps to end", sweep=False)
    raised = [line for line in logs.splitlines() if any(f"[{t}] raised" in line for t in sweeps)]
    assert raised == [], raised
    assert solo.alive() and prefork.alive()


# ------------------------------------------------------------------- broker restart


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateRedis:
    """A ``redis-server`` of this test only, without persistence, on a free port."""

    def __init__(self, folder) -> None:
        self.port = free_port()
        self.folder = folder
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        import redis

        client = redis.Redis(port=self.port)
        wait_until(lambda: _pings(client), 10, what="the private redis to answer", sweep=False)
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _use_broker(url: str) -> None:
    from config.celery import app

    app.conf.broker_url = url
    app._pool = None
    app.amqp._producer_pool = None


@pytest.mark.processes
def test_s28_broker_restart_under_load_every_run_completes(
    workers, proc_env, settings, tmp_path, monkeypatch
):
    """The broker (a private Redis without persistence) is killed and restarted while
    runs are in flight: queued messages are lost, the workers reconnect (or exit and
    are restarted), the sweeper dispatches what the lost messages were for; every run
    completes, each effect once."""
    broker = PrivateRedis(tmp_path)
    broker.start()
    previous = settings.CELERY_BROKER_URL
    settings.CELERY_BROKER_URL = broker.url
    monkeypatch.setenv("CELERY_BROKER_URL", broker.url)  # Celery reads it before its conf
    settings.DURABLE = {**settings.DURABLE, "REDISPATCH_AFTER_SECONDS": 3.0}
    _use_broker(broker.url)
    try:
        env = {"DURABLE_WORKFLOW_MODULES": MODULES, "CELERY_BROKER_URL": broker.url}
        a = workers.start(**env)
        b = workers.start(pool="prefork", concurrency=2, **env)
        a.wait_ready()
        b.wait_ready()
        run_ids = [durable.start("dbf.two_steps", {"n": i, "seconds": 0.3}).id for i in range(20)]
        wait_until(
            lambda: Run.objects.filter(pk__in=run_ids, status=RunStatus.SUCCEEDED).count() >= 2,
            60,
            what="two runs to finish",
        )
        broker.stop()
        time.sleep(2.0)
        broker.start()
        # A prefork worker may exit here: kombu restores its unacked messages while
        # closing the lost connection and fails with AttributeError (celery/kombu#970
        # and its kin). Its process supervisor starts it again, as this test does; no
        # run depends on it (its leases are released like any dead worker's).
        sweep_for(3.0)
        for worker in (a, b):
            if not worker.alive():
                print(f"worker {worker.name} exited on the broker restart; restarted")
                workers.start(
                    pool="prefork" if worker is b else "solo",
                    concurrency=2 if worker is b else 1,
                    **env,
                )
        runs = wait_all(run_ids, 120)
        assert_each_effect_once(proc_env.dir, runs)
        # the workers reconnected: a run started now completes
        later = durable.start("dbf.two_steps", {"n": 99, "seconds": 0.0}).id
        assert wait_all([later], 60)[later].status == RunStatus.SUCCEEDED
    finally:
        workers.kill_all()
        broker.stop()
        settings.CELERY_BROKER_URL = previous
        monkeypatch.undo()
        _use_broker(previous)
