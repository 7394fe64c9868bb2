"""Smoke run of the benchmark harness (bench/): it runs and produces its table.

Only the in-process checkpoint part, Durable and the INSERT + COMMIT floor, on SQLite,
with ``--quick`` sizes; timings are never asserted (they depend on the machine). The
peers (DBOS, LangGraph) are left out here; when their packages are missing, a full run
reports them as skipped rather than failing, which is checked too.
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
    assert "## Targets (issue 6)" in md

    rows = data["parts"]["checkpoint"]["rows"]
    got = {(r["system"], r["db"], r["scenario"]) for r in rows}
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
