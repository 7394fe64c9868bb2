"""Durable's pytest plugin as a project gets it: installed with the package (the
``pytest11`` entry points), its fixtures named ``durable_*``, and a project's own test of
a workflow passing in a pytest run of its own (``pytester``, on SQLite)."""

from __future__ import annotations

import ast
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PLUGIN_MODULES = {"durable": "durable.testing.env", "durable_approvals": "approvals.testing"}


def test_the_plugin_is_installed_with_the_package():
    found = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert {name: found.get(name) for name in PLUGIN_MODULES} == PLUGIN_MODULES


def project(pytester, monkeypatch, tmp_path):
    """A pytester folder that runs as a project with Durable installed would: Django's
    settings named, this checkout on the path (for the settings), SQLite in a folder."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *sys.path]))
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "config.settings")
    monkeypatch.setenv("DURABLE_VAR_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("DURABLE_AUTODISCOVER", "false")  # the examples app's agents: seconds
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    # only the plugins the test needs, in place of every installed one (a faster start)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    plugins = ["pytest_django.plugin", *PLUGIN_MODULES.values()]
    pytester.makeini(
        "[pytest]\naddopts = -p no:cacheprovider --nomigrations "
        + " ".join(f"-p {p}" for p in plugins)
        + "\n"
    )
    return pytester


def fixtures_defined_in(path: Path) -> set[str]:
    """The names of the functions decorated with ``pytest.fixture`` in ``path``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and any(
            "fixture" in ast.unparse(d) for d in node.decorator_list
        ):
            names.add(node.name)
    return names


def test_its_fixtures_are_named_durable_and_nothing_in_this_suite_hides_them(request):
    """The plugin loads in this suite too: a fixture of the same name in a conftest
    would hide it from the tests below it, so the project's own are never ``durable_*``."""
    manager = request.config.pluginmanager
    defined: set[str] = set()
    for name, module in PLUGIN_MODULES.items():
        # by its entry point's name, or by its module's where make test names the
        # plugins (PYTEST_PLUGINS, autoloading off: the Makefile says why)
        plugin = manager.get_plugin(name) or manager.get_plugin(module)
        assert plugin is not None and plugin.__name__ == module
        defined |= fixtures_defined_in(Path(plugin.__file__))
    assert defined == {"durable_env", "durable_llm", "durable_approvals"}
    clashing = {
        str(path.relative_to(ROOT)): sorted(names)
        for path in sorted((ROOT / "tests").rglob("conftest.py"))
        if (names := {n for n in fixtures_defined_in(path) if n.startswith("durable_")})
    }
    assert clashing == {}


USER_TEST = """
from datetime import timedelta

import durable


@durable.tool(name="user.mail", safety="idempotent_write")
def mail(to, *, idempotency_key):
    raise AssertionError("stubbed in the test")


@durable.workflow(name="user.reminder", version="1")
def reminder(ctx, data):
    ctx.sleep(timedelta(days=3))
    answer = ctx.llm([{"role": "user", "content": "write the reminder"}])
    return ctx.call_tool("user.mail", {"to": data["to"], "body": answer["content"]})


def test_the_reminder_goes_out_three_days_later(durable_env, durable_llm):
    durable_env.stub_tool("user.mail", lambda to, body, *, idempotency_key: {"sent": to})
    durable_llm.reply("Your trial ends today.")
    run = durable_env.run(durable_env.start("user.reminder", {"to": "ann@example.com"}))
    assert run.status == "waiting"

    durable_env.advance(timedelta(days=3))

    run.refresh_from_db()
    assert run.output_value() == {"sent": "ann@example.com"}
    [call] = durable_env.tool_calls("user.mail")
    assert call.params == {"to": "ann@example.com", "body": "Your trial ends today."}
"""


def test_a_projects_own_workflow_test_passes_with_the_fixtures(pytester, monkeypatch, tmp_path):
    """The workflow lives in the test module: its mail tool has no ``body`` parameter, so
    the stub's signature must follow the tool's (a mismatch fails the tool call)."""
    runner = project(pytester, monkeypatch, tmp_path)
    runner.makepyfile(
        test_reminder=USER_TEST.replace(
            "to, *, idempotency_key):", "to, body, *, idempotency_key):", 1
        )
    )
    result = runner.runpytest_subprocess("-q")
    result.assert_outcomes(passed=1)
