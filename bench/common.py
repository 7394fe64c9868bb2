"""Shared helpers of the benchmark: statistics, databases, environments, child processes.

Nothing here imports Django: the orchestrator (``python -m bench``) never configures
Django itself. Every measurement runs in a child process whose environment names its
database and broker, because Django settings are fixed per process.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
CELERY = str(Path(sys.executable).parent / "celery")

#: lines a child process prints to report to the orchestrator start with this marker;
#: anything else on its stdout (library chatter) is passed through to stderr
MARK = "@@BENCH "

#: a fixed key so that every bench process (harness, workers) derives the same encryption key
SECRET_KEY = "bench-not-a-secret-" + "x" * 40


# ------------------------------------------------------------------------- statistics


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements (plus their count)."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation (numpy's default)."""
    vals = sorted(float(v) for v in values)
    if not vals:
        return math.nan
    if len(vals) == 1:
        return vals[0]
    k = (len(vals) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    vals = list(values)
    return {
        "p50": percentile(vals, 50),
        "p95": percentile(vals, 95),
        "p99": percentile(vals, 99),
        "min": min(vals) if vals else math.nan,
        "max": max(vals) if vals else math.nan,
        "n": len(vals),
    }


# -------------------------------------------------------------------------- databases


@dataclass
class Config:
    """What one invocation measures and where (built from the command line)."""

    pg_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    redis_url: str = "redis://127.0.0.1:6379/13"
    var_dir: Path = Path("/tmp/bench_var")
    db_prefix: str = "bench_"
    quick: bool = False
    reps: int = 5
    parts: list[str] = field(default_factory=list)
    systems: list[str] = field(default_factory=list)
    dbs: list[str] = field(default_factory=list)
    seed_runs: int = 100_000
    seed_steps: int = 2_000_000
    reseed: bool = False
    verbose: bool = False

    def pg_db_url(self, name: str) -> str:
        """The server URL with the database ``<prefix><name>``."""
        parts = urlsplit(self.pg_url)
        return urlunsplit(parts._replace(path="/" + self.db_prefix + name))

    def pg_db_name(self, name: str) -> str:
        return self.db_prefix + name

    def sqlite_path(self, name: str) -> Path:
        return self.var_dir / f"{name}.sqlite3"


def pg_admin(cfg: Config):
    """An autocommit connection to the server's maintenance database (``postgres``)."""
    import psycopg

    return psycopg.connect(cfg.pg_url, autocommit=True)


def pg_available(cfg: Config) -> str | None:
    """None when PostgreSQL answers, else the reason."""
    try:
        with pg_admin(cfg) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        return f"{type(exc).__name__}: {exc}"
    return None


def redis_available(cfg: Config) -> str | None:
    try:
        import redis

        client = redis.Redis.from_url(cfg.redis_url, socket_connect_timeout=2)
        client.ping()
        client.close()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


def recreate_pg_db(cfg: Config, name: str) -> str:
    """Drop and create ``<prefix><name>``; returns its URL."""
    db = cfg.pg_db_name(name)
    with pg_admin(cfg) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')
    return cfg.pg_db_url(name)


def pg_db_exists(cfg: Config, name: str) -> bool:
    with pg_admin(cfg) as conn:
        return (
            conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (cfg.pg_db_name(name),)
            ).fetchone()
            is not None
        )


def remove_sqlite(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(path) + suffix)


def xact_commit(cfg: Config, name: str) -> int:
    """Committed transactions of database ``<prefix><name>`` (from another database, so
    that reading the counter does not move it)."""
    with pg_admin(cfg) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (cfg.pg_db_name(name),)
        ).fetchone()
    return int(row[0]) if row else 0


def backends(cfg: Config, name: str) -> int:
    with pg_admin(cfg) as conn:
        return int(
            conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (cfg.pg_db_name(name),)
            ).fetchone()[0]
        )


def settled_xact_commit(
    cfg: Config, name: str, *, until_backends: int = 0, timeout: float = 5.0
) -> int:
    """``xact_commit`` once the database has at most ``until_backends`` connections.

    A backend flushes its pending statistics when it exits, and PostgreSQL 15 removes it
    from ``pg_stat_activity`` only after that, so waiting for the connections to go is
    waiting for their counts to land.
    """
    deadline = time.monotonic() + timeout
    while backends(cfg, name) > until_backends and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.05)
    return xact_commit(cfg, name)


def relation_bytes(conn, tables: Iterable[str]) -> int:
    """Sum of ``pg_total_relation_size`` (heap, indexes, TOAST) of ``tables``."""
    total = 0
    for table in tables:
        row = conn.execute("SELECT pg_total_relation_size(to_regclass(%s))", (table,)).fetchone()
        total += int(row[0] or 0)
    return total


# ----------------------------------------------------------------------- environments


def django_env(
    cfg: Config,
    *,
    database_url: str,
    broker_url: str | None = None,
    dispatch: str = "manual",
    **extra: str,
) -> dict[str, str]:
    """The environment of a bench process or worker that runs Django."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "CRASH_"))
        and k not in ("DURABLE_HEARTBEAT_SECONDS", "DJANGO_SETTINGS_MODULE")
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONPATH": str(REPO)
            + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
            "PYTHONUNBUFFERED": "1",
            "DATABASE_URL": database_url,
            "DURABLE_VAR_DIR": str(cfg.var_dir),
            "DJANGO_SECRET_KEY": SECRET_KEY,
            "DURABLE_DISPATCH": dispatch,
            "DURABLE_WORKFLOW_MODULES": "bench.workflows",
            # bench.workflows only, as the peers' workers load only theirs
            "DURABLE_AUTODISCOVER": "false",
            "DJANGO_LOG_LEVEL": "WARNING",
        }
    )
    if broker_url is not None:
        env["CELERY_BROKER_URL"] = broker_url
    else:
        env.pop("CELERY_BROKER_URL", None)
    env.update(extra)
    return env


def proc_env(cfg: Config, *, db: str, broker: str, **extra: str) -> dict[str, str]:
    """The environment of ``bench.procs`` and its Celery workers: a fresh ``<prefix>proc``
    database (or SQLite file), ``broker`` ``"redis"`` or ``"filesystem"``, and a queue of
    the bench's own (the broker and its database number may be shared with others)."""
    import uuid

    if db == "postgresql":
        url = recreate_pg_db(cfg, "proc").replace("postgresql://", "postgres://", 1)
    else:
        path = cfg.sqlite_path("proc")
        remove_sqlite(path)
        url = f"sqlite:///{path}"
    broker_url = cfg.redis_url if broker == "redis" else "filesystem://"
    extra.setdefault("BENCH_QUEUE", f"bench.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    return django_env(cfg, database_url=url, broker_url=broker_url, dispatch="celery", **extra)


def run_procs(cfg: Config, part: str, env: dict[str, str], log_dir: Path) -> dict[str, Any]:
    """Run ``python -m bench.procs PART`` in ``env``; returns its report."""
    args = [part, "--log-dir", str(log_dir / f"workers-{part}")]
    if cfg.quick:
        args.append("--quick")
    return run_child("bench.procs", args, env, timeout=3600, verbose=cfg.verbose)[-1]


def pg_redis_problem(cfg: Config) -> str | None:
    """None when both PostgreSQL and Redis answer, else the reason."""
    return pg_available(cfg) or redis_available(cfg)


def log(msg: str) -> None:
    """A progress line of the orchestrator, on stderr."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def versions(cfg: Config) -> dict[str, str]:
    """Versions of the peers, the drivers and the servers, for the results' header."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in (
        "django",
        "celery",
        "kombu",
        "psycopg",
        "dbos",
        "langgraph",
        "langgraph-checkpoint-postgres",
        "langgraph-checkpoint-sqlite",
        "redis",
    ):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    try:
        with pg_admin(cfg) as conn:
            out["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
    except Exception:  # noqa: BLE001, S110 - the version is informative only
        pass
    import sqlite3

    out["sqlite"] = sqlite3.sqlite_version
    return out


def setup_django() -> None:
    """Configure Django in this (child) process from its environment."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def setup_django_on_postgresql(what: str) -> None:
    """:func:`setup_django`, then the migrations, for a part that needs PostgreSQL
    (``DATABASE_URL``); exits saying so, naming ``what``, on another database."""
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit(f"{what} needs PostgreSQL (DATABASE_URL)")
    call_command("migrate", verbosity=0, interactive=False)


def emit(payload: Any) -> None:
    """Report ``payload`` (JSON) to the orchestrator."""
    sys.stdout.write(MARK + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------- child processes


class ChildError(RuntimeError):
    pass


def run_child(
    module: str,
    args: list[str],
    env: dict[str, str],
    *,
    timeout: float = 3600,
    verbose: bool = False,
) -> list[Any]:
    """Run ``python -m module args`` and return the payloads it emitted."""
    proc = subprocess.Popen(
        [PYTHON, "-m", module, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise ChildError(
            f"{module} {' '.join(args)} timed out after {timeout} s:\n{_tail(err)}"
        ) from None
    payloads = [json.loads(line[len(MARK) :]) for line in out.splitlines() if line.startswith(MARK)]
    if verbose and err:
        sys.stderr.write(err)
    if proc.returncode != 0:
        raise ChildError(f"{module} {' '.join(args)} exited {proc.returncode}:\n{_tail(err)}")
    return payloads


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join((text or "").splitlines()[-lines:])


class Server:
    """A long-lived child that answers JSON commands, one line each way.

    Used to interleave repetitions of several systems (each warmed up once in its own
    process) so that a slow minute of a noisy machine hits all of them alike.
    """

    def __init__(
        self,
        module: str,
        args: list[str],
        env: dict[str, str],
        *,
        log_path: Path,
        ready_timeout: float = 180,
    ) -> None:
        self.label = " ".join(args)
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [PYTHON, "-m", module, *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self.ready_timeout = ready_timeout
        self.hello: Any = None

    def wait_ready(self) -> Any:
        """Block until the child reported that it is set up; returns its hello."""
        if self.hello is None:
            self.hello = self._read(self.ready_timeout)
        return self.hello

    def _read(self, timeout: float) -> Any:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ChildError(f"{self.label}: no answer within {timeout} s\n{self.tail()}")
                if not sel.select(timeout=min(remaining, 1.0)):
                    if self.proc.poll() is not None:
                        raise ChildError(
                            f"{self.label}: exited {self.proc.returncode}\n{self.tail()}"
                        )
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    self.proc.wait(timeout=5)
                    raise ChildError(f"{self.label}: exited {self.proc.returncode}\n{self.tail()}")
                if line.startswith(MARK):
                    payload = json.loads(line[len(MARK) :])
                    if isinstance(payload, dict) and payload.get("error"):
                        raise ChildError(f"{self.label}: {payload['error']}")
                    return payload
                self._log.write(line)
        finally:
            sel.close()

    def ask(self, op: str, timeout: float = 1800, **kwargs: Any) -> Any:
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def tail(self, lines: int = 40) -> str:
        self._log.flush()
        try:
            return _tail(self.log_path.read_text(errors="replace"), lines)
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def serve(handlers: dict[str, Any]) -> None:
    """The child side of :class:`Server`: answer commands from stdin until ``quit``."""
    import traceback

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "quit":
            break
        try:
            emit(handlers[op](**cmd))
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
            traceback.print_exc()
            emit({"error": f"{op}: {type(exc).__name__}: {exc}"})


def machine_info() -> dict[str, Any]:
    import platform

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    return info


def frame_tables(root: Any, per: float, top: int = 20) -> dict[str, Any]:
    """Summaries of a pyinstrument call tree: own time per function, inclusive time of the
    project's own functions, and the share spent in SQL and in template rendering.
    ``per``: divide times by this (steps, requests) and report milliseconds."""
    selfs: dict[str, float] = {}
    inclusive: dict[str, float] = {}
    buckets = {"sql (psycopg, sqlite3)": 0.0, "templates (django.template)": 0.0}
    stack = [(root, frozenset(), "")] if root is not None else []
    while stack:
        frame, above, bucket = stack.pop()
        if frame.is_synthetic:
            continue
        path = frame.file_path_short or ""
        key = f"{frame.function} ({path}:{frame.line_no})"
        if key not in above:  # a recursive function counts once per call path
            inclusive[key] = inclusive.get(key, 0.0) + frame.time
        selfs[key] = selfs.get(key, 0.0) + frame.total_self_time
        if not bucket:
            if path.startswith(("psycopg", "sqlite3")) or "backends/sqlite3" in path:
                bucket = "sql (psycopg, sqlite3)"
                buckets[bucket] += frame.time
            elif path.startswith("django/template"):
                bucket = "templates (django.template)"
                buckets[bucket] += frame.time
        below = above | {key}
        stack.extend((child, below, bucket) for child in frame.children)
    total = sum(selfs.values()) or 1.0

    def table(values: dict[str, float], keep: Any) -> list[dict[str, Any]]:
        return [
            {"function": k, "ms": v / per * 1000, "share": v / total}
            for k, v in sorted(values.items(), key=lambda kv: -kv[1])
            if keep(k)
        ][:top]

    own = ("durable/", "dashboard/", "approvals/", "templates/")
    return {
        "top_self": table(selfs, lambda k: True),
        "top_project": table(inclusive, lambda k: any(o in k for o in own)),
        "buckets": {k: {"ms": v / per * 1000, "share": v / total} for k, v in buckets.items()},
        "sampled_ms": total / per * 1000,
    }
