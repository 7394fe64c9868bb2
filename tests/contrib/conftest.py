"""Fixtures of the contrib tests.

The LangGraph tests run only where LangGraph is importable; the agent-framework tests
skip themselves (``pytest.importorskip``) without their packages. Under ``pip install -e
'.[test]'`` (``make test``, CI) all are: the ``test`` extra lists the extras' packages.
``scripted_llm`` runs the scripted LLM server (examples/fake_llm.py) in a thread, for the
OpenAI Agents tests.
"""

from __future__ import annotations

import importlib.util

import pytest

from examples._http import start
from examples.fake_llm import FakeLLM

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("langgraph") is None:  # pragma: no cover - lean installs only
    collect_ignore_glob.append("test_langgraph_*.py")
# the outside trial of issue 29 crosses all three frameworks: it needs each of them
if any(importlib.util.find_spec(m) is None for m in ("agents", "langgraph", "pydantic_ai")):
    collect_ignore_glob.append("test_outside_trial_29.py")  # pragma: no cover


@pytest.fixture
def lg_workflows(settings):
    """Register the graph workflows of ``tests.contrib.lg_workflows`` for in-process runs."""
    from tests.contrib import lg_workflows

    settings.DURABLE = {
        **settings.DURABLE,
        "WORKFLOW_MODULES": [*settings.DURABLE["WORKFLOW_MODULES"], "tests.contrib.lg_workflows"],
    }
    lg_workflows.NODE_LOG.clear()
    lg_workflows.REFUNDS.clear()
    lg_workflows.FAIL_ONCE.clear()
    lg_workflows.FAIL_SUBJECTS.clear()
    lg_workflows.BEFORE_FAIL.clear()
    lg_workflows.CHAT_CALLS.clear()
    return lg_workflows


@pytest.fixture(scope="session", name="_llm_server")
def llm_server_fixture():
    llm = FakeLLM()
    server = start(llm.router, "fake-llm")
    try:
        yield llm, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()


@pytest.fixture(name="scripted_llm")
def scripted_llm_fixture(_llm_server, monkeypatch):
    """``FakeLLM`` with an empty log; OPENAI_BASE_URL/OPENAI_API_KEY point at it."""
    llm, url = _llm_server
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_API_KEY", "scripted")
    with llm.lock:
        llm.log.clear()
        llm.seen.clear()
    return llm


@pytest.fixture
def lgs_workflows(settings):
    """Register the streaming graph workflows of ``tests.contrib.lg_stream_workflows``."""
    from tests.contrib import lg_stream_workflows

    settings.DURABLE = {
        **settings.DURABLE,
        "WORKFLOW_MODULES": [
            *settings.DURABLE["WORKFLOW_MODULES"],
            "tests.contrib.lg_stream_workflows",
        ],
    }
    lg_stream_workflows.CALLS.clear()
    lg_stream_workflows.FAIL_ONCE.clear()
    return lg_stream_workflows
