"""Outside trial of ``durable.registry.lazy_module``: cases drawn from public bug reports
about lazy/deferred registration in tools that do the same job (Celery, Temporal, DBOS,
lock-ordering deadlocks around lazy imports)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
import time

import pytest

from durable import registry
from durable.exceptions import DurableConfigurationError, WorkflowNotFound
from tests.durable.worker.test_lazy_modules import lazy  # noqa: F401 - the fixture


def _wf(name: str, version: str = "1", fn: str = "wf") -> str:
    return (
        "import durable\n"
        f"@durable.workflow(name={name!r}, version={version!r})\n"
        f"def {fn}(ctx, data):\n"
        f"    return {version!r}\n"
    )


def test_a_lazy_module_declared_while_a_listing_imports_another_is_listed(lazy):  # noqa: F811
    """DBOS: "Workflow Registration should not be allowed after DBOS.launch has been
    called" (https://github.com/dbos-inc/dbos-transact-java/issues/36) and clearer errors
    for code registered after launch (https://github.com/dbos-inc/dbos-transact-ts/pull/787):
    registration that happens while/after the registry is enumerated must not be lost.
    Here a lazy module itself declares another lazy module (nested): the first listing
    should include the nested module's workflow and report its failure."""
    inner = lazy(_wf("trial.inner"))
    broken = lazy("raise RuntimeError('nested boom')\n")
    outer = lazy(
        _wf("trial.outer")
        + "from durable.registry import lazy_module\n"
        + f"lazy_module({inner!r}, workflows=['trial.inner'])\n"
        + f"lazy_module({broken!r}, workflows=['trial.broken'])\n"
    )
    registry.lazy_module(outer, workflows=["trial.outer"])
    names = {spec.name for spec in registry.workflows()}
    assert "trial.outer" in names
    assert "trial.inner" in names, "the first listing missed the nested lazy module"
    assert broken in registry.import_errors()


def test_a_nested_lookup_of_another_lazy_name_during_import_works(lazy):  # noqa: F811
    """Ray: "Dead lock in python import thread"
    (https://github.com/ray-project/ray/issues/17980), a lock held while importing and the
    import needing the same machinery. A lazy module whose import looks up another lazy
    module's workflow (same thread, re-entrant lock) must get it, not hang."""
    inner = lazy(_wf("trial.dep"))
    outer = lazy(
        "from durable import registry\n"
        "DEP = registry.get_workflow('trial.dep')\n" + _wf("trial.uses-dep")
    )
    registry.lazy_module(inner, workflows=["trial.dep"])
    registry.lazy_module(outer, workflows=["trial.uses-dep"])
    assert registry.get_workflow("trial.uses-dep").name == "trial.uses-dep"
    assert sys.modules[outer].DEP.name == "trial.dep"
    assert outer not in registry.import_errors() and inner not in registry.import_errors()


def test_a_name_declared_by_two_lazy_modules(lazy):  # noqa: F811
    """DBOS "Print a warning for duplicate workflow registration"
    (https://github.com/dbos-inc/dbos-transact-py/pull/283) and neonKUBE "Better duplicate
    workflow/activity registration detection" (https://github.com/nforgeio/neonKUBE/issues/866):
    a conflicting declaration should be refused when made, or the lookup should find the
    workflow the module that really registers it provides - not a failure that depends on
    declaration order."""
    real = lazy(_wf("trial.dup"))
    other = lazy(_wf("trial.other"))
    registry.lazy_module(real, workflows=["trial.dup"])
    try:
        registry.lazy_module(other, workflows=["trial.dup"])  # a copy-paste slip
    except DurableConfigurationError:
        return  # refused at declaration: fine
    assert registry.get_workflow("trial.dup").name == "trial.dup"


def test_a_lazy_module_registering_a_name_it_did_not_declare(lazy):  # noqa: F811
    """Celery: "celery worker registers tasks via include= (autodiscover was a no-op)"
    (https://github.com/mishrasanjeev/agentic-org/pull/425) and "Some Celery tasks work,
    others are NotRegistered" (https://github.com/celery/celery/issues/3584): a worker whose
    registry depends on which modules happened to be imported. A lookup of a workflow the
    lazy module registers but did not declare must give the same answer before and after
    a listing (or the undeclared name must be reported)."""
    module = lazy(_wf("trial.declared") + _wf("trial.undeclared", fn="wf2"))
    registry.lazy_module(module, workflows=["trial.declared"])
    try:
        before = registry.get_workflow("trial.undeclared").name
    except WorkflowNotFound:
        before = None
    reported = "trial.undeclared" in registry.import_errors().get(module, "")
    after = registry.get_workflow("trial.undeclared").name  # the listing imported it
    assert before == after or reported, (
        f"lookup before a listing: {before!r}, after: {after!r}, not reported"
    )


def test_versions_of_a_lazy_workflow_and_an_explicit_version(lazy):  # noqa: F811
    """Temporal .NET "Cannot add multiple versions of a workflow using DI"
    (https://github.com/temporalio/sdk-dotnet/issues/212): several versions under one
    name. An eager v1 and a lazy v2 of one name: an explicit version finds each, the
    default is the last registered (v2), and an unknown version names the known ones."""
    eager = lazy(_wf("trial.ver", "1"))
    __import__(eager)
    late = lazy(_wf("trial.ver", "2", fn="wf_v2"))
    registry.lazy_module(late, workflows=["trial.ver"])
    assert registry.get_workflow("trial.ver", "1").fn(None, None) == "1"
    assert registry.get_workflow("trial.ver").version == "2"
    assert registry.get_workflow("trial.ver", 2).version == "2"  # int version
    with pytest.raises(WorkflowNotFound, match="trial.ver@1"):
        registry.get_workflow("trial.ver", "3")


def test_workflows_given_as_one_string_is_refused(lazy):  # noqa: F811
    """Celery "autodiscover was a no-op" (https://github.com/mishrasanjeev/agentic-org/pull/425):
    an argument of the wrong shape silently declares nothing useful. ``workflows="graph"``
    (a str, not a list) should be refused, not declared as 'g', 'r', 'a', 'p', 'h'."""
    module = lazy(_wf("graph"))
    with pytest.raises(DurableConfigurationError):
        registry.lazy_module(module, workflows="graph")


def test_a_module_that_registers_then_fails_is_not_half_available(lazy):  # noqa: F811
    """griptape "LoadWorkflowMetadata ... doesn't abort if the workflow was already
    registered ... confusing state" (https://github.com/griptape-ai/griptape-nodes-engine/issues/996):
    a lazy module that registers its workflow and then raises is reported as failed,
    yet the lookup should not hand out a workflow from a module that never finished."""
    module = lazy(_wf("trial.half") + "raise RuntimeError('after registering')\n")
    registry.lazy_module(module, workflows=["trial.half"])
    found = None
    with contextlib.suppress(WorkflowNotFound):
        found = registry.get_workflow("trial.half")
    assert module in registry.import_errors()
    assert found is None, "a workflow of a module that failed to import is still served"


def test_a_forked_child_imports_the_lazy_module_at_its_first_lookup(lazy):  # noqa: F811
    """django-celery "windows ... fails: AppRegistryNotReady" in a pool child
    (https://github.com/celery/django-celery/issues/454): state set up in the parent, used
    in a forked child. The parent declares without importing; the child's first lookup
    imports it; the parent stays without it."""
    module = lazy(_wf("trial.forked"))
    registry.lazy_module(module, workflows=["trial.forked"])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            ok = registry.get_workflow("trial.forked").fn(None, None) == "1"
            os.write(write, b"ok" if ok and module in sys.modules else b"bad")
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 10) == b"ok" and status == 0
    os.close(read)
    assert module not in sys.modules


def test_a_thread_importing_a_declaring_module_while_another_loads_it_does_not_hang(
    lazy,  # noqa: F811
    monkeypatch,
):
    """Apache Paimon "Fix import deadlock: lazy-resolve package exports, drop custom locks"
    (https://github.com/apache/paimon/pull/9267): a custom RLock held around
    ``import_module`` while another thread holds the module's import lock and then wants
    the RLock is a lock-ordering inversion. ``lazy_module()`` takes the registry lock at
    import time of the declaring module, and ``_load_lazy`` holds it while importing.
    Thread B imports module X directly (e.g. a view ``from myapp.workflows import ...``);
    thread A looks up a name declared lazily in X; X calls ``lazy_module`` at import."""
    monkeypatch.setattr(registry, "_discovery_lock", threading.RLock())  # a hang stays here
    other = lazy(_wf("trial.other-lazy"))
    x = lazy(
        "import time\n"
        "time.sleep(0.5)\n"  # thread B holds X's import lock meanwhile
        "from durable.registry import lazy_module\n"
        f"lazy_module({other!r}, workflows=['trial.other-lazy'])\n" + _wf("trial.x")
    )
    registry.lazy_module(x, workflows=["trial.x"])
    errors: list[BaseException] = []

    def run(fn) -> threading.Thread:
        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        return thread

    b = run(lambda: __import__(x))
    time.sleep(0.1)  # B is inside X's body, sleeping
    a = run(lambda: registry.get_workflow("trial.x"))
    a.join(10)
    b.join(10)
    assert not a.is_alive() and not b.is_alive(), "deadlock: registry lock vs import lock"
    assert errors == []


@pytest.mark.django_db
def test_durable_workflows_command_reports_a_lazy_module_failure(lazy):  # noqa: F811
    """Celery "Some Celery tasks work, others are NotRegistered"
    (https://github.com/celery/celery/issues/3584): the listing must say what failed.
    ``manage.py durable workflows --strict`` names the lazy module that failed and exits
    non-zero."""
    from django.core.management import CommandError, call_command

    module = lazy("raise ImportError('no langgraph here')\n")
    registry.lazy_module(module, workflows=["trial.cmd-broken"])
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError):
        call_command("durable", "workflows", "--strict", stdout=out, stderr=err)
    assert module in err.getvalue() and "no langgraph here" in err.getvalue()


@pytest.mark.django_db
def test_the_api_schema_lists_a_lazy_workflow(lazy, admin_client):  # noqa: F811
    """Temporal "Listing workflows and activities from temporal sdk"
    (https://github.com/temporalio/temporal/issues/8764): the registered workflows, listed.
    The API's schema for a signed-in user (start's ``workflow`` enum) includes a lazy workflow."""
    module = lazy(_wf("trial.api-listed"))
    registry.lazy_module(module, workflows=["trial.api-listed"])
    response = admin_client.get("/api/v1/schema")
    assert response.status_code == 200, response.status_code
    enum = response.json()["components"]["schemas"]["StartIn"]["properties"]["workflow"]["enum"]
    assert "trial.api-listed" in enum


LAZY_TOOL = """
import durable

@durable.tool(name={tool!r}, safety="read_only")
def lazy_tool(text: str) -> str:
    return text.upper()
"""

CALLS_TOOL = """
import durable

@durable.workflow(name={wf!r})
def wf(ctx, data):
    return ctx.call_tool({tool!r}, {{"text": data}})
"""


def _env_run(workflow: str, data):
    from durable.testing.env import DurableEnv

    with DurableEnv() as env:
        run = env.run(env.start(workflow, data))
        return run, [c.tool for c in env.tools.calls]


def test_durable_env_records_a_lazy_tool(lazy, transactional_db):  # noqa: F811
    """Temporal Python "activity not registered" style mismatches between the test
    environment and the worker (https://github.com/temporalio/sdk-dotnet/issues/212 -
    registrations differ by how the worker was built): under ``DurableEnv`` a run of a lazy
    workflow calling a lazy tool completes and the tool call is recorded."""
    tool_mod = lazy(LAZY_TOOL.format(tool="trial.lazy-tool"))
    wf_mod = lazy(CALLS_TOOL.format(wf="trial.env-wf", tool="trial.lazy-tool"))
    registry.lazy_module(tool_mod, tools=["trial.lazy-tool"])
    registry.lazy_module(wf_mod, workflows=["trial.env-wf"])
    run, calls = _env_run("trial.env-wf", "hi")
    assert run.status == "succeeded" and json.loads(run.output) == "HI"
    assert calls == ["trial.lazy-tool"]


def test_durable_env_records_a_tool_of_a_nested_lazy_module(lazy, transactional_db):  # noqa: F811
    """DBOS "registered after DBOS.launch()" (https://github.com/dbos-inc/dbos-transact-ts/pull/787):
    code registered after the framework took its snapshot is not instrumented. A tool
    in a lazy module declared by another lazy module must still be recorded by
    ``DurableEnv`` (ToolRecorder snapshots ``registry.tools()`` at install)."""
    tool_mod = lazy(LAZY_TOOL.format(tool="trial.nested-tool"))
    wf_mod = lazy(
        CALLS_TOOL.format(wf="trial.nested-wf", tool="trial.nested-tool")
        + "from durable.registry import lazy_module\n"
        + f"lazy_module({tool_mod!r}, tools=['trial.nested-tool'])\n"
    )
    registry.lazy_module(wf_mod, workflows=["trial.nested-wf"])
    run, calls = _env_run("trial.nested-wf", "hi")
    assert run.status == "succeeded" and json.loads(run.output) == "HI"
    assert calls == ["trial.nested-tool"], "the nested lazy tool's call was not recorded"


@pytest.mark.django_db
def test_the_dashboard_start_page_offers_a_lazy_workflow(lazy, admin_client):  # noqa: F811
    """Temporal "Listing workflows and activities" (https://github.com/temporalio/temporal/issues/8764):
    the dashboard's start page lists a lazily declared workflow."""
    module = lazy(_wf("trial.dash-listed"))
    registry.lazy_module(module, workflows=["trial.dash-listed"])
    response = admin_client.get("/runs/new/")
    assert response.status_code == 200
    assert b"trial.dash-listed" in response.content


def test_redeclaring_a_module_with_other_names_leaves_no_stale_declaration(lazy):  # noqa: F811
    """Celery "unregistered task ... Ran successfully thousands of times"
    (https://github.com/celery/celery/issues/5016): a stale registration entry. Declaring
    the same module twice (e.g. a reload of the declaring module after an edit) with a
    renamed workflow: the old name must not stay declared, pointing at the module."""
    module = lazy(_wf("trial.new-name"))
    registry.lazy_module(module, workflows=["trial.old-name"])
    registry.lazy_module(module, workflows=["trial.new-name"])
    assert registry.get_workflow("trial.new-name").name == "trial.new-name"
    assert "trial.old-name" not in registry._lazy_workflows
