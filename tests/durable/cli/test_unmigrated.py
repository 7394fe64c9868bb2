"""A ``manage.py durable`` command on a database that was never migrated says so, and
what to run, instead of a traceback (the command runs no system checks first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("subcommand", [["runs"], ["cancel", "some-run"], ["show", "some-run"]])
def test_a_command_on_an_unmigrated_database_names_the_fix(tmp_path, subcommand):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["DURABLE_VAR_DIR"] = str(tmp_path)  # a fresh SQLite file: no tables at all
    done = subprocess.run(
        [sys.executable, "manage.py", "durable", *subcommand],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert "has no Durable tables yet" in done.stderr and "manage.py migrate" in done.stderr
