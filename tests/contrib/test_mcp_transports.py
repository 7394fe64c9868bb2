"""The MCP endpoint over its real transports, the official SDK as the client.

- streamable HTTP over loopback: the project's ASGI app (``config.asgi``) served by
  uvicorn on a thread of this process, behind an API token with the scope ``mcp:call``;
  and by daphne, the production server of the Procfile, as a process of its own;
- stdio: ``manage.py durable mcp`` as a subprocess on the test database.

In both, an approval-gated write answers that it waits, waits in the inbox, and runs
once after the approval (the status tool's poll executes the resumed run).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager

import anyio
import httpx
import pytest
from django.contrib.auth import get_user_model

pytest.importorskip("mcp")

import uvicorn
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from api.models import token_create
from approvals.services import approval_decide
from durable.contrib.mcp import calls
from durable.models import Run
from tests import crash_workflows as cw
from tests import mcp_tools  # noqa: F401  (registers the tools)
from tests.harness import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


def payload(result) -> dict:
    return json.loads(result.content[0].text)


@pytest.fixture
def crash_dir(tmp_path, monkeypatch):
    folder = tmp_path / "crash"
    folder.mkdir()
    monkeypatch.setenv("CRASH_TEST_DIR", str(folder))
    return folder


@pytest.fixture
def alice():
    return get_user_model().objects.create_superuser("alice", "alice@example.com", "pw")


@contextmanager
def serving():
    """``config.asgi.application`` on a loopback port; yields its base URL."""
    from config.asgi import application

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(application, lifespan="off", log_level="warning", host="127.0.0.1")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            threading.Event().wait(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def over_http(url: str, token: str, *steps):
    async def main():
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http)) as c:
            return [await step(c) for step in steps]

    return anyio.run(main)


def gated_write(run_steps, approver, crash_dir):
    """The scenario both transports run: list, read, a gated write approved, polled."""
    listed, read, write = run_steps(
        lambda c: c.list_tools(),
        lambda c: c.call_tool("mcpt.stock", {"sku": "abcd"}),
        lambda c: c.call_tool("mcpt.ship", {"order_id": "o-1", "quantity": 3}),
    )
    names = {t.name for t in listed.tools}
    assert {"mcpt.stock", "mcpt.ship", calls.STATUS_TOOL} <= names
    assert payload(read)["result"]["count"] == 4
    body = payload(write)
    assert body["state"] == "input_required", body
    assert cw.read_jsonl(crash_dir / "effects.jsonl") == []

    approval_decide(request_id=body["approval_id"], user=approver, approve=True)
    (done,) = run_steps(
        lambda c: c.call_tool(calls.STATUS_TOOL, {"call_id": body["call_id"], "wait_seconds": 20})
    )
    assert payload(done)["state"] == "completed", payload(done)
    assert payload(done)["result"]["order_id"] == "o-1"
    effects = cw.read_jsonl(crash_dir / "effects.jsonl")
    assert [e["key"] for e in effects] == [f"{body['call_id']}:call"]
    return body["call_id"]


def test_http_lists_calls_and_completes_an_approved_write_once(alice, crash_dir):
    bob = get_user_model().objects.create_superuser("bob", "bob@example.com", "pw")
    _, token = token_create(user=bob, name="desktop", scopes=["mcp:call"])
    with serving() as url:
        # bob calls, alice approves (four-eyes: the caller may not approve his own call)
        call_id = gated_write(lambda *s: over_http(url, token, *s), alice, crash_dir)
    assert Run.objects.get(pk=call_id).started_by_id == bob.pk


def test_http_needs_a_token_with_the_mcp_scope(alice):
    _, other = token_create(user=alice, name="reader", scopes=["runs:read"])
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    with serving() as url:
        anonymous = httpx.post(f"{url}/mcp", json=hello)
        wrong_scope = httpx.post(
            f"{url}/mcp", json=hello, headers={"Authorization": f"Bearer {other}"}
        )
        django_still = httpx.get(f"{url}/api/v1/runs")
        with pytest.raises(BaseExceptionGroup) as refused:  # the SDK's task group
            over_http(url, other, lambda c: c.list_tools())
    assert refused.group_contains(MCPError, match="mcp:call", depth=None), refused.value
    assert anonymous.status_code == 401
    assert "mcp:call" in anonymous.json()["detail"]
    assert wrong_scope.status_code == 403
    assert "mcp:call" in wrong_scope.json()["detail"]
    assert django_still.status_code == 401  # the rest of the app is Django's, as before


def test_stdio_lists_calls_and_completes_an_approved_write_once(alice, crash_dir):
    env = worker_env(
        crash_dir, DURABLE_WORKFLOW_MODULES="tests.mcp_tools", DURABLE_DISPATCH="manual"
    )
    params = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "durable", "mcp", "--by", "bob"],
        env=env,
        cwd=str(REPO),
    )

    def over_stdio(*steps):
        async def main():
            async with Client(params) as c:
                return [await step(c) for step in steps]

        return anyio.run(main)

    call_id = gated_write(over_stdio, alice, crash_dir)
    assert Run.objects.get(pk=call_id).starter_label == "bob"


@contextmanager
def daphne(crash_dir):
    """``daphne config.asgi:application`` (the Procfile's web process) in a process of
    its own on the test database, on a loopback socket this test bound and hands it
    (``--fd``: no port race); yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    env = worker_env(
        crash_dir, DURABLE_WORKFLOW_MODULES="tests.mcp_tools", DURABLE_DISPATCH="manual"
    )
    log = open(crash_dir / "daphne.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "daphne"),
            "--fd",
            str(sock.fileno()),
            "-v",
            "1",
            "config.asgi:application",
        ],
        env=env,
        cwd=str(REPO),
        pass_fds=[sock.fileno()],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):  # up to 30 s on a loaded machine: the app imports Django
            assert proc.poll() is None, (crash_dir / "daphne.log").read_text()
            try:
                httpx.get(f"{url}/mcp", timeout=1)  # any answer: daphne serves
                break
            except httpx.TransportError:
                threading.Event().wait(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        sock.close()


def test_http_under_daphne_lists_reads_and_refuses_a_token_without_the_scope(crash_dir):
    bob = get_user_model().objects.create_superuser("bob", "bob@example.com", "pw")
    _, token = token_create(user=bob, name="desktop", scopes=["mcp:call"])
    _, reader = token_create(user=bob, name="reader", scopes=["runs:read"])
    with daphne(crash_dir) as url:
        listed, read = over_http(
            url,
            token,
            lambda c: c.list_tools(),
            lambda c: c.call_tool("mcpt.stock", {"sku": "abcd"}),
        )
        with pytest.raises(BaseExceptionGroup) as refused:  # the SDK's task group
            over_http(url, reader, lambda c: c.list_tools())
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        wrong_scope = httpx.post(
            f"{url}/mcp", json=hello, headers={"Authorization": f"Bearer {reader}"}
        )
    names = {t.name for t in listed.tools}
    assert {"mcpt.stock", "mcpt.ship", calls.STATUS_TOOL} <= names
    body = payload(read)
    assert body["state"] == "completed" and body["result"]["count"] == 4, body
    assert Run.objects.get(pk=body["call_id"]).started_by_id == bob.pk  # recorded, too
    # the refusal's JSON-RPC body reaches the SDK's client as the error, naming the scope
    # (a bare status would be "Server returned an error response")
    assert refused.group_contains(MCPError, match="mcp:call", depth=None), refused.value
    assert wrong_scope.status_code == 403
    assert "mcp:call" in wrong_scope.json()["detail"]
