"""The backend_free marker (tests/backends.py) cannot hide a test that reaches a backend.

Each case runs a small probe file in a pytest of its own, with the plugin loaded, and
reads the outcome of every probe test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.harness import REPO

PROBES = """
import pytest

def test_pure():
    assert sum([1, 2]) == 3

def test_touches_the_database_without_asking():
    from django.contrib.auth.models import User
    User.objects.count()

def test_opens_the_broker():
    from config.celery import app
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)

@pytest.mark.skipif(True, reason="only on PostgreSQL")
def test_skips_on_one_configuration():
    pass

def test_skips_inside():
    pytest.skip("needs Redis")

@pytest.mark.backend
def test_marked_backend():
    pass

@pytest.mark.django_db
def test_asks_for_the_database():
    pass

def test_asks_for_a_database_fixture(transactional_db):
    pass
"""


def _pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probes.py").write_text(textwrap.dedent(source))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DURABLE_"))},
        "PYTHONPATH": str(REPO),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DURABLE_AUTODISCOVER": "false",
        "DURABLE_VAR_DIR": str(tmp_path / "var"),
        # the plugins the probes need, named as `make test` names its own: autoloading
        # every installed plugin (and rewriting its modules) cost ~8 s a subprocess
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTEST_PLUGINS": "pytest_django.plugin",
    }
    env.pop("DATABASE_URL", None)
    env.pop("CELERY_BROKER_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.backends", "-p", "no:cacheprovider",
         "-rA", "test_probes.py", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def _outcomes(out: str) -> dict[str, str]:
    """``PASSED test_probes.py::test_pure`` lines of ``-rA`` -> {test: outcome}."""
    found = {}
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR", "SKIPPED") and "::" in rest:
            found[rest.split("::", 1)[1].split(" ", 1)[0]] = word
    return found


def test_a_backend_free_test_that_reaches_a_backend_or_skips_fails(tmp_path):
    proc = _pytest(tmp_path, PROBES, "-k", "not asks_for")
    outcomes = _outcomes(proc.stdout)
    assert outcomes == {
        "test_pure": "PASSED",
        "test_touches_the_database_without_asking": "FAILED",
        "test_opens_the_broker": "FAILED",
        "test_skips_on_one_configuration": "ERROR",  # a skipif acts at setup
        "test_skips_inside": "FAILED",
        "test_marked_backend": "PASSED",
    }, proc.stdout + proc.stderr
    assert "Database access not allowed" in proc.stdout
    assert "BrokerBlocked" in proc.stdout
    assert "is backend_free (it asks for no database) but skipped" in proc.stdout


def test_the_postgresql_suite_keeps_exactly_the_tests_that_may_reach_a_backend(tmp_path):
    proc = _pytest(tmp_path, PROBES, "-m", "not backend_free", "--collect-only", "-q")
    kept = {line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line}
    assert kept == {
        "test_marked_backend",
        "test_asks_for_the_database",
        "test_asks_for_a_database_fixture",
    }, proc.stdout + proc.stderr


def test_the_marker_is_derived_never_written_by_hand(tmp_path):
    hand = "import pytest\n\n@pytest.mark.backend_free\ndef test_hand():\n    pass\n"
    proc = _pytest(tmp_path, hand)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "backend_free is derived from the test's fixtures" in proc.stderr
