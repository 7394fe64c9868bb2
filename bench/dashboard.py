"""Part 6: the dashboard at scale.

``python -m bench.dashboard --runs N --steps M`` (environment: ``DATABASE_URL`` of a
PostgreSQL database of its own) migrates, seeds N runs and M steps with COPY (unless the
database already holds a seed of that size), then requests each dashboard page through
Django's test client as a superuser: p50 and p95 server time, and the query count.
Pages that the URLconf does not have are reported as not available.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import timedelta
from typing import Any

from .common import emit, latency_summary, setup_django_on_postgresql

WORKFLOWS = [
    f"agent.{name}"
    for name in (
        "support",
        "refunds",
        "research",
        "triage",
        "billing",
        "outreach",
        "summarize",
        "onboarding",
    )
]
SEED_MARK_TABLE = "bench_seed_info"


# ------------------------------------------------------------------------------ seeding


def _text(value: Any) -> str:
    """A value in COPY text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, (dict, list)):
        value = json.dumps(value)
    elif hasattr(value, "isoformat"):
        value = value.isoformat()
    text = str(value)
    if any(c in text for c in "\\\t\n\r"):
        text = (
            text.replace("\\", "\\\\")
            .replace("\t", "\\t")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
    return text


class Copier:
    """COPY rows into a model's table: the given fields per row, defaults for the rest."""

    def __init__(self, cursor: Any, model: Any, fields: list[str]) -> None:
        from django.utils import timezone

        self.cursor = cursor
        self.table = model._meta.db_table
        self.fields = fields
        concrete = [f for f in model._meta.concrete_fields]
        by_attname = {f.attname: f for f in concrete}
        unknown = [f for f in fields if f not in by_attname]
        if unknown:
            raise RuntimeError(f"{self.table}: no columns {unknown}")
        self.rest = [f for f in concrete if f.attname not in fields and not f.primary_key]
        now = timezone.now()
        defaults = []
        for f in self.rest:
            default = f.get_default() if f.has_default() else None
            if default is None and not f.null and not f.has_default():
                default = ""
            if default is timezone.now or (callable(default) and not isinstance(default, type)):
                default = now
            defaults.append(_text(default))
        self.suffix = ("\t" + "\t".join(defaults)) if defaults else ""
        columns = [by_attname[f].column for f in fields] + [f.column for f in self.rest]
        self.sql = (
            f'COPY "{self.table}" ({", ".join(chr(34) + c + chr(34) for c in columns)}) FROM STDIN'
        )

    def copy(self, rows: Any, chunk: int = 20_000) -> int:
        count = 0
        with self.cursor.copy(self.sql) as copy:
            buf: list[str] = []
            for row in rows:
                buf.append("\t".join(row) + self.suffix + "\n")
                if len(buf) >= chunk:
                    copy.write("".join(buf))
                    count += len(buf)
                    buf = []
            if buf:
                copy.write("".join(buf))
                count += len(buf)
        return count


def _seed_key(runs: int, steps: int) -> str:
    from django.db.migrations.recorder import MigrationRecorder

    applied = MigrationRecorder.Migration.objects.order_by("app", "name").values_list("app", "name")
    return json.dumps(
        {"runs": runs, "steps": steps, "version": 3, "migrations": [f"{a}.{n}" for a, n in applied]}
    )


def seeded(runs: int, steps: int) -> dict[str, Any] | None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {SEED_MARK_TABLE} (key text, info text)")
        cur.execute(f"SELECT info FROM {SEED_MARK_TABLE} WHERE key = %s", [_seed_key(runs, steps)])
        row = cur.fetchone()
    return json.loads(row[0]) if row else None


def seed(runs: int, steps: int) -> dict[str, Any]:
    """Bulk-load ``runs`` runs and ``steps`` steps (one run of 500 steps, pending approvals)."""
    from django.db import connection, transaction
    from django.utils import timezone

    from approvals.models import ApprovalRequest
    from durable.models import Run, Step, TraceEvent, Wait

    t0 = time.perf_counter()
    rng = random.Random(6)
    now = timezone.now()
    big_steps = min(500, steps)
    per_run = max((steps - big_steps) // max(runs - 1, 1), 0)
    extra = (steps - big_steps) - per_run * (runs - 1)
    big_id = "bench-run-500-steps"
    run_ids = [big_id] + [f"bench-{i:07d}" for i in range(1, runs)]
    statuses = (
        ["succeeded"] * 900
        + ["failed"] * 40
        + ["waiting"] * 20
        + ["running"] * 20
        + ["retrying"] * 10
        + ["cancelled"] * 10
    )
    plan = []  # (run_id, status, created_at, n_steps, workflow)
    for i, rid in enumerate(run_ids):
        status = "succeeded" if i == 0 else statuses[rng.randrange(len(statuses))]
        created = now - timedelta(seconds=i * 30 * 86400 / runs + rng.random())
        n = big_steps if i == 0 else per_run + (1 if i <= extra else 0)
        plan.append((rid, status, created, n, WORKFLOWS[i % len(WORKFLOWS)]))

    with connection.cursor() as cur:
        cur.execute("SET session_replication_role = replica")  # skip FK triggers while loading
        for model in (ApprovalRequest, Wait, TraceEvent, Step, Run):
            cur.execute(f'TRUNCATE "{model._meta.db_table}" CASCADE')
        cur.execute(f"DELETE FROM {SEED_MARK_TABLE}")
        later = timedelta(seconds=2)

        run_fields = [
            "id",
            "workflow_name",
            "workflow_version",
            "status",
            "input",
            "input_hash",
            "output",
            "error",
            "error_type",
            "created_at",
            "started_at",
            "finished_at",
            "updated_at",
            "lease_owner",
            "lease_token",
            "lease_expires_at",
            "wake_at",
            "claims",
            "cursor_position",
            "steps_executed",
            "max_steps",
            "tags",
        ]

        def run_rows():
            for rid, status, created, n, wf in plan:
                terminal = status in ("succeeded", "failed", "cancelled")
                failed = status == "failed"
                running = status == "running"
                yield (
                    rid,
                    wf,
                    "1" if rng.random() < 0.7 else "2",
                    status,
                    _text(
                        json.dumps(
                            {
                                "ticket": rid,
                                "message": "Customer asks about the refund of order " + rid[-5:],
                            }
                        )
                    ),
                    "0" * 64,
                    _text(json.dumps({"ok": True, "steps": n})) if status == "succeeded" else "\\N",
                    _text(
                        {
                            "type": "PermanentError",
                            "message": "HTTP 403 from the API",
                            "classification": "permanent",
                            "step_id": "call#3",
                        }
                    )
                    if failed
                    else "\\N",
                    "PermanentError" if failed else "",
                    _text(created),
                    _text(created + timedelta(milliseconds=5)),
                    _text(created + later + timedelta(seconds=n)) if terminal else "\\N",
                    _text(created + later + timedelta(seconds=n)),
                    "host:1:1" if running else "",
                    "f" * 32 if running else "",
                    _text(now + timedelta(hours=1)) if running else "\\N",
                    _text(now + timedelta(hours=1)) if status == "retrying" else "\\N",
                    "1",
                    str(n),
                    str(n),
                    "10000",
                    _text(["bench", wf.split(".")[1]]),
                )

        n_runs = Copier(cur, Run, run_fields).copy(run_rows())

        step_fields = [
            "run_id",
            "step_id",
            "position",
            "kind",
            "tool_name",
            "status",
            "input",
            "output",
            "error",
            "attempts",
            "started_at",
            "finished_at",
        ]
        step_in = _text(json.dumps({"kwargs": {"query": "order status"}}))
        step_out = _text(json.dumps({"answer": "The order shipped on Monday.", "tokens": 412}))

        def step_rows():
            for rid, status, created, n, _wf in plan:
                base = created + timedelta(milliseconds=10)
                for pos in range(n):
                    last = pos == n - 1
                    st = "succeeded"
                    if last and status == "failed":
                        st = "failed"
                    elif last and status == "retrying":
                        st = "running"
                    kind = "tool" if pos % 3 == 2 else ("llm" if pos % 3 == 1 else "step")
                    t = base + timedelta(seconds=pos)
                    yield (
                        rid,
                        f"call#{pos + 1}" if pos else "call",
                        str(pos),
                        kind,
                        "search" if kind == "tool" else "",
                        st,
                        step_in,
                        step_out if st == "succeeded" else "\\N",
                        _text(
                            {
                                "type": "PermanentError",
                                "message": "HTTP 403",
                                "classification": "permanent",
                                "step_id": "x",
                            }
                        )
                        if st == "failed"
                        else "\\N",
                        "2" if pos % 50 == 7 else "1",
                        _text(t),
                        _text(t + timedelta(milliseconds=800)) if st != "running" else "\\N",
                    )

        n_steps = Copier(cur, Step, step_fields).copy(step_rows())

        event_fields = ["run_id", "kind", "step_id", "message", "actor", "created_at", "data"]

        def event_rows():
            for rid, status, created, n, _wf in plan:
                yield (rid, "created", "", "started", "", _text(created), "\\N")
                yield (
                    rid,
                    "claimed",
                    "",
                    "",
                    "host:1:1",
                    _text(created + later),
                    _text({"claim": 1}),
                )
                if rid == big_id:
                    for pos in range(n):
                        yield (
                            rid,
                            "step_executed",
                            f"call#{pos + 1}" if pos else "call",
                            "",
                            "host:1:1",
                            _text(created + later + timedelta(seconds=pos)),
                            _text({"attempt": 1, "kind": "step", "seconds": 0.8}),
                        )
                if status in ("succeeded", "failed", "cancelled"):
                    yield (
                        rid,
                        "completed" if status == "succeeded" else status,
                        "",
                        f"run {status}",
                        "host:1:1",
                        _text(created + later + timedelta(seconds=n)),
                        "\\N",
                    )

        n_events = Copier(cur, TraceEvent, event_fields).copy(event_rows())

        waiting = [(rid, created, n) for rid, status, created, n, _ in plan if status == "waiting"]
        wait_fields = [
            "run_id",
            "wait_id",
            "position",
            "kind",
            "key",
            "status",
            "title",
            "payload",
            "created_at",
        ]
        Copier(cur, Wait, wait_fields).copy(
            (
                rid,
                "approval:refund",
                str(n),
                "approval",
                "refund",
                "pending",
                "Approve the refund",
                _text(json.dumps({"amount": 42})),
                _text(created + later + timedelta(seconds=n)),
            )
            for rid, created, n in waiting
        )
        cur.execute(f'SELECT id, run_id, created_at FROM "{Wait._meta.db_table}"')
        waits = cur.fetchall()
        req_fields = [
            "wait_id",
            "run_id",
            "key",
            "title",
            "payload",
            "tool_name",
            "safety",
            "status",
            "created_at",
        ]
        Copier(cur, ApprovalRequest, req_fields).copy(
            (
                str(wid),
                rid,
                "refund",
                "Approve the refund",
                _text(json.dumps({"amount": 42})),
                "refund",
                "unsafe_write",
                "pending",
                _text(created),
            )
            for wid, rid, created in waits
        )
        cur.execute("SET session_replication_role = DEFAULT")
        for model in (Run, Step, TraceEvent, Wait, ApprovalRequest):
            cur.execute(f'ANALYZE "{model._meta.db_table}"')
        info = {
            "runs": n_runs,
            "steps": n_steps,
            "events": n_events,
            "pending_approvals": len(waits),
            "big_run": big_id,
            "seed_seconds": time.perf_counter() - t0,
        }
        with transaction.atomic():
            cur.execute(
                f"INSERT INTO {SEED_MARK_TABLE} (key, info) VALUES (%s, %s)",
                [_seed_key(runs, steps), json.dumps(info)],
            )
    return info


def seed_or_reuse(runs: int, steps: int, *, reseed: bool = False) -> tuple[dict[str, Any], bool]:
    """``(the seed's info, reused)``: the kept seed of this size when it matches the
    migrations (and ``reseed`` is false), else a new one (:func:`seed`)."""
    info = None if reseed else seeded(runs, steps)
    if info is not None:
        return info, True
    return seed(runs, steps), False


# ------------------------------------------------------------------------------- timing


def pages(big_run: str) -> list[tuple[str, str, str]]:
    """(label, url name, path) of the pages to time."""
    return [
        ("runs list", "dashboard:runs", "/"),
        ("runs list, filtered by status (failed)", "dashboard:runs", "/?status=failed"),
        ("runs list, filtered by workflow", "dashboard:runs", f"/?workflow={WORKFLOWS[2]}"),
        ("runs list, waiting for approval", "dashboard:runs", "/?status=approval"),
        ("runs list, search text", "dashboard:runs", "/?q=order+01234"),
        ("runs list, longest first", "dashboard:runs", "/?sort=-duration"),
        ("run detail (500 steps)", "dashboard:run", f"/runs/{big_run}/"),
        ("run detail, failed steps only", "dashboard:run", f"/runs/{big_run}/?step_status=failed"),
        (
            "run detail, tool calls, unfolded",
            "dashboard:run",
            f"/runs/{big_run}/?step_kind=tool&repeats=all",
        ),
        ("approvals inbox", "dashboard:approvals", "/approvals/"),
        ("overview, last 24 hours", "dashboard:overview", "/overview/"),
        ("overview, last 30 days", "dashboard:overview", "/overview/?window=30d"),
        ("needs attention", "dashboard:attention", "/attention/"),
    ]


def time_pages(big_run: str, repeats: int) -> list[dict[str, Any]]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import Resolver404, resolve

    User = get_user_model()
    user = User.objects.filter(username="bench-admin").first()
    if user is None:
        user = User.objects.create_superuser("bench-admin", "bench@example.com", None)
    client = Client()
    client.force_login(user)
    results = []
    for label, _name, path in pages(big_run):
        row: dict[str, Any] = {"page": label, "path": path}
        try:
            resolve(path.split("?")[0])
        except Resolver404:
            row["available"] = False
            row["note"] = "not available (no such URL yet)"
            results.append(row)
            continue
        try:
            for _ in range(2):  # warm up (template compilation, caches)
                response = client.get(path)
            if response.status_code != 200:
                row.update(available=False, note=f"HTTP {response.status_code}")
                results.append(row)
                continue
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                client.get(path)
                times.append((time.perf_counter() - t) * 1000)
            with CaptureQueriesContext(connection) as queries:
                response = client.get(path)
            slowest = max(
                queries.captured_queries,
                key=lambda q: float(q["time"]),
                default={"time": "0", "sql": ""},
            )
            row.update(
                available=True,
                ms=latency_summary(times),
                queries=len(queries),
                bytes=len(response.content),
                slowest_query_ms=float(slowest["time"]) * 1000,
                slowest_query=slowest["sql"][:1000],
            )
        except Exception as exc:  # noqa: BLE001 - a broken page is a result, not a crash
            row.update(available=False, note=f"error: {type(exc).__name__}: {exc}"[:300])
        results.append(row)
    return results


def profile_pages(big_run: str, requests: int = 5) -> list[dict[str, Any]]:
    """pyinstrument over a few requests of the main pages: where the server time goes."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import Resolver404, resolve
    from pyinstrument import Profiler

    from .common import frame_tables

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench-admin"))
    out = []
    for label, _name, path in pages(big_run):
        if label not in ("runs list", "run detail (500 steps)", "approvals inbox"):
            continue
        try:
            resolve(path.split("?")[0])
        except Resolver404:
            continue
        client.get(path)
        profiler = Profiler(interval=0.0005)
        profiler.start()
        for _ in range(requests):
            client.get(path)
        profiler.stop()
        summary_ = frame_tables(profiler.last_session.root_frame(), requests, top=12)
        out.append({"page": label, "path": path, **summary_})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard")
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--reseed", action="store_true")
    args = parser.parse_args()
    setup_django_on_postgresql("the dashboard benchmark")
    info, reused = seed_or_reuse(args.runs, args.steps, reseed=args.reseed)
    results = time_pages(info["big_run"], args.repeats)
    try:
        profiles = profile_pages(info["big_run"])
    except ImportError:  # pyinstrument is in the bench extra
        profiles = []
    emit(
        {
            "seed": info,
            "seed_reused": reused,
            "pages": results,
            "repeats": args.repeats,
            "profiles": profiles,
        }
    )


if __name__ == "__main__":
    main()
