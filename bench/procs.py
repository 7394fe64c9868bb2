"""Parts 2-5 and 7: real Celery worker processes.

``python -m bench.procs PART [--quick]`` runs in an environment that names the database
and the broker (``DATABASE_URL``, ``CELERY_BROKER_URL``, ``DURABLE_VAR_DIR``), starts
``celery -A config worker --pool=solo -c 1 --without-mingle --without-gossip`` workers
with the same environment, and reports JSON. Parts:

- ``dispatch``: one-step runs, ``durable.start`` -> SUCCEEDED, one at a time.
- ``throughput``: many 20-step runs dispatched at once, 1, 2 and 4 workers
  (``$BENCH_THROUGHPUT_PLAN``); the worker's RSS after the 1-worker batch (>= 10k steps in
  the full run) is the memory figure.
- ``recovery``: SIGKILL the worker holding a run's lease mid-step; time until the next
  step starts on the other worker (sweeps every DURABLE_SWEEP_INTERVAL_SECONDS from this
  process, as Celery beat would).
- ``approval``: ``approvals.services.approval_decide`` committed -> the next step starts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .common import CELERY, REPO, emit, latency_summary, setup_django


class Worker:
    _count = 0

    def __init__(self, log_dir: Path, label: str) -> None:
        Worker._count += 1
        self.name = f"bench{label}{Worker._count}"
        self.log_path = log_dir / f"{self.name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                CELERY,
                "-A",
                "config",
                "worker",
                "--pool=solo",
                "-c",
                "1",
                "--without-mingle",
                "--without-gossip",
                "-n",
                f"{self.name}@%h",
                "--loglevel=INFO",
                "-Q",
                os.environ.get("BENCH_QUEUE", "celery"),
            ],
            cwd=REPO,
            env=dict(os.environ),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.ready_seconds: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        while " ready." not in self.log():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"worker {self.name} exited {self.proc.returncode}:\n"
                    + "\n".join(self.log().splitlines()[-30:])
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker {self.name} not ready after {timeout} s:\n"
                    + "\n".join(self.log().splitlines()[-30:])
                )
            time.sleep(0.05)
        self.ready_seconds = time.monotonic() - self.started
        return self.ready_seconds

    def rss_mb(self) -> float:
        """VmRSS of the worker (the solo pool runs tasks in the main process)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill()


def purge_broker() -> None:
    from django.conf import settings

    url = str(settings.CELERY_BROKER_URL)
    if url.startswith("filesystem://"):
        folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
        for path in folder.glob("*.msg"):
            path.unlink(missing_ok=True)
    elif url.startswith(("redis://", "rediss://")):
        import redis

        # only the bench's own queue: the Redis database may be shared
        client = redis.Redis.from_url(url)
        client.delete(os.environ.get("BENCH_QUEUE", "celery"))
        client.close()


def use_private_queue() -> None:
    """Send this process's tasks to ``$BENCH_QUEUE`` (its workers consume only that queue),
    so that other users of the same broker neither take nor send the bench's messages."""
    queue = os.environ.get("BENCH_QUEUE")
    if queue:
        from config.celery import app

        app.conf.task_default_queue = queue


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until truthy. Latencies come from timestamps the engine wrote, so
    the polling interval does not bias them; polling gently keeps the CPU for the worker."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def _ts(dt: datetime | None) -> float:
    return dt.timestamp() if dt is not None else float("nan")


# ---------------------------------------------------------------------------- dispatch


def dispatch(quick: bool, log_dir: Path) -> dict[str, Any]:
    import durable
    from durable.models import Run, RunStatus, TraceEvent

    n = 10 if quick else 50
    purge_broker()
    worker = Worker(log_dir, "d")
    try:
        ready = worker.wait_ready()
        totals, pickups = [], []
        for i in range(n + 3):
            t0 = time.time()
            run = durable.start("bench.noop", {"steps": 1})
            finished = _wait(
                lambda run=run: (
                    Run.objects.filter(pk=run.id, status=RunStatus.SUCCEEDED)
                    .values_list("finished_at", flat=True)
                    .first()
                ),
                30,
                f"run {run.id}",
            )
            claimed = (
                TraceEvent.objects.filter(run_id=run.id, kind="claimed")
                .values_list("created_at", flat=True)
                .first()
            )
            if i >= 3:  # the first runs warm up the broker connection and the worker
                totals.append((_ts(finished) - t0) * 1000)
                pickups.append((_ts(claimed) - t0) * 1000)
        rss = worker.rss_mb()
    finally:
        worker.stop()
    return {
        "start_to_finished_ms": latency_summary(totals),
        "start_to_claimed_ms": latency_summary(pickups),
        "worker_ready_seconds": ready,
        "worker_rss_mb": rss,
        "runs": n,
    }


# -------------------------------------------------------------------------- throughput


def _batch(runs: int, steps: int, timeout: float) -> dict[str, Any]:
    from django.db import transaction
    from django.db.models import Max

    import durable
    from durable.models import Run, RunStatus

    box: dict[str, float] = {}
    tag = f"tp-{time.time_ns()}"
    with transaction.atomic():
        transaction.on_commit(lambda: box.setdefault("t0", time.time()))
        ids = [durable.start("bench.noop", {"steps": steps}, tags=[tag]).id for _ in range(runs)]
    t0 = box["t0"]
    qs = Run.objects.filter(pk__in=ids)
    _wait(
        lambda: qs.filter(status=RunStatus.SUCCEEDED).count() == runs,
        timeout,
        f"{runs} runs to succeed",
        interval=0.2,
    )
    failed = qs.exclude(status=RunStatus.SUCCEEDED).count()
    t1 = _ts(qs.aggregate(m=Max("finished_at"))["m"])
    seconds = t1 - t0
    return {
        "runs": runs,
        "steps": runs * steps,
        "seconds": seconds,
        "steps_per_second": runs * steps / seconds,
        "failed": failed,
    }


def throughput_plan(quick: bool) -> list[tuple[int, int]]:
    """``[(workers, runs), ...]`` from ``$BENCH_THROUGHPUT_PLAN`` (``"1:500,2:200,4:200"``)."""
    default = "1:16,2:16,4:16" if quick else "1:500,2:200,4:200"
    text = os.environ.get("BENCH_THROUGHPUT_PLAN") or default
    return [(int(a), int(b)) for a, b in (x.split(":") for x in text.split(",") if x)]


def throughput(quick: bool, log_dir: Path) -> dict[str, Any]:
    steps = 20
    out: dict[str, Any] = {"steps_per_run": steps}
    for count, runs in throughput_plan(quick):
        purge_broker()
        workers = [Worker(log_dir, f"t{count}_") for _ in range(count)]
        try:
            for w in workers:
                w.wait_ready()
            rss_ready = [w.rss_mb() for w in workers]
            _batch(2 * count, steps, 120)  # warm up every worker
            result = _batch(runs, steps, 1800)
            result["rss_ready_mb"] = rss_ready
            result["rss_after_mb"] = [w.rss_mb() for w in workers]
            result["steps_per_worker"] = result["steps"] / count
        finally:
            for w in workers:
                w.stop()
        out[f"workers_{count}"] = result
    return out


# ---------------------------------------------------------------------------- recovery


class Sweeper(threading.Thread):
    """``durable.worker.sweeper.sweep()`` every ``interval`` seconds (what Celery beat does)."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True, name="bench-sweeper")
        self.interval = interval
        self.stop_event = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from durable.worker.sweeper import sweep

        try:
            while not self.stop_event.wait(self.interval):
                with contextlib.suppress(Exception):  # try again next interval
                    sweep()
        finally:
            connection.close()


def recovery(quick: bool, log_dir: Path) -> dict[str, Any]:
    from durable import conf

    kills = int(os.environ.get("BENCH_RECOVERY_KILLS") or (3 if quick else 20))
    step_sleep = 0.25
    purge_broker()
    workers = [Worker(log_dir, "r"), Worker(log_dir, "r")]
    sweeper = Sweeper(float(conf.get("SWEEP_INTERVAL_SECONDS")))
    sweeper.start()
    latencies: list[float] = []
    claims: list[int] = []
    details: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        for w in workers:
            w.wait_ready()
        for _ in range(kills):
            try:
                _one_kill(workers, log_dir, step_sleep, latencies, claims, details)
            except RuntimeError as exc:  # a run that did not recover is a result, not a crash
                failures.append(str(exc))
                for w in [w for w in workers if w.proc.poll() is not None]:
                    workers.remove(w)
                while len(workers) < 2:
                    workers.append(Worker(log_dir, "r"))
                for w in workers:
                    w.wait_ready()
    finally:
        sweeper.stop_event.set()
        for w in workers:
            w.stop()
    return {
        "kill_to_next_step_s": latency_summary(latencies),
        "kills": kills,
        "recovered": len(latencies),
        "failures": failures,
        "claims_per_run": claims,
        "details": details,
        "settings": {
            "DURABLE_LEASE_SECONDS": conf.lease_seconds(),
            "DURABLE_HEARTBEAT_SECONDS": conf.heartbeat_seconds(),
            "DURABLE_SWEEP_INTERVAL_SECONDS": conf.get("SWEEP_INTERVAL_SECONDS"),
            "DURABLE_WORKER_BEAT_SECONDS": conf.worker_beat_seconds(),
            "DURABLE_WORKER_DEAD_AFTER_SECONDS": conf.worker_dead_after_seconds(),
            "step_seconds": step_sleep,
            "sweeper": "thread in the harness",
        },
    }


def _one_kill(
    workers: list[Worker],
    log_dir: Path,
    step_sleep: float,
    latencies: list[float],
    claims: list[int],
    details: list[dict[str, Any]],
) -> None:
    import durable
    from durable.models import Run, RunStatus, Step

    run = durable.start("bench.slow", {"steps": 12, "sleep": step_sleep})
    run_id = run.id
    row = _wait(
        lambda: (
            Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, cursor_position__gte=2)
            .values("lease_owner", "cursor_position")
            .first()
        ),
        60,
        "the run to be mid-way",
        interval=0.01,
    )
    pid = int(row["lease_owner"].split(":")[1])
    victim = next((w for w in workers if w.pid == pid), None)
    if victim is None:
        raise RuntimeError(f"run {run_id} is held by {row['lease_owner']}, not a bench worker")
    # kill in the middle of a step: just after a checkpoint
    pos = row["cursor_position"]
    _wait(
        lambda: Run.objects.filter(pk=run_id, cursor_position__gt=pos).exists(),
        10,
        "the next checkpoint",
        interval=0.005,
    )
    time.sleep(step_sleep / 2)
    victim.kill()
    t_kill = time.time()
    workers.remove(victim)
    started = _wait(
        lambda: (
            Step.objects.filter(run_id=run_id)
            .order_by("position")
            .filter(started_at__gt=datetime.fromtimestamp(t_kill, tz=UTC))
            .values_list("started_at", flat=True)
            .first()
        ),
        60,
        "the next step on the other worker",
        interval=0.01,
    )
    latency = _ts(started) - t_kill
    latencies.append(latency)
    claimed = Run.objects.filter(pk=run_id).values_list("lease_owner", flat=True).first()
    from durable.models import TraceEvent

    released_by = list(
        TraceEvent.objects.filter(
            run_id=run_id, kind__in=["owner_dead", "lease_expired"]
        ).values_list("kind", flat=True)
    )
    details.append(
        {"latency_s": latency, "killed_pid": pid, "new_owner": claimed, "released_by": released_by}
    )
    replacement = Worker(log_dir, "r")
    workers.append(replacement)
    _wait(
        lambda: Run.objects.filter(pk=run_id, status=RunStatus.SUCCEEDED).exists(),
        60,
        "the recovered run to finish",
        interval=0.05,
    )
    claims.append(Run.objects.get(pk=run_id).claims)
    replacement.wait_ready()


# ---------------------------------------------------------------------------- approval


def approval(quick: bool, log_dir: Path) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import NotSupportedError, transaction

    import durable
    from approvals.models import ApprovalRequest, ApprovalStatus
    from approvals.services import approval_decide
    from durable.models import Run, RunStatus, Step

    n = 3 if quick else 20
    User = get_user_model()
    user = User.objects.filter(username="bench-approver").first()
    if user is None:
        user = User.objects.create_superuser("bench-approver", "bench@example.com", None)
    purge_broker()
    worker = Worker(log_dir, "a")
    latencies = []
    patched = ""
    try:
        worker.wait_ready()
        for i in range(n + 1):
            run = durable.start("bench.approval", {"i": i})
            req_id = _wait(
                lambda run=run: (
                    ApprovalRequest.objects.filter(run_id=run.id, status=ApprovalStatus.PENDING)
                    .values_list("pk", flat=True)
                    .first()
                ),
                30,
                "the approval request",
                interval=0.01,
            )
            _wait(
                lambda run=run: Run.objects.filter(pk=run.id, status=RunStatus.WAITING).exists(),
                30,
                "the run to wait",
            )
            box: dict[str, float] = {}
            try:
                with transaction.atomic():
                    transaction.on_commit(lambda box=box: box.setdefault("t", time.time()))
                    approval_decide(request_id=req_id, user=user, approve=True)
            except NotSupportedError as exc:
                if patched:
                    raise
                # approval_decide locks a LEFT JOIN (select_related of a nullable FK) with
                # FOR UPDATE, which PostgreSQL refuses; lock only the request's own rows
                # in this process so that the latency can still be measured
                patched = f"{type(exc).__name__}: {exc}"
                _lock_only_self()
                box.clear()
                with transaction.atomic():
                    transaction.on_commit(lambda box=box: box.setdefault("t", time.time()))
                    approval_decide(request_id=req_id, user=user, approve=True)
            started = _wait(
                lambda run=run: (
                    Step.objects.filter(run_id=run.id, step_id="after")
                    .values_list("started_at", flat=True)
                    .first()
                ),
                30,
                "the step after the approval",
            )
            if i:  # the first one warms up
                latencies.append((_ts(started) - box["t"]) * 1000)
            _wait(
                lambda run=run: Run.objects.filter(pk=run.id, status=RunStatus.SUCCEEDED).exists(),
                30,
                "the run to finish",
            )
    finally:
        worker.stop()
    out = {"decision_to_next_step_ms": latency_summary(latencies), "approvals": n}
    if patched:
        out["workaround"] = (
            "approvals.services.approval_decide failed on PostgreSQL ("
            + patched.splitlines()[0]
            + "); measured with "
            "select_for_update(of=('self',)) patched in by the harness"
        )
    return out


def _lock_only_self() -> None:
    """Make ``select_for_update()`` without ``of`` lock only the queried table's rows."""
    from django.db.models import QuerySet

    original = QuerySet.select_for_update

    def select_for_update(self, nowait=False, skip_locked=False, of=(), no_key=False):
        return original(
            self, nowait=nowait, skip_locked=skip_locked, of=of or ("self",), no_key=no_key
        )

    QuerySet.select_for_update = select_for_update


PARTS = {"dispatch": dispatch, "throughput": throughput, "recovery": recovery, "approval": approval}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.procs")
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--log-dir", required=True)
    args = parser.parse_args()
    setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    use_private_queue()
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    emit(PARTS[args.part](args.quick, log_dir))


if __name__ == "__main__":
    main()
