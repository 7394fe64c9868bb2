"""Where a suite's minutes go: a table per test folder, printed after pytest's slowest
durations (``--durations=30`` in pyproject's ``addopts``).

Each test's setup, call and teardown are added to its folder (``tests/processes``,
``tests/durable``...): setup holds the fixtures (a worker start, a live server, the
database created once per session), teardown the flush of a transactional test. The
CPU column counts this process, the child processes it reaped meanwhile and the workers
the fork server reaped (a worker's CPU lands in the test that stopped it); the machine
column counts every process of the machine (PostgreSQL and Chromium too, and whatever
runs beside the suite). The head names the configuration, so the two CI suites' tables
can be told apart.
docs/testing.md reads these tables.
"""

from __future__ import annotations

import os
import resource
import time
from collections import defaultdict
from dataclasses import dataclass

import pytest

from tests.harness import READY_SECONDS

PHASES = ("setup", "call", "teardown")


@dataclass
class _Folder:
    tests: int = 0
    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0
    cpu: float = 0.0
    machine: float = 0.0

    @property
    def total(self) -> float:
        return self.setup + self.call + self.teardown


_TICKS = os.sysconf("SC_CLK_TCK")
_folders: dict[str, _Folder] = defaultdict(_Folder)
_cpu_by_test: dict[str, float] = {}
_started = time.monotonic()


def folder_of(nodeid: str) -> str:
    """``tests/durable/test_x.py::test_y[1]`` -> ``tests/durable``; a module at the top
    of ``tests/`` counts as ``tests``."""
    path = nodeid.split("::", 1)[0]
    return path.rsplit("/", 1)[0] if "/" in path else "."


def configuration() -> str:
    """``postgresql + redis`` or ``sqlite + filesystem``: what this suite runs on."""
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    broker = str(settings.CELERY_BROKER_URL).split("://", 1)[0]
    return f"{engine} + {broker}"


def pytest_sessionstart(session: pytest.Session) -> None:
    global _started
    _started = time.monotonic()


def _forked_cpu_seconds() -> float:
    """CPU seconds of the workers that the fork server (tests/harness.py) forked and
    reaped so far: its ``cutime`` and ``cstime`` (``/proc/PID/stat``), 0.0 before it
    starts."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # after the name: state is field 3 of proc(5), cutime 16 and cstime 17
    return (int(fields[13]) + int(fields[14])) / _TICKS


def _cpu_seconds() -> float:
    """CPU seconds of this process, of the children it has reaped (daphne, subprocesses)
    and of the workers the fork server reaped: a test's share is the difference across
    it."""
    total = _forked_cpu_seconds()
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``: user, nice,
    system, irq, softirq, steal), 0.0 where there is no ``/proc``."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICKS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    before, machine_before = _cpu_seconds(), _machine_cpu_seconds()
    yield
    folder = _folders[folder_of(item.nodeid)]
    cpu = _cpu_seconds() - before
    folder.cpu += cpu
    folder.machine += _machine_cpu_seconds() - machine_before
    _cpu_by_test[item.nodeid] = cpu


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when not in PHASES:
        return
    folder = _folders[folder_of(report.nodeid)]
    setattr(folder, report.when, getattr(folder, report.when) + report.duration)
    if report.when == "setup":
        folder.tests += 1


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _folders:
        return
    write = terminalreporter.write_line
    wall = time.monotonic() - _started
    terminalreporter.section(f"time per folder ({configuration()}; wall {wall:.0f} s)")
    write(f"{'folder':<22} {'tests':>6} {'setup s':>9} {'call s':>9} {'teardown s':>11} "
          f"{'total s':>9} {'share':>6} {'cpu s':>8} {'machine s':>10}")  # fmt: skip
    rows = sorted(_folders.items(), key=lambda kv: -kv[1].total)
    whole = sum(f.total for _, f in rows) or 1.0
    for name, f in rows:
        write(
            f"{name:<22} {f.tests:>6} {f.setup:>9.1f} {f.call:>9.1f} {f.teardown:>11.1f} "
            f"{f.total:>9.1f} {f.total / whole:>6.0%} {f.cpu:>8.1f} {f.machine:>10.1f}"
        )
    tests = sum(f.tests for _, f in rows)
    write(
        f"{'all':<22} {tests:>6} {sum(f.setup for _, f in rows):>9.1f} "
        f"{sum(f.call for _, f in rows):>9.1f} {sum(f.teardown for _, f in rows):>11.1f} "
        f"{whole:>9.1f} {'':>6} {sum(f.cpu for _, f in rows):>8.1f} "
        f"{sum(f.machine for _, f in rows):>10.1f}"
    )
    if READY_SECONDS:
        ready = sorted(READY_SECONDS)
        write(
            f"worker processes seen ready: {len(ready)}, {sum(ready):.0f} s from spawn to "
            f"ready in all (median {ready[len(ready) // 2]:.1f} s, slowest {ready[-1]:.1f} s)"
        )
    hungriest = sorted(_cpu_by_test.items(), key=lambda kv: -kv[1])[:15]
    if hungriest:
        write("the 15 tests that took the most CPU (s; with their workers and subprocesses):")
        for nodeid, seconds in hungriest:
            write(f"{seconds:8.1f}  {nodeid}")
