"""Fixtures of the browser tests: headless Chromium driving the real dashboard.

For the whole package (``scope="package"``, so everything stops before the next package's
tests and before the test database is dropped):

- ``server``: the real ASGI app (``config.asgi:application``) served by daphne in its own
  process against the test database (:mod:`tests.browser.server`);
- ``worker``: one real Celery worker (:mod:`tests.harness`) that executes the runs the
  dashboard's actions hand over (approve, compensate, reconcile);
- ``browser``: Debian's Chromium (``/usr/bin/chromium``) driven by Playwright's sync API.

The three share a private ``filesystem://`` broker folder with the test process (or the
broker of ``CELERY_BROKER_URL``), ``DJANGO_SECRET_KEY`` and ``DURABLE_VAR_DIR``.

Each test gets a fresh browser context (``page``, 1280x800, light scheme) and sets its
runs up in the test process with :func:`durable.testing.drive` (manual dispatch); once
it calls :func:`celery_dispatch`, what it starts is executed by the worker. Log in with
:func:`login` (a session cookie) or through the login page (``test_login.py``).

Screenshots go to ``$DURABLE_ARTIFACTS/screenshots`` (default ``artifacts/screenshots``,
gitignored); a failing test leaves ``failures/<test>.png`` there, and prints the tail of
the daphne and worker logs.

Playwright's sync API keeps an asyncio loop running in the test's thread, so Django's
"async unsafe" check is switched off in this process (``DJANGO_ALLOW_ASYNC_UNSAFE``) while
the browser is open -- never in the daphne and worker processes.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client

from tests import (
    harness,
    waits_workflows,  # registers the approval, signal and compensation flows
    workflows,  # noqa: F401
)
from tests.browser import tour_workflows
from tests.browser.server import Daphne
from tests.dashboard import dash_workflows
from tests.harness import (
    LEASE_SECONDS,
    REPO,
    SWEEP_INTERVAL,
    WorkerPool,
    purge_broker,
    restore_broker,
    use_session_broker,
    worker_env,
)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
WORKFLOW_MODULES = [
    "tests.workflows",
    "tests.waits_workflows",
    "tests.dashboard.dash_workflows",
    "tests.dashboard.start_workflows",
    "tests.browser.tour_workflows",
    "tests.schedule_workflows",
    "tests.stream_workflows",
]
#: workflow modules daphne imports and the workers do not (tests/browser/test_graph.py)
SERVER_ONLY_MODULES = ["tests.contrib.lg_workflows"]
VIEWPORT = {"width": 1280, "height": 800}
#: how long a locator action or an ``expect`` waits (ms): a live update arrives within a
#: second; a run handed to the worker finishes within a few on a loaded 2-core machine
TIMEOUT_MS = 15_000
ASYNC_UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"


def artifacts_dir() -> Path:
    """Where screenshots go: ``$DURABLE_ARTIFACTS/screenshots`` or ``artifacts/screenshots``."""
    root = Path(os.environ.get("DURABLE_ARTIFACTS") or REPO / "artifacts")
    folder = root / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# ------------------------------------------------------------------ the three processes


@pytest.fixture(scope="package")
def _requirements() -> None:
    """Skip the package when Chromium or Playwright is missing (CI installs both)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is missing (pip install -e '.[test]')")


@pytest.fixture(scope="package")
def _broker(_requirements, tmp_path_factory) -> Iterator[Path]:
    """A private broker folder (filesystem://) for this package's processes."""
    folder = tmp_path_factory.mktemp("browser-var")
    session_folder = harness._session_var_dir  # tests/processes' session broker, if set up
    previous = use_session_broker(folder)
    yield folder
    restore_broker(previous)
    harness._session_var_dir = session_folder


def _server_env(folder: Path) -> dict[str, str]:
    """The environment of the daphne process: a harness worker's."""
    crash_dir = folder / "crash"
    crash_dir.mkdir(exist_ok=True)
    # the server alone also has a LangGraph module, for the run page's graph (its runs are
    # driven in the test process): LangGraph's import would cost each worker a second
    modules = [*WORKFLOW_MODULES, *SERVER_ONLY_MODULES]
    env = worker_env(crash_dir, DURABLE_WORKFLOW_MODULES=",".join(modules))
    env.pop(ASYNC_UNSAFE, None)  # the server keeps Django's async-safety checks
    return env


@pytest.fixture(scope="package")
def browser_llm(_requirements) -> Iterator[Any]:
    """The scripted model (examples/fake_llm.py) in a thread of this process, for the
    package's worker (``OPENAI_BASE_URL``): the run page's live output streams from it.
    Each test starts with its faults, holds and log cleared (``live``)."""
    from examples._http import start
    from examples.fake_llm import FakeLLM

    llm = FakeLLM()
    http = start(llm.router, "fake-llm")
    llm.env = {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{http.server_address[1]}/v1",
        "OPENAI_API_KEY": "scripted",
    }
    yield llm
    llm.release.set()
    http.shutdown()


@pytest.fixture(scope="package")
def worker(django_db_setup, _broker, browser_llm) -> Iterator[WorkerPool]:
    """One real Celery worker for the package (started once: start-up takes seconds;
    ``live`` waits until it is ready, so daphne starts meanwhile)."""
    pool = WorkerPool(_broker / "crash", _broker / "logs")
    with pytest.MonkeyPatch.context() as mp:  # the worker keeps Django's async-safety checks
        mp.delenv(ASYNC_UNSAFE, raising=False)
        pool.start(DURABLE_WORKFLOW_MODULES=",".join(WORKFLOW_MODULES), **browser_llm.env)
    yield pool
    pool.kill_all()


@pytest.fixture(scope="package")
def server(django_db_setup, _broker, worker) -> Iterator[Daphne]:
    """daphne serving the dashboard against the test database; its URL is ``server.url``."""
    daphne = Daphne(_server_env(_broker), _broker / "daphne.log")
    daphne.start()
    yield daphne
    daphne.stop()


@pytest.fixture(scope="package")
def browser(_requirements) -> Iterator[Any]:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ASYNC_UNSAFE, "true")
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                yield chromium
            finally:
                chromium.close()


# ----------------------------------------------------------------------- per test


@pytest.fixture(autouse=True)
def _manual_dispatch(_manual_dispatch, settings):
    """The suite's manual dispatch, plus this package's fixture workflows."""
    modules = list(settings.DURABLE.get("WORKFLOW_MODULES") or [])
    extra = [m for m in WORKFLOW_MODULES if m not in modules]
    settings.DURABLE = {**settings.DURABLE, "WORKFLOW_MODULES": [*modules, *extra]}
    dash_workflows.reset()
    tour_workflows.reset()
    waits_workflows.EFFECTS.clear()
    yield
    dash_workflows.reset()
    tour_workflows.reset()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test of this folder is a ``browser`` test, whatever its module says: CI's
    PostgreSQL suite leaves them out by that marker (``.ci/run``). tryfirst: before
    pytest's own ``-m`` deselection reads the markers."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def _failed(request) -> bool:
    return any(
        getattr(getattr(request.node, f"rep_{when}", None), "failed", False)
        for when in ("setup", "call")
    )


@pytest.fixture
def live(request, transactional_db, server, worker, browser_llm) -> Iterator[Daphne]:
    """The dashboard and its worker, with an empty broker; returns the server.

    On failure, prints what daphne and the worker logged during the test.
    """
    assert server.alive(), f"daphne died:\n{server.tail()}"
    for w in worker.workers:
        w.wait_ready()
    purge_broker()
    browser_llm.release.clear()
    offsets = {"daphne": server.log_size()}
    worker_offsets = {w.name: len(w.log_text()) for w in worker.workers}
    yield server
    browser_llm.release.set()  # a stream the test held goes on
    if _failed(request):
        print(f"----- daphne (pid {server.proc.pid if server.proc else '?'}) -----")
        print(server.log_since(offsets["daphne"])[-8000:])
        for w in worker.workers:
            state = "alive" if w.alive() else f"exit {w.proc.returncode}"
            print(f"----- worker {w.name} ({state}) -----")
            print(w.log_text()[worker_offsets.get(w.name, 0) :][-8000:])


@pytest.fixture
def context(browser, live) -> Iterator[Any]:
    ctx = browser.new_context(
        base_url=live.url,
        viewport=VIEWPORT,
        color_scheme="light",
        reduced_motion="reduce",
        locale="en-US",
        timezone_id="UTC",
    )
    ctx.set_default_timeout(TIMEOUT_MS)
    ctx.durable_url = live.url
    ctx.js_errors = []
    ctx.on("page", lambda page: _watch_errors(page, ctx.js_errors))
    yield ctx
    ctx.close()


def _watch_errors(page, errors: list[str]) -> None:
    """Collect JavaScript errors (not HTTP error statuses, which tests provoke on purpose)."""

    def on_console(msg) -> None:
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            errors.append(f"{page.url}: console.error: {msg.text}")

    page.on("pageerror", lambda exc: errors.append(f"{page.url}: pageerror: {exc}"))
    page.on("console", on_console)


@pytest.fixture
def page(request, context) -> Iterator[Any]:
    """A fresh page; a JavaScript error on any page of the context fails the test."""
    page = context.new_page()
    yield page
    if _failed(request):
        folder = artifacts_dir() / "failures"
        folder.mkdir(exist_ok=True)
        name = re.sub(r"[^\w.-]+", "_", request.node.name)
        for i, open_page in enumerate(context.pages):
            # a screenshot must not hide the failure
            with contextlib.suppress(Exception):
                open_page.screenshot(path=folder / f"{name}-{i}.png", full_page=True)
    else:
        assert not context.js_errors, "errors in the browser:\n" + "\n".join(context.js_errors)


# ------------------------------------------------------------------------- helpers


def celery_dispatch(settings) -> None:
    """From now on, what this test starts or changes is sent to the worker (as in
    ``tests/processes``), and ``tests.harness.wait_until`` sweeps as Celery beat would."""
    settings.DURABLE = {
        **settings.DURABLE,
        "DISPATCH": "celery",
        "LEASE_SECONDS": LEASE_SECONDS,
        "HEARTBEAT_SECONDS": None,
        "SWEEP_INTERVAL_SECONDS": SWEEP_INTERVAL,
        "REDISPATCH_AFTER_SECONDS": 30.0,
    }


def make_user(username: str, *groups: str, password: str | None = None, **fields) -> User:
    """A user in the given role groups; without ``password``, one that cannot log in by
    password (hashing is slow) -- use :func:`login`."""
    from django.contrib.auth.models import Group

    user = User.objects.create_user(username, password=password, **fields)
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    return user


def login(context, user: User) -> None:
    """Log ``user`` in to the browser context with a session made in the test process."""
    client = Client()
    client.force_login(user)
    name = django_settings.SESSION_COOKIE_NAME
    context.add_cookies(
        [{"name": name, "value": client.cookies[name].value, "url": context.durable_url}]
    )


def snap(page, name: str, *, full_page: bool = True) -> list[Path]:
    """Screenshots of the page as it is, light and dark: ``<name>-light.png``, ``-dark.png``.

    ``DURABLE_SCREENSHOTS=0`` takes none (what a test checks is in its expect() calls, not
    in the pictures): ``.ci/run`` sets it for the PostgreSQL suite, since the embedded
    suite takes the same pictures of the same markup, and 80 full-page screenshots cost
    Chromium about 15 s of CPU."""
    if os.environ.get("DURABLE_SCREENSHOTS", "1") == "0":
        return []
    paths = []
    page.bring_to_front()  # a background tab paints slowly (seconds per screenshot)
    page.evaluate("window.scrollTo(0, 0)")  # a sticky header would land mid-picture
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        path = artifacts_dir() / f"{name}-{scheme}.png"
        page.screenshot(path=path, full_page=full_page, animations="disabled")
        paths.append(path)
    page.emulate_media(color_scheme="light")
    return paths


def mark_no_reload(page) -> None:
    """Set a marker that a reload or navigation would wipe (see :func:`assert_no_reload`)."""
    page.evaluate("window.__noReload = 1")


def assert_no_reload(page) -> None:
    assert page.evaluate("window.__noReload") == 1, "the page was reloaded"


@pytest.fixture
def ops_user(db) -> User:
    """Operator and approver: may cancel, compensate, reconcile and decide."""
    return make_user("ada", "operator", "approver")
