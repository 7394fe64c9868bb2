"""Smoke run of the benchmark harness (bench/): it runs and produces its tables.

The in-process checkpoint part, Durable and the INSERT + COMMIT floor, on SQLite, with
``--quick`` sizes; the throughput part (1, 2 and 4 worker processes, Durable and DBOS's
queue) at ``--quick`` sizes where the suite runs on PostgreSQL + Redis; and the issue-13
targets table rendered from a fixed results document. Timings are never asserted (they
depend on the machine), only that every row is produced. The peers (DBOS, LangGraph) are
left out of the checkpoint run; when their packages are missing, a full run reports them
as skipped rather than failing, which is checked too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(120)


def _run_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST_")
        and k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--only",
            "checkpoint",
            "--dbs",
            "sqlite",
            "--reps",
            "1",
            "--var-dir",
            str(tmp_path / "var"),
            "--out",
            str(tmp_path / "out"),
            "--name",
            "smoke",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )


def test_quick_checkpoint_run_produces_the_table(tmp_path: Path) -> None:
    proc = _run_bench(tmp_path, "--systems", "durable,floor")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    md = (tmp_path / "out" / "smoke.md").read_text()
    data = json.loads((tmp_path / "out" / "smoke.json").read_text())
    assert "## 1. Checkpoint overhead" in proc.stdout  # the table is printed too

    # the table and its rows
    assert "## 1. Checkpoint overhead" in md
    assert "| System | PostgreSQL ms/step |" in md
    assert "| Durable |" in md
    assert "| Floor (INSERT + COMMIT) |" in md
    assert "| `ctx.step` no-op | sqlite |" in md
    assert "unsafe_write tool" in md
    assert "## Targets (issue 13)" in md
    # the checkpoint targets are PostgreSQL figures: on SQLite they are rows that say so
    assert "| checkpointed no-op step ≤ 1.5× the INSERT + COMMIT floor (PostgreSQL) | " in md
    assert "| marginal commits per read-only step = 1.00" in md
    assert "not measured" in md
    # the batched chain: measured where durable has `durability=`, else "not available"
    batched = data["parts"]["checkpoint"]["batched"]
    assert 'with `durability="batched"` ≥ 5× faster than `sync` |' in md
    if batched["available"]:
        assert '| `ctx.step(..., durability="batched")` no-op, 1 x 50 | sqlite |' in md
    else:
        assert "`durability` keyword" in batched["reason"]
        assert "| not available | n/a |" in md

    rows = data["parts"]["checkpoint"]["rows"]
    got = {(r["system"], r["db"], r["scenario"]) for r in rows}
    chain = {("durable", "sqlite", "chain_sync"), ("durable", "sqlite", "chain_batched")}
    assert chain <= got if batched["available"] else not (chain & got)
    assert {
        ("durable", "sqlite", "seq"),
        ("durable", "sqlite", "single"),
        ("durable", "sqlite", "read_tool"),
        ("durable", "sqlite", "write_tool"),
        ("floor", "sqlite", "seq"),
        ("floor", "sqlite", "single"),
    } <= got
    for r in rows:
        assert r["per_step_ms"]["n"] == 1
        assert r["per_step_ms"]["median"] > 0
    assert not data["errors"]
    # a profile of the checkpoint path is part of the results where pyinstrument (the
    # bench extra) is installed; `make test` installs only the test extra
    if importlib.util.find_spec("pyinstrument") is not None:
        assert data["parts"]["checkpoint"]["profile"]["top_self"]
    else:
        assert data["parts"]["checkpoint"]["profile"] is None


def test_missing_peer_is_reported_as_skipped(tmp_path: Path, monkeypatch) -> None:
    from bench import checkpoint

    assert checkpoint.missing_packages("floor", "sqlite") is None
    monkeypatch.setitem(checkpoint.PEER_PACKAGES, "dbos", ("no_such_package_for_bench",))
    assert "not installed" in checkpoint.missing_packages("dbos", "sqlite")


# ------------------------------------------------------------------ the targets table


def _row(system: str, scenario: str, ms: float, **extra: object) -> dict[str, object]:
    s = {"median": ms, "min": ms, "max": ms, "n": 1}
    return {
        "system": system,
        "db": "postgresql",
        "scenario": scenario,
        "label": scenario,
        "per_step_ms": s,
        "per_run_ms": s,
        **extra,
    }


def _results(batched_available: bool = True) -> dict[str, object]:
    """A results document as the parts write it, with round numbers."""
    scen = [
        {"key": k, "label": k, "runs": 1, "steps": n}
        for k, n in (("seq", 200), ("single", 1), ("read_tool", 200), ("write_tool", 200))
    ] + [{"key": k, "label": k, "runs": 1, "steps": 200} for k in ("chain_sync", "chain_batched")]
    rows = [
        _row("floor", "seq", 2.0),
        _row("durable", "seq", 4.0, commits_per_step=2.0, commits_per_run=400.0),
        _row("durable", "single", 20.0, commits_per_step=4.0, commits_per_run=4.0),
        _row("langgraph", "single", 18.0),
        _row("durable", "read_tool", 4.0, commits_per_step=1.01, commits_marginal=1.004),
        _row("durable", "write_tool", 6.0, commits_per_step=2.1, commits_marginal=2.01),
    ]
    if batched_available:
        rows += [_row("durable", "chain_sync", 4.0), _row("durable", "chain_batched", 0.5)]
    page = {"available": True, "ms": {"p50": 20.0, "p95": 40.0}}
    batch = {"runs": 10, "steps": 200, "seconds": 2.0, "failed": 0}
    throughput = {
        "steps_per_run": 20,
        "workers_1": {
            **batch,
            "steps_per_second": 100.0,
            "rss_ready_mb": [110.0],
            "rss_after_mb": [120.0],
        },
        "workers_2": {**batch, "steps_per_second": 150.0},
        "workers_4": {**batch, "steps_per_second": 180.0},
        "dbos": {
            "settings": {"polling_interval_sec": 0.01},
            "workers_1": {**batch, "steps_per_second": 50.0},
            "workers_2": {**batch, "steps_per_second": 100.0},
            "workers_4": {**batch, "steps_per_second": 200.0},
        },
    }
    return {
        "date": "2026-12-01T00:00:00+00:00",
        "quick": True,
        "machine": {},
        "parts": {
            "checkpoint": {
                "scenarios": scen,
                "rows": rows,
                "reps": 1,
                "batched": {"available": True}
                if batched_available
                else {"available": False, "reason": "no `durability` keyword"},
            },
            "dispatch": {"redis/postgresql": {"start_to_finished_ms": {"p50": 12.0}}},
            "approval": {"decision_to_next_step_ms": {"p50": 30.0}},
            "dashboard": {
                "seed": {"runs": 1, "steps": 1, "events": 1, "pending_approvals": 0},
                "repeats": 1,
                "seed_reused": True,
                "pages": [
                    {**page, "page": "runs list", "path": "/", "queries": 3, "bytes": 1},
                    {
                        **page,
                        "page": "search",
                        "path": "/?q=x",
                        "queries": 3,
                        "bytes": 1,
                        "ms": {"p50": 90.0, "p95": 240.0},
                    },
                ],
            },
            "throughput": throughput,
            "recovery": {"kill_to_next_step_s": {"p50": 2.0}},
        },
        "errors": {},
        "requested_parts": ["checkpoint", "throughput", "memory"],
    }


def test_targets_table_has_a_row_per_issue_13_target() -> None:
    from bench.report import render
    from bench.targets import targets

    rows = {r["target"]: r for r in targets(_results())}
    met = {name.split(" (")[0].split(",")[0]: r["met"] for name, r in rows.items()}
    assert met == {
        "checkpointed no-op step ≤ 1.5× the INSERT + COMMIT floor": False,  # 2.0×
        "marginal commits per read-only step = 1.00": True,  # 1.004 shows as 1.00
        "`unsafe_write` tool step ≤ 2 round trips": False,  # 2.01
        "`unsafe_write` tool step ≤ 2.5× the floor": False,  # 3.0×
        "one-step run": False,  # 20 ms vs LangGraph's 18 ms
        'chain of read-only steps with `durability="batched"` ≥ 5× faster than `sync`': True,
        "one-step run p50 ≤ 15 ms on Redis": True,
        "approval → next step p50 ≤ 100 ms": True,
        "dashboard p95 ≤ 100 ms on every page measured": False,
        "throughput": "reported",
        "recovery p50 ≤ 3 s": True,
        "worker RSS ≤ 150 MB after 200 steps": True,
    }
    assert len(rows) == 13  # the two throughput rows: Durable and DBOS
    dash = next(r for n, r in rows.items() if n.startswith("dashboard"))
    assert "1 of 2 pages over: search 240 ms" in dash["gap"]
    tp = [r for n, r in rows.items() if n.startswith("throughput")]
    assert tp[0]["measured"] == "100 / 150 / 180 steps/s"
    assert "scaling 2w/1w 1.5×, 4w/1w 1.8×" in tp[0]["gap"]
    assert "scaling 2w/1w 2.0×, 4w/1w 4.0×" in tp[1]["gap"]
    assert "Durable ÷ DBOS: 1w 2.0×, 2w 1.5×, 4w 0.9×" in tp[1]["gap"]

    res = _results()
    md = render({**res, "parts": {"throughput": res["parts"]["throughput"]}})
    assert "## Targets (issue 13)" in md and "issue 6)" not in md
    assert "| processes | Durable steps/s | × 1 |" in md
    assert "| 4 | 180 | 1.80× | 10 | 2.00 | 200 | 4.00× | 10 | 2.00 | 0.9× |" in md


def test_batched_target_says_not_available_without_the_keyword() -> None:
    from bench.targets import targets

    row = next(r for r in targets(_results(False)) if "batched" in r["target"])
    assert (row["measured"], row["met"], row["gap"]) == (
        "not available",
        None,
        "no `durability` keyword",
    )


# ----------------------------------------------------------------------- throughput


def _pg_redis() -> tuple[str, str] | None:
    db, broker = os.environ.get("DATABASE_URL", ""), os.environ.get("CELERY_BROKER_URL", "")
    if db.startswith(("postgres://", "postgresql://")) and broker.startswith("redis://"):
        return db, broker
    return None


@pytest.mark.processes
@pytest.mark.backend
@pytest.mark.timeout(300)
@pytest.mark.skipif(_pg_redis() is None, reason="needs DATABASE_URL (PostgreSQL) and Redis")
def test_quick_throughput_run_has_1_2_and_4_worker_rows(tmp_path: Path) -> None:
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    db_url, broker = _pg_redis() or ("", "")
    parts = urlsplit(db_url.replace("postgres://", "postgresql://", 1))
    server = urlunsplit(parts._replace(path="/postgres"))
    prefix = f"test_{parts.path.lstrip('/')}_bench_"  # this suite's own databases
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--only",
            "throughput",
            "--pg",
            server,
            "--redis",
            broker,
            "--db-prefix",
            prefix,
            "--var-dir",
            str(tmp_path / "var"),
            "--out",
            str(tmp_path / "out"),
            "--name",
            "smoke",
        ],
        cwd=REPO,
        env={
            k: v
            for k, v in os.environ.items()
            if not k.startswith("PYTEST_")
            and k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")
        },
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        md = (tmp_path / "out" / "smoke.md").read_text()
        tp = json.loads((tmp_path / "out" / "smoke.json").read_text())["parts"]["throughput"]
        for n in (1, 2, 4):
            r = tp[f"workers_{n}"]
            assert (r["runs"], r["steps"], r["failed"]) == (16, 320, 0)
            assert len(r["rss_after_mb"]) == n
        assert "| processes | Durable steps/s |" in md
        assert "| throughput, Durable workers 1 / 2 / 4 (PostgreSQL + Redis) |" in md
        assert "| throughput, DBOS queue executors 1 / 2 / 4 (same server) |" in md
        if importlib.util.find_spec("dbos") is not None:
            for n in (1, 2, 4):
                r = tp["dbos"][f"workers_{n}"]
                assert (r["runs"], r["failed"], len(r["rss_after_mb"])) == (16, 0, n)
            assert "DBOS not measured" not in md
        else:
            assert "not installed" in tp["dbos"]["skipped"]
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            for name in ("proc", "tp_dbos"):
                conn.execute(f'DROP DATABASE IF EXISTS "{prefix}{name}" WITH (FORCE)')


def test_parallel_bench_row_is_produced(tmp_path):
    """bench/parallel.py: a parallel group against sequential steps, on a fresh SQLite."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST_")
        and k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")
    }
    env["DURABLE_VAR_DIR"] = str(tmp_path / "var")
    done = subprocess.run(
        [sys.executable, "-m", "bench.parallel", "--width", "3", "--sleep-ms", "1", "--reps", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| parallel |" in done.stdout and "| sequential |" in done.stdout
    assert "| ratio sequential / parallel |" in done.stdout


# ------------------------------------------------------------------- the replay check part


def test_replay_part_runs_on_its_own_sqlite_and_checks_every_seeded_run(tmp_path: Path) -> None:
    """``bench/replay_check.py`` seeds runs parked on an approval and times the replay
    check on them, in process and as ``manage.py durable replay-check``; it refuses to
    report a figure unless every seeded run replays."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST_") and k not in ("DATABASE_URL", "CELERY_BROKER_URL")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DURABLE_VAR_DIR=str(tmp_path / "var"),
        DURABLE_WORKFLOW_MODULES="bench.workflows",
        DURABLE_DISPATCH="manual",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "bench.replay_check", "--runs", "40", "--steps", "5"]
        + ["--reps", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@BENCH "))
    part = json.loads(line.removeprefix("@@BENCH "))
    assert (part["database"], part["runs"], part["steps_per_run"]) == ("sqlite", 40, 5)
    assert part["runs_per_minute"] > 0 and part["command_runs_per_minute"] > 0


def test_replay_part_renders_its_section_and_its_target_row() -> None:
    from bench.report import replay_section
    from bench.targets import targets

    part = {
        "database": "postgresql",
        "runs": 300,
        "steps_per_run": 20,
        "seed_seconds": 1.0,
        "check_seconds": {"median": 0.3, "min": 0.25, "max": 0.4, "n": 1},
        "runs_per_minute": 60000,
        "command_seconds": 1.5,
        "command_runs_per_minute": 12000,
    }
    (row,) = targets({"parts": {"replay": part}})
    assert row["target"].startswith("replay check ≥ 1,000 open runs a minute")
    assert (row["measured"], row["met"]) == ("12,000 runs/min", True)
    slow = targets({"parts": {"replay": {**part, "command_runs_per_minute": 500}}})[0]
    assert slow["met"] is False and "2.00× short" in slow["gap"]
    text = "\n".join(replay_section(part))
    assert "| postgresql | " in text and "| 60,000 | 1.50 | 12,000 |" in text
    assert replay_section({"skipped": "no server"})[-1] == "Skipped: no server"


# ------------------------------------------------------------------------ the stream part


def test_stream_part_measures_the_first_token_both_ways_and_the_storage(tmp_path: Path) -> None:
    """``bench/stream.py`` times the first token of a streamed call made directly and
    through a Durable run read with ``durable.stream``, and what the stream stores."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST_") and k not in ("DATABASE_URL", "CELERY_BROKER_URL")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DURABLE_VAR_DIR=str(tmp_path / "var"),
        DURABLE_WORKFLOW_MODULES="bench.workflows",
        DURABLE_DISPATCH="manual",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "bench.stream", "--calls", "2", "--words", "20"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@BENCH "))
    part = json.loads(line.removeprefix("@@BENCH "))
    assert part["database"] == "sqlite" and part["direct"]["first_token_s"]["n"] == 2
    assert [r["poll_s"] for r in part["durable"]] == [0.25, 0.05]
    for row in part["durable"]:  # through a run, the first token comes after the start
        assert 0 < row["first_token_s"]["min"] <= row["whole_s"]["min"]
    storage = part["storage"]
    assert storage["calls"] == 4 and storage["rows_per_call"] >= 3  # started, tokens, ended
    assert storage["bytes_per_call"] > 0 and storage["record_bytes_per_call"] > 0

    from bench.stream import section

    text = "\n".join(section(part))
    assert "| the model directly (openai client) | – |" in text
    assert text.count("| through Durable") == 2 and "stream rows" in text


def test_startup_part_renders_its_section_and_its_two_target_rows() -> None:
    from bench.startup import section
    from bench.targets import targets

    def s(median: float) -> dict[str, float]:
        return {"median": median, "min": median, "max": median, "n": 3}

    part = {
        "reps": 3,
        "cli_runs_s": s(0.8),
        "cli_workflows_s": s(5.0),
        "worker_ready_s": s(6.0),
        "worker_named_modules_ready_s": s(1.9),
    }
    cli, worker = targets({"parts": {"startup": part}})
    assert cli["target"].startswith("a CLI command starts ≤ 1 s") and cli["met"] is True
    assert worker["target"].startswith("a worker is ready ≤ 2 s") and worker["met"] is False
    assert "naming its modules: 1.9" in worker["gap"]
    text = "\n".join(section(part))
    assert "| `manage.py durable runs --limit 1` (reads runs) | 0.8" in text
    assert text.count("| worker ready") == 2


def test_growth_part_renders_its_rows_and_its_growth_targets() -> None:
    from bench.growth import section
    from bench.targets import targets

    def ms(p50: float, p95: float) -> dict[str, float]:
        return {"p50": p50, "p95": p95, "p99": p95, "min": p50, "max": p95, "n": 15}

    def size(runs: int, factor: float) -> dict[str, object]:
        return {
            "runs": runs,
            "steps": runs * 20,
            "step_ms": ms(0.9 * factor, 1.0 * factor),
            "claim_ms": ms(0.5 * factor, 0.6 * factor),
            "worst_page": {"page": "approvals inbox", "ms": ms(30 * factor, 40 * factor)},
            "api": [
                {"endpoint": "API runs list (50)", "ms": ms(10 * factor, 20 * factor)},
                {"endpoint": "API run detail (500 steps)", "ms": ms(25 * factor, 30 * factor)},
            ],
            "tables": [{"table": "durable_run", "rows": runs, "bytes": runs * 900, "index": 0}],
        }

    part = {"sizes": [size(10_000, 1.0), size(1_000_000, 3.0)]}
    rows = targets({"parts": {"growth": part}})
    grows = [r for r in rows if "grows ≤ 2×" in r["target"]]
    assert len(grows) == 5 and all(r["met"] is False and "1.50× over" in r["gap"] for r in grows)
    assert grows[0]["target"] == "a step (p50) grows ≤ 2× from 10,000 → 1,000,000 runs"
    detail = next(r for r in rows if r["target"].startswith("API run detail (500 steps) p95"))
    assert (detail["measured"], detail["met"]) == ("90.0 ms", True)
    flat = targets({"parts": {"growth": {"sizes": [size(10_000, 1.0), size(100_000, 1.2)]}}})
    assert all(r["met"] is True for r in flat)
    text = "\n".join(section(part))
    assert "| 1,000,000 | 20,000,000 | 2.700 / 3.000 | 1.500 / 1.800 |" in text
    assert "approvals inbox (120.0)" in text and "| 1,000,000 | 900 / 0.0 |" in text
    assert section({"skipped": "no server"})[-1] == "Skipped: no server"
