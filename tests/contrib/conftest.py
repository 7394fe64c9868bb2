"""The scripted LLM server (examples/fake_llm.py) in a thread, for the OpenAI Agents tests."""

from __future__ import annotations

import pytest

from examples._http import start
from examples.fake_llm import FakeLLM


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
