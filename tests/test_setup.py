"""The project's front door: `make up`, `make test`, the Procfile, CI, the README, the demo."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

import durable
from durable.models import RunStatus
from durable.testing import drive

ROOT = Path(__file__).resolve().parent.parent


def read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", read("Makefile"), re.MULTILINE))


def test_makefile_has_up_test_lint_clean():
    assert {"up", "test", "lint", "clean"} <= make_targets()
    makefile = read("Makefile")
    assert "-m venv" in makefile
    assert "pip install --compile-bytecode --python $(BIN)/python -c $(CONSTRAINTS)" in makefile
    assert "$(INSTALL) -e '.[test]'" in makefile
    assert "honcho start" in makefile
    assert "pytest" in makefile


def pinned_versions() -> dict[str, str]:
    """constraints.txt's ``name==version`` lines, names normalised as PEP 503 says."""
    pins = {}
    for line in read("constraints.txt").splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==([^\s;]+)", line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return pins


def test_the_installed_versions_are_the_constraints_versions():
    """Every install takes constraints.txt's versions (Makefile's INSTALL), so the suite
    runs on what a fresh machine installs; a dependency added to pyproject.toml without
    `make lock` is named here."""
    from importlib import metadata

    pins = pinned_versions()
    assert pins["django"].startswith("5.2.")
    assert "pyopenssl" in pins and "cryptography" in pins
    installed = {
        re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower(): dist.version
        for dist in metadata.distributions()
    }
    differ = {
        name: (installed[name], version)
        for name, version in pins.items()
        if name in installed and installed[name] != version
    }
    assert not differ, f"installed != constraints.txt (run make install): {differ}"
    requires = metadata.requires("durable") or []
    unpinned = [
        name
        for req in requires
        if (name := re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0]).lower())
        not in pins
    ]
    assert not unpinned, f"in pyproject.toml, not in constraints.txt (run make lock): {unpinned}"


def test_daphne_imports_with_the_installed_tls_stack():
    """daphne imports Twisted's TCP transport, which imports pyOpenSSL; a pyOpenSSL older
    than the installed cryptography fails there (AttributeError on ``lib.GEN_EMAIL``)."""
    import daphne.server  # noqa: F401
    from OpenSSL import SSL  # noqa: F401


def test_procfile_runs_web_worker_and_beat():
    entries = dict(
        line.split(":", 1)
        for line in read("Procfile").splitlines()
        if line.strip() and not line.startswith("#")
    )
    entries = {name.strip(): cmd.strip() for name, cmd in entries.items()}
    assert {"web", "worker", "beat"} <= set(entries)
    assert entries["web"].startswith("daphne ") and "config.asgi:application" in entries["web"]
    assert entries["worker"].startswith("celery -A config worker")
    assert entries["beat"].startswith("celery -A config beat")


def test_ci_runs_make_test_on_both_configurations():
    ci = read(".ci/run")
    assert ci.startswith(("#!/usr/bin/env bash", "#!/bin/bash"))
    assert "set -euo pipefail" in ci
    assert ci.count("make test") >= 2
    assert "DATABASE_URL=postgres://" in ci and "CELERY_BROKER_URL=redis://" in ci
    assert "DURABLE_VAR_DIR" in ci  # the embedded run gets a fresh folder
    assert "pg_isready" in ci and "redis-cli" in ci


def test_make_check_gates_lint_docs_and_types_and_ci_gates_lint_docs_and_checks_types_beside():
    assert {"check", "lint", "format", "typecheck", "docs"} <= make_targets()
    makefile = read("Makefile")
    assert re.search(r"^check:\s*lint docs typecheck test\s*$", makefile, re.MULTILINE)
    assert "ruff format --check" in makefile and "$(BIN)/mypy" in makefile
    assert "mkdocs build --strict" in makefile
    ci = read(".ci/run")
    gates, suites = ci.index("for gate in lint docs"), ci.index("run_suite postgres")
    assert gates < suites  # a lint error stops CI before the long suites
    # the type check runs beside the suites, and its failure fails the run
    assert ci.index("make typecheck >") < suites and "typecheck_rc != 0" in ci


def test_the_tools_are_pinned_to_exact_versions():
    pyproject = read("pyproject.toml")
    for tool in ("ruff", "mypy", "django-stubs"):
        assert re.search(rf'"{tool}==[0-9][\w.]*"', pyproject), tool


def test_readme_quick_start_has_both_commands_and_the_readme_stays_short():
    readme = read("README.md")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make up" in quick and "make test" in quick
    assert "## The SDK in ten lines" in readme and "## Architecture map" in readme
    # what it is, the two commands, the SDK, a picture, links: the rest is in docs/
    assert len(readme.splitlines()) <= 300, "README.md is over 300 lines: move it to docs/"
    for page, heading in (
        ("docs/settings.md", "# Settings"),
        ("docs/production.md", "# Running in production"),
        ("docs/production.md", "## Management commands"),
        ("docs/waits-and-approvals.md", "# Waits and approvals"),
        ("docs/dashboard.md", "# Dashboard"),
        ("docs/sdk.md", "# The SDK"),
    ):
        assert heading in read(page).splitlines(), (page, heading)
        assert page in readme, f"README.md does not link {page}"


def test_the_settings_page_lists_every_environment_variable_of_the_settings():
    names = set(
        re.findall(
            r"""environ(?:\.get)?\(\s*["']([A-Z_]+)["']|"""
            r"""env_(?:bool|list|float)\(\s*["']([A-Z_]+)["']""",
            read("config/settings.py"),
        )
    )
    names = {a or b for a, b in names}
    assert "DATABASE_URL" not in names  # read by dj-database-url
    names |= {"DATABASE_URL"}
    missing = sorted(n for n in names if f"`{n}`" not in read("docs/settings.md"))
    assert not missing, f"docs/settings.md's table misses {missing}"


@pytest.mark.django_db(transaction=True)
def test_hello_example_runs_to_completion():
    run = drive(durable.start("examples.hello", {"name": "  ada   lovelace ", "language": "fr"}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"message": "Bonjour, Ada Lovelace!", "language": "fr"}
    assert list(run.steps.order_by("position").values_list("step_id", flat=True)) == [
        "normalize_name",
        "examples.lookup_greeting",
        "compose",
    ]


@pytest.mark.django_db(transaction=True)
def test_durable_demo_starts_one_run_per_day_and_ensures_admin():
    out = StringIO()
    call_command("durable_demo", stdout=out)
    call_command("durable_demo", stdout=out)  # same day: the same run, not a new one
    run_ids = re.findall(r"Demo run (\S+) ", out.getvalue())
    assert len(run_ids) == 2 and run_ids[0] == run_ids[1]
    assert drive(run_ids[0]).output_value()["message"] == "Hello, World!"
    # and one demo schedule for the Schedules page, declared once
    from durable.models import Schedule

    (schedule,) = Schedule.objects.all()
    assert schedule.name == "demo-hello-hourly" and schedule.cron == "0 * * * *"

    out = StringIO()
    call_command("durable_demo", "--ensure-admin", stdout=out)
    call_command("durable_demo", "--ensure-admin", stdout=out)
    user = get_user_model().objects.get(username="admin")
    assert user.is_superuser and user.check_password("admin")
    assert "log in as admin / admin" in out.getvalue()
