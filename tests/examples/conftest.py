"""Fixtures of the reference-agent tests: the example services as real processes.

``services`` starts the scripted LLM, the payments service and the SMTP sink once per
session (free ports, state in a temporary folder). ``agent_env`` points this process
(``os.environ`` and Django's EMAIL_* settings) at them, so in-process runs and the
worker processes started by ``workers`` (tests/processes/conftest.py) use them, and it
empties their state before each test. ``operator`` is a user who may decide every
approval of the reference agents, as a support lead, billing clerk, procurement officer
and finance officer would.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from examples.procs import ServiceSet, admin
from tests.processes.conftest import proc_env, session_broker, workers  # noqa: F401

APPROVER_GROUPS = ("support-leads", "billing", "procurement", "finance")


@pytest.fixture(scope="session")
def services(tmp_path_factory):
    folder: Path = tmp_path_factory.mktemp("example-services")
    started = ServiceSet.start(folder)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def agent_env(services, settings, monkeypatch):
    for name, value in services.env().items():
        monkeypatch.setenv(name, value)
    # Django's test runner swaps in the locmem backend; the agents must speak SMTP
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = services.sink.ports["smtp"]
    settings.EMAIL_TIMEOUT = 10
    for url in (services.llm_url, services.payments_url, services.sink_url):
        admin(url, "POST", "/_admin/reset")
    return services


@pytest.fixture
def operator(transactional_db):
    user = get_user_model().objects.create_user("operator", "operator@example.com", "pw")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    for name in APPROVER_GROUPS:
        group, _ = Group.objects.get_or_create(name=name)
        user.groups.add(group)
    return get_user_model().objects.get(pk=user.pk)
