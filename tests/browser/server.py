"""The real ASGI app, served by daphne in a process of its own, against the test database.

:class:`Daphne` starts ``daphne config.asgi:application`` on a free port of 127.0.0.1 with
the environment a harness worker gets (:func:`tests.harness.worker_env`: the test
database's ``DATABASE_URL``, the same broker and broker folder, ``DJANGO_SECRET_KEY`` and
``DURABLE_VAR_DIR``, ``DURABLE_DISPATCH=celery``), so an action taken in the browser
commits in the test database and sends its hint to the test's worker processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.harness import REPO

DAPHNE = Path(sys.executable).parent / "daphne"
#: daphne imports Django, the project and Channels before it listens
READY_TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Daphne:
    """One daphne process in its own session (a kill takes its whole process group)."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, attempts: int = 3) -> Daphne:
        """Start on a free port; try another port if the chosen one was taken meanwhile."""
        for _ in range(attempts):
            self.port = free_port()
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            self.proc = subprocess.Popen(
                [str(DAPHNE), "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
                cwd=REPO,
                env=self.env,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            if self._wait_ready():
                return self
            self.stop()
        raise AssertionError(f"daphne did not start after {attempts} attempts:\n{self.tail()}")

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # e.g. "address already in use": the caller tries again
            try:
                with urllib.request.urlopen(f"{self.url}/accounts/login/", timeout=2) as rsp:
                    if rsp.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it if it lingers (daphne waits for open
        websockets to close before it exits)."""
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 2), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log is not None and not self._log.closed:
            self._log.close()

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_since(0).splitlines()[-lines:])
