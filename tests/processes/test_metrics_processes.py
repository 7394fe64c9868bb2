"""A real Celery worker serves its own metrics port (durable/observability/metrics_server.py).

- A prefork worker with ``PROMETHEUS_MULTIPROC_DIR``: the steps a child executed are
  counted in the child and scraped from the main process's port; with
  ``--max-tasks-per-child=1`` the child that ran the run is replaced by one forked
  after the server started, and that child does not hold the listening socket.
- A solo worker without the multiprocess folder serves its own registry.
- A port already taken: the worker logs an ERROR naming it and still runs a workflow.
"""

from __future__ import annotations

import os
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import durable
from durable.models import RunStatus
from tests.harness import Worker, wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
        assert response.status == 200
        return response.read().decode()


def try_scrape(port: int) -> str | None:
    try:
        return scrape(port)
    except OSError:
        return None


def steps_executed(text: str, kind: str = "step") -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "durable_steps_executed_total" and sample.labels == {"kind": kind}:
                return float(sample.value)
    return 0.0


def wait_for_steps(port: int, at_least: float, timeout: float = 20.0) -> str:
    """Scrape until ``durable_steps_executed_total{kind="step"}`` reaches ``at_least``
    (a run's last counter is counted just after its final checkpoint commits)."""
    return wait_until(
        lambda: (text := try_scrape(port)) and steps_executed(text) >= at_least and text,
        timeout,
        what=f"durable_steps_executed_total >= {at_least} on :{port}",
        sweep=False,
    )


def run_ten_steps(n: int = 1) -> None:
    run = durable.start("crash.ten_steps", {"n": n})
    assert wait_for_run(run.id).status == RunStatus.SUCCEEDED


# ----------------------------------------------------------------- /proc inspection


def children_of(pid: int) -> set[int]:
    """Pids whose parent is ``pid`` (from /proc/<pid>/stat)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, ...
        if int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on ``port`` (state 0A in /proc/net/tcp and tcp6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def holds_socket(pid: int, inodes: set[str]) -> bool:
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:  # the process exited: it holds nothing
        return False
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


needs_proc = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="reads the process table from Linux /proc"
)


# -------------------------------------------------------------------------------- tests


@needs_proc
def test_a_prefork_workers_port_shows_the_steps_its_children_executed(workers, tmp_path):
    port = free_port()
    folder = tmp_path / "prometheus"
    folder.mkdir()
    worker: Worker = workers.start(
        pool="prefork",
        concurrency=2,
        args=("--max-tasks-per-child=1",),
        wait=True,
        DURABLE_METRICS_PORT=str(port),
        PROMETHEUS_MULTIPROC_DIR=str(folder),
    )
    wait_until(lambda: try_scrape(port), 20, what=f"the worker's port {port}", sweep=False)
    assert f"serving Prometheus metrics on http://127.0.0.1:{port}/" in worker.log_text()
    before = children_of(worker.pid)
    assert before, "a prefork worker has children"

    run_ten_steps()
    text = wait_for_steps(port, 10)
    assert steps_executed(text) == 10, text  # each step once, summed over the processes
    assert 'durable_checkpoint_seconds_count{path="' in text
    counted_by = {p.stem.rsplit("_", 1)[1] for p in folder.glob("counter_*.db")}
    assert counted_by - {str(worker.pid)}, "a child counted the steps"

    # the child that ran the run exits after it (--max-tasks-per-child=1); its
    # replacement is forked after the server started, yet holds no listening socket
    replaced = wait_until(
        lambda: children_of(worker.pid) - before,
        20,
        what="a prefork child forked after the metrics server started",
        sweep=False,
    )
    inodes = listening_inodes(port)
    assert inodes, f"nothing listens on {port}"
    assert holds_socket(worker.pid, inodes)

    def holding() -> set[int]:
        return {c for c in replaced | children_of(worker.pid) if holds_socket(c, inodes)}

    # the child closes its copy in its after-fork hook, which a loaded machine may not
    # have scheduled yet when the child is first seen: each child must let go of it
    wait_until(lambda: not holding(), 20, what="no child holding the metrics socket", sweep=False)

    # a second run in another (fresh) child: still one view of every process's counters
    run_ten_steps(2)
    assert steps_executed(wait_for_steps(port, 20)) == 20
    assert worker.alive()


def test_a_solo_worker_without_the_multiprocess_folder_serves_its_own_counters(
    workers, monkeypatch
):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    port = free_port()
    worker = workers.start(wait=True, DURABLE_METRICS_PORT=str(port))
    wait_until(lambda: try_scrape(port), 20, what=f"the worker's port {port}", sweep=False)
    run_ten_steps()
    text = wait_for_steps(port, 10)
    assert steps_executed(text) == 10, text
    assert "process_cpu_seconds_total" in text  # the process's own default collectors
    assert worker.alive()


def test_a_port_already_taken_is_logged_and_the_worker_still_runs(workers, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        folder = tmp_path / "prometheus"
        folder.mkdir()
        worker = workers.start(
            wait=True, DURABLE_METRICS_PORT=str(port), PROMETHEUS_MULTIPROC_DIR=str(folder)
        )
        message = f"cannot serve on 127.0.0.1:{port}"
        line = wait_until(
            lambda: next((ln for ln in worker.log_text().splitlines() if message in ln), None),
            20,
            what=f"the worker to log {message!r}",
            sweep=False,
        )
        assert " ERROR " in line, line
        run_ten_steps()
        assert worker.alive()
        assert "serving Prometheus metrics" not in worker.log_text()
