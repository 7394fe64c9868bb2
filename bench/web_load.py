"""The web process under concurrent clients: throughput, latency, errors, connections.

``python -m bench.web_load --clients 64 --seconds 20`` (environment: ``DATABASE_URL`` of a
PostgreSQL database; ``python -m bench.dashboard`` seeds one at scale) migrates, makes an
operator with an API token, starts one daphne process serving ``config.asgi:application``
as in production (``--processes N``: N of them, client ``n`` talking to process
``n % N``, as a load balancer spreading connections would), and lets ``--clients``
concurrent HTTP clients (httpx, asyncio; each waits for its answer before asking again,
as wrk's connections do) read the runs list of the API and a run's detail for
``--seconds``. It reports requests a second, p50/p95/p99 latency (ms) of all requests and
of each kind apart (``list``: the runs list, 50 a page; ``detail``: the newest run with
its steps, the seed's 500-step run), the answers by status (0 errors is the target: a 503
with ``Retry-After`` is counted apart from a 500), and the most PostgreSQL connections
the web processes held at once (sampled every 50 ms from ``pg_stat_activity`` by
``application_name``), and the CPU time per answered request of the web processes and
of their PostgreSQL backends (from ``/proc``: the cost of a request whatever else the
machine runs, so what a core serves).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .common import emit, latency_summary, setup_django_on_postgresql

REPO = Path(__file__).resolve().parent.parent
DAPHNE = Path(sys.executable).with_name("daphne")
#: what the web process calls itself in pg_stat_activity (config/settings.py)
WEB_APPLICATION_NAME = "durable-web"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def operator_token() -> tuple[str, str]:
    """``(token, a run id)``: an operator's API token and a run to read (made if none)."""
    from django.contrib.auth.models import Group, User

    import durable
    from api.tokens import token_create
    from durable.models import Run

    user, _ = User.objects.get_or_create(username="bench-load")
    user.groups.add(Group.objects.get(name="operator"))
    _, text = token_create(user=user, name="bench-load", scopes=["runs:read"])
    run = Run.objects.order_by("-created_at").first()
    if run is None:
        import bench.workflows  # noqa: F401 - registers the bench workflows

        for n in range(200):
            run = durable.start("bench.noop", {"n": n})
    assert run is not None
    return text, run.id


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backends_cpu(dsn: str, application_name: str) -> float:
    """CPU seconds the PostgreSQL backends of ``application_name`` have used (the
    database on this machine); 0 when their processes cannot be read."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchall()
    total = 0.0
    for (pid,) in rows:
        with contextlib.suppress(OSError):  # gone, or not ours to read
            total += cpu_seconds(int(pid))
    return total


class Daphne:
    """One daphne process (its own process group), as ``make up`` runs the web."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(DAPHNE), "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"daphne exited {self.proc.returncode}: see {log}")
            try:
                with urllib.request.urlopen(f"{self.url}/accounts/login/", timeout=2):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.1)
        raise SystemExit(f"daphne did not answer within 60 s: see {log}")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


class ConnectionSampler(threading.Thread):
    """The most connections ``application_name`` held at once, sampled every 50 ms."""

    def __init__(self, dsn: str, application_name: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.application_name = application_name
        self.most = 0
        self.samples = 0
        self._done = threading.Event()

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._done.wait(0.05):
                conn.execute("SELECT pg_stat_clear_snapshot()")
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    (self.application_name,),
                ).fetchone()
                self.most = max(self.most, int(row[0]) if row else 0)
                self.samples += 1

    def stop(self) -> int:
        self._done.set()
        self.join(timeout=5)
        return self.most


async def load(
    urls: list[str], token: str, run_id: str, clients: int, seconds: float
) -> dict[str, Any]:
    """``clients`` closed-loop clients for ``seconds``, client ``n`` asking ``urls[n % len]``
    (one web process each, as a load balancer spreading connections would): latencies
    (s) and answers by status."""
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line a request otherwise
    paths = [("list", "/api/v1/runs?limit=50"), ("detail", f"/api/v1/runs/{run_id}")]
    latencies: list[float] = []
    by_kind: dict[str, list[float]] = {kind: [] for kind, _ in paths}
    statuses: collections.Counter[str] = collections.Counter()
    headers = {"Authorization": f"Bearer {token}"}
    end = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(n: int, http: httpx.AsyncClient) -> None:
        i = n
        url = urls[n % len(urls)]
        while time.monotonic() < end:
            kind, path = paths[i % len(paths)]
            i += 1
            started = time.perf_counter()
            try:
                response = await http.get(url + path, headers=headers)
                statuses[str(response.status_code)] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
            latencies.append(time.perf_counter() - started)
            by_kind[kind].append(latencies[-1])

    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await asyncio.gather(*(client(n, http) for n in range(clients)))
    return {"latencies": latencies, "by_kind": by_kind, "statuses": dict(statuses)}


def _ms(latencies: list[float]) -> dict[str, float]:
    """p50, p95, p99, min and max of ``latencies`` (seconds), in ms."""
    return {k: round(v * 1000, 1) for k, v in latency_summary(latencies).items() if k != "n"}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.web_load")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--processes", type=int, default=1, help="daphne processes, the clients spread over them"
    )
    args = parser.parse_args()
    setup_django_on_postgresql("the web load benchmark")
    from django.db import connection

    token, run_id = operator_token()
    dsn = connection.get_connection_params()
    keys = ("host", "port", "user", "dbname")
    dsn_text = " ".join(f"{k}={v}" for k, v in dsn.items() if k in keys)
    env = {**os.environ, "DJANGO_DEBUG": "0", "PYTHONUNBUFFERED": "1"}
    log = Path(os.environ.get("BENCH_LOG_DIR", "/tmp")) / "bench-web-load-daphne.log"
    servers = [
        Daphne(env, log.with_name(f"{log.stem}-{n}{log.suffix}") if n else log)
        for n in range(args.processes)
    ]
    sampler = ConnectionSampler(dsn_text, WEB_APPLICATION_NAME)
    sampler.start()
    cpu_before = sum(cpu_seconds(s.proc.pid) for s in servers)
    client_before = time.thread_time()  # the clients' event loop runs on this thread
    started = time.monotonic()
    try:
        result = asyncio.run(
            load([s.url for s in servers], token, run_id, args.clients, args.seconds)
        )
    finally:
        elapsed = time.monotonic() - started
        client_cpu = time.thread_time() - client_before
        web_cpu = sum(cpu_seconds(s.proc.pid) for s in servers) - cpu_before
        db_cpu = backends_cpu(dsn_text, WEB_APPLICATION_NAME)
        for server in servers:
            server.stop()
        most = sampler.stop()
    statuses = result["statuses"]
    ok = sum(n for status, n in statuses.items() if status.startswith("2"))
    emit(
        {
            "clients": args.clients,
            "processes": args.processes,
            "seconds": round(elapsed, 1),
            "requests": len(result["latencies"]),
            "per_second": round(ok / elapsed, 1),
            "latency_ms": _ms(result["latencies"]),
            "latency_ms_by_kind": {k: _ms(v) for k, v in result["by_kind"].items()},
            "requests_by_kind": {k: len(v) for k, v in result["by_kind"].items()},
            "statuses": statuses,
            "errors": sum(n for status, n in statuses.items() if not status.startswith("2")),
            # the web processes' own CPU (user + system) per answered request: what a
            # core serves, whatever else the machine runs meanwhile
            "web_cpu_ms_per_request": round(web_cpu * 1000 / ok, 2) if ok else None,
            "web_cpu_cores_busy": round(web_cpu / elapsed, 2),
            # their PostgreSQL backends' CPU, the pools' connections (opened for the run)
            "db_cpu_ms_per_request": round(db_cpu * 1000 / ok, 2) if ok else None,
            # the load generator's own CPU (its event loop's thread): it shares the cores
            "client_cpu_ms_per_request": round(client_cpu * 1000 / ok, 2) if ok else None,
            "web_connections_most": most,
            "connection_samples": sampler.samples,
        }
    )


if __name__ == "__main__":
    main()
