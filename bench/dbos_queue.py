"""Throughput of DBOS Transact's queue, the peer of Durable's worker processes.

``python -m bench.dbos_queue harness --url URL --log-dir DIR --runs 1:N,2:N,4:N`` starts,
for each worker count, that many ``python -m bench.dbos_queue worker`` processes (each
one DBOS executor, its own ``executor_id``) against one DBOS system database (``URL``, a
database of its own on the same PostgreSQL server as Durable's), enqueues the batch of
runs of 20 no-op steps in one transaction (``DBOSClient.enqueue_in_transaction``) and
reports steps / (last ``completed_at`` - commit), as Durable's part does with its
``finished_at``. Each executor runs one workflow at a time (``worker_concurrency=1``,
like Durable's ``--pool=solo`` worker) and polls the queue every ``--poll`` seconds
(DBOS's default is 1 s, which would measure the poll, not DBOS: a worker that may run
one workflow takes one per poll). Nothing here imports Django.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .common import MARK, PYTHON, REPO, emit

APP = "bench_tput"
QUEUE = "bench_tput"
WORKFLOW = "bench_tput_noop"


# ------------------------------------------------------------------------------ worker


def worker(url: str, executor: str, poll: float, concurrency: int) -> None:
    """One DBOS executor: registers the no-op workflow and dequeues from the queue until
    SIGTERM (or its stdin closes)."""
    from dbos import DBOS

    DBOS(
        config={
            "name": APP,
            "system_database_url": url,
            "executor_id": executor,
            "log_level": "WARNING",
        }
    )

    @DBOS.step()
    def noop_step() -> None:
        return None

    @DBOS.workflow(name=WORKFLOW)
    def noop_workflow(n: int) -> int:
        for _ in range(n):
            noop_step()
        return n

    DBOS.launch()
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=concurrency,
        polling_interval_sec=poll,
        on_conflict="always_update",
    )
    emit({"ready": True, "pid": os.getpid(), "executor": executor})
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    while not stop["flag"]:
        time.sleep(0.1)
    DBOS.destroy(workflow_completion_timeout_sec=0)


class Executor:
    """A ``bench.dbos_queue worker`` child process (its own session, killed as a group)."""

    def __init__(self, url: str, executor: str, poll: float, log_dir: Path) -> None:
        self.executor = executor
        self.log_path = log_dir / f"dbos-{executor}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "bench.dbos_queue", "worker", "--url", url]
            + ["--executor", executor, "--poll", str(poll)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 120) -> None:
        import selectors

        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if sel.select(timeout=1.0):
                    line = self.proc.stdout.readline().decode(errors="replace")
                    if line.startswith(MARK):
                        return
                    if not line and self.proc.poll() is not None:
                        break
                elif self.proc.poll() is not None:
                    break
        finally:
            sel.close()
        tail = self.log_path.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"DBOS executor {self.executor} not ready:\n" + "\n".join(tail))

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()


# ----------------------------------------------------------------------------- harness


def _batch(client: Any, engine: Any, runs: int, steps: int, timeout: float) -> dict[str, Any]:
    """Enqueue ``runs`` workflows in one transaction; wait until all are SUCCESS."""
    import sqlalchemy as sa

    ids = [f"tput-{uuid.uuid4().hex}" for _ in range(runs)]
    with engine.begin() as conn:
        for wid in ids:
            client.enqueue_in_transaction(
                conn, {"queue_name": QUEUE, "workflow_name": WORKFLOW, "workflow_id": wid}, steps
            )
    t0 = time.time()  # committed: the executors may dequeue from now on
    query = sa.text(
        "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), "
        "count(*) FILTER (WHERE status IN ('ERROR', 'CANCELLED', "
        "'MAX_RECOVERY_ATTEMPTS_EXCEEDED')), max(completed_at) "
        "FROM dbos.workflow_status WHERE workflow_uuid = ANY(:ids)"
    )
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            done, failed, last = conn.execute(query, {"ids": ids}).one()
        if done + failed >= runs:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"DBOS: {done} of {runs} workflows done after {timeout} s")
        time.sleep(0.2)
    seconds = int(last) / 1000 - t0
    return {
        "runs": runs,
        "steps": runs * steps,
        "seconds": seconds,
        "steps_per_second": runs * steps / seconds,
        "failed": int(failed),
    }


def harness(
    url: str, log_dir: Path, plan: list[tuple[int, int]], poll: float, steps: int
) -> dict[str, Any]:
    import sqlalchemy as sa
    from dbos import DBOSClient

    log_dir.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    out: dict[str, Any] = {
        "steps_per_run": steps,
        "settings": {
            "worker_concurrency": 1,
            "polling_interval_sec": poll,
            "system_database": "one, shared by the executors (DBOS's queue lives in it)",
        },
    }
    client = None
    for count, runs in plan:
        tag = uuid.uuid4().hex[:6]
        executors: list[Executor] = []
        try:
            # the first one alone: DBOS migrates its system database at launch
            for i in range(count):
                executors.append(Executor(url, f"w{count}-{i}-{tag}", poll, log_dir))
                if i == 0:
                    executors[0].wait_ready()
            for ex in executors[1:]:
                ex.wait_ready()
            if client is None:
                client = DBOSClient(system_database_url=url, application_name=APP)
            _batch(client, engine, 2 * count, steps, 120)  # warm up every executor
            result = _batch(client, engine, runs, steps, 1800)
            result["rss_after_mb"] = [ex.rss_mb() for ex in executors]
            result["steps_per_worker"] = result["steps"] / count
        finally:
            for ex in executors:
                ex.stop()
        out[f"workers_{count}"] = result
    if client is not None:
        client.destroy()
    engine.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dbos_queue")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--url", required=True)
    w.add_argument("--executor", required=True)
    w.add_argument("--poll", type=float, default=0.01)
    w.add_argument("--concurrency", type=int, default=1)
    h = sub.add_parser("harness")
    h.add_argument("--url", required=True)
    h.add_argument("--log-dir", required=True)
    h.add_argument("--runs", required=True, help="workers:runs,... e.g. 1:300,2:300,4:300")
    h.add_argument("--poll", type=float, default=0.01)
    h.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if args.cmd == "worker":
        worker(args.url, args.executor, args.poll, args.concurrency)
        return
    plan = [(int(a), int(b)) for a, b in (x.split(":") for x in args.runs.split(",") if x)]
    emit(harness(args.url, Path(args.log_dir), plan, args.poll, args.steps))


if __name__ == "__main__":
    sys.exit(main())
