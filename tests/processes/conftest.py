"""Fixtures of the multi-process tests: real Celery workers, SIGKILL, restart.

``proc_env`` switches the test process to Celery dispatch with a 2 s lease, gives the
test a fresh ``CRASH_TEST_DIR`` and purges the broker. ``workers`` starts worker
processes on demand and kills them all before the database is flushed; their logs are
printed at teardown (pytest shows them when the test fails).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import crash_workflows as cw
from tests.harness import (
    LEASE_SECONDS,
    SWEEP_INTERVAL,
    WorkerPool,
    purge_broker,
    restore_broker,
    use_session_broker,
)


@dataclass
class ProcEnv:
    dir: Path

    def effects(self) -> list[dict]:
        return cw.read_jsonl(self.dir / "effects.jsonl")

    def invocations(self) -> list[dict]:
        return cw.read_jsonl(self.dir / "invocations.jsonl")

    def api_requests(self) -> list[dict]:
        return cw.read_jsonl(self.dir / "api_requests.jsonl")

    def crashed(self, point: str) -> bool:
        return any(self.dir.glob("crashed-" + point.replace(":", "_")))


@pytest.fixture(scope="session")
def session_broker(tmp_path_factory):
    """A private filesystem broker folder for this session's test process and workers."""
    previous = use_session_broker(tmp_path_factory.mktemp("var"))
    yield
    restore_broker(previous)


@pytest.fixture
def proc_env(session_broker, settings, tmp_path, monkeypatch) -> ProcEnv:
    """Celery dispatch in this process, a per-test effects folder, an empty broker.

    Not autouse, so it runs after the suite's autouse ``DISPATCH=manual`` fixture.
    """
    settings.DURABLE = {
        **settings.DURABLE,
        "DISPATCH": "celery",
        "LEASE_SECONDS": LEASE_SECONDS,
        "HEARTBEAT_SECONDS": None,
        "SWEEP_INTERVAL_SECONDS": SWEEP_INTERVAL,
        "REDISPATCH_AFTER_SECONDS": 30.0,
    }
    folder = tmp_path / "crash"
    folder.mkdir()
    monkeypatch.setenv("CRASH_TEST_DIR", str(folder))
    monkeypatch.delenv("CRASH_AT", raising=False)
    purge_broker()
    return ProcEnv(folder)


@pytest.fixture
def workers(transactional_db, proc_env, tmp_path):
    """Start real workers with ``workers.start(...)``; all are SIGKILLed at teardown.

    Requests ``transactional_db`` so the workers die before the database is flushed.
    """
    pool = WorkerPool(proc_env.dir, tmp_path / "logs")
    try:
        yield pool
    finally:
        pool.kill_all()
        print(pool.report())
        purge_broker()
