"""Starting the example services as processes (for the chaos audit and the tests).

``ServiceSet.start(folder)`` starts the scripted LLM, the payments service and the SMTP
sink, each in its own session on a free port (``--port 0 --port-file``), with its state
and log in ``folder``; ``env()`` is what points the tools (and workers) at them.
:class:`Forked` starts a Celery worker forked from a fork server that imported
:data:`PRELOAD` once (the chaos audit's workers and the tests' alike).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 30.0


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def start_service(
    name: str, module: str, args: list[str], folder: Path, env: dict[str, str] | None = None
) -> Service:
    """Start ``python -m module args --port-file F`` and wait until it wrote its port(s)."""
    folder.mkdir(parents=True, exist_ok=True)
    port_file = folder / f"{name}.port"
    port_file.unlink(missing_ok=True)
    log_path = folder / f"{name}.log"
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the child from here on
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args, "--port-file", str(port_file)],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    service = Service(name, proc, log_path)
    deadline = time.monotonic() + READY_TIMEOUT
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{service.log_text()}")
        if time.monotonic() > deadline:
            service.stop(signal.SIGKILL)
            raise RuntimeError(f"{name} did not start in {READY_TIMEOUT} s:\n{service.log_text()}")
        time.sleep(0.05)
    text = port_file.read_text().strip()
    service.ports = json.loads(text) if text.startswith("{") else {"http": int(text)}
    return service


class ServiceSet:
    """The scripted LLM, the payments service and the SMTP sink, as processes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.llm: Service | None = None
        self.payments: Service | None = None
        self.sink: Service | None = None

    @classmethod
    def start(cls, folder: Path) -> ServiceSet:
        services = cls(folder)
        try:
            services.llm = start_service("fake_llm", "examples.fake_llm", ["--port", "0"], folder)
            services.start_payments()
            services.sink = start_service(
                "smtp_sink",
                "examples.smtp_sink",
                ["--smtp-port", "0", "--http-port", "0", "--db", str(folder / "sink.sqlite3")],
                folder,
            )
        except BaseException:
            services.stop()
            raise
        return services

    def start_payments(self, port: int = 0) -> Service:
        """(Re)start the payments service on ``port`` (0: a free one), keeping its data."""
        self.payments = start_service(
            "payments",
            "examples.payments_service",
            ["--port", str(port), "--db", str(self.folder / "payments.sqlite3")],
            self.folder,
        )
        return self.payments

    def all(self) -> list[Service]:
        return [s for s in (self.llm, self.payments, self.sink) if s is not None]

    def stop(self) -> None:
        for service in self.all():
            service.stop()

    # ---------------------------------------------------------------- addresses

    @property
    def llm_url(self) -> str:
        assert self.llm is not None
        return f"http://127.0.0.1:{self.llm.ports['http']}"

    @property
    def payments_url(self) -> str:
        assert self.payments is not None
        return f"http://127.0.0.1:{self.payments.ports['http']}"

    @property
    def sink_url(self) -> str:
        assert self.sink is not None
        return f"http://127.0.0.1:{self.sink.ports['http']}"

    def env(self) -> dict[str, str]:
        """Environment variables that point the tools and ``ctx.llm`` at these services."""
        assert self.sink is not None
        return {
            "OPENAI_BASE_URL": f"{self.llm_url}/v1",
            "OPENAI_API_KEY": "scripted",
            "DURABLE_LLM_MODEL": "scripted",
            "DURABLE_PAYMENTS_URL": self.payments_url,
            "DURABLE_SMTP_SINK_URL": self.sink_url,
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(self.sink.ports["smtp"]),
        }


def admin(base_url: str, method: str, path: str, body: Any = None) -> Any:
    """Call a service's JSON admin API (``/_admin/...``) and return the decoded answer."""
    response = httpx.request(method, f"{base_url}{path}", json=body, timeout=10.0)
    response.raise_for_status()
    return response.json()


# ------------------------------------------------------------------ the fork server

#: third-party modules every worker imports, imported once by the fork server: none of
#: them reads the settings or the worker's own environment at import time. Django's
#: settings, the project's apps, ninja (it reads the settings), anything that installs a
#: reactor or an event loop (daphne.server, twisted.internet.reactor) and
#: prometheus_client (it reads PROMETHEUS_MULTIPROC_DIR when imported) are imported in
#: each worker, after its environment is set. Twisted's modules below install nothing
#: (tests/test_fork_server.py checks it); the daphne app imports them (0.2 s a start).
PRELOAD = (
    "django.db.models",
    "django.core.handlers.base",
    "django.http",
    "django.urls",
    "django.template.base",
    "django.core.serializers.json",
    "django.contrib.admin.options",
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.worker.consumer",
    "kombu.transport.redis",
    "kombu.transport.filesystem",
    "redis",
    "psycopg",
    "httpx",
    "pydantic",
    "cryptography.fernet",
    "sqlparse",
    "yaml",
    "attr",
    "twisted.internet.interfaces",
    "twisted.internet.abstract",
    "twisted.internet.tcp",
    "twisted.internet.posixbase",
    # the agent frameworks (seconds of CPU at each worker start that runs their agents);
    "openai",
    "langgraph.graph",
    "pydantic_ai",
    "agents",
)

_forkserver: Any = None


def _context() -> Any:
    """multiprocessing's fork server, started once per process with :data:`PRELOAD`
    imported. Starting a worker forks it instead of starting a new interpreter: about a
    second of CPU saved at each of the suite's ~100 worker starts (measured in
    docs/testing.md)."""
    global _forkserver
    if _forkserver is None:
        import multiprocessing

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        _forkserver = ctx
    return _forkserver


def _run_celery(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """The forked child: its own session (a kill takes its process group), output to the
    log, the worker's environment and arguments, then Celery's own command line."""
    import io

    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # the server's own sys.stdout and sys.stderr are block-buffered objects of its start
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    os.chdir(REPO)
    os.environ.clear()
    os.environ.update(env)
    if env.get("CLOCK_OFFSET_FILE"):  # a host whose wall clock is off (examples/clock_skew.py)
        from .clock_skew import install

        install(env["CLOCK_OFFSET_FILE"])
    sys.argv = argv
    from celery.__main__ import main

    main()


class Forked:
    """A worker forked from the fork server, with the part of ``subprocess.Popen``'s
    interface the tests use: ``pid``, ``poll()``, ``wait(timeout)``, ``returncode``
    (negative: the signal that ended it, -9 after a SIGKILL)."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args = argv
        self.process = _context().Process(
            target=_run_celery, args=(argv, env, str(log_path)), daemon=True
        )
        self.process.start()

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return None if self.process.is_alive() else self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.process.exitcode
