"""An approved MCP write whose worker is SIGKILLed after the effect: it happens once.

An MCP client (the official SDK, in-process server) calls a gated ``unsafe_write``; it
waits in the inbox; after the approval a real worker runs it and is killed right after
the external effect, before any checkpoint. A second worker finds the unknown outcome,
the tool's ``reconcile`` finds the effect by its idempotency key, and the client's
status poll gets the one parcel.
"""

from __future__ import annotations

import json

import anyio
import pytest
from django.contrib.auth import get_user_model

pytest.importorskip("mcp")

from mcp import Client

from approvals.services import approval_decide
from durable.contrib.mcp import calls
from durable.contrib.mcp.server import build_server
from durable.models import TERMINAL, Run, RunStatus
from durable.worker.engine import execute
from tests import mcp_tools  # noqa: F401  (registers the tools)
from tests.harness import wait_for_run, wait_until

pytestmark = pytest.mark.processes

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.mcp_tools"}


def mcp(*steps):
    async def main():
        async with Client(
            build_server(lambda ctx: ("bob", "bob"), execute=execute, call_wait=5.0)
        ) as c:
            return [json.loads((await step(c)).content[0].text) for step in steps]

    return anyio.run(main)


def test_an_approved_mcp_write_killed_after_its_effect_happens_once(workers, proc_env):
    alice = get_user_model().objects.create_superuser("alice", "a@example.com", "pw")
    (asked,) = mcp(lambda c: c.call_tool("mcpt.ship", {"order_id": "o-5", "quantity": 2}))
    assert asked["state"] == "input_required", asked
    call_id = asked["call_id"]

    first = workers.start(wait=True, crash_at="mcpt.ship:after_effect", **WORKER_ENV)
    approval_decide(request_id=asked["approval_id"], user=alice, approve=True)
    wait_until(lambda: proc_env.crashed("mcpt.ship:after_effect"), 40, what="the kill")
    first.proc.wait(10)
    assert [e["key"] for e in proc_env.effects()] == [f"{call_id}:call"]

    workers.start(wait=True, **WORKER_ENV)
    run = wait_for_run(call_id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error

    (done,) = mcp(lambda c: c.call_tool(calls.STATUS_TOOL, {"call_id": call_id}))
    assert done["state"] == "completed"
    assert done["result"] == {"parcel": "P-1", "order_id": "o-5"}
    assert len(proc_env.effects()) == 1  # the parcel left once
    kinds = [i["kind"] for i in proc_env.invocations() if i["run"] == call_id]
    assert kinds == ["step", "reconcile"]  # the body once, then the reconcile hook


ADAPTER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.contrib.mcp_agents"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("adapter", ["pai", "oai"])
def test_a_worker_killed_after_an_adapters_mcp_read_does_not_call_it_again(
    workers, proc_env, adapter
):
    """An agent of each adapter reads ``forecast`` from a real stdio MCP server, then its
    worker is SIGKILLed at the next model request, and the server changes its listing.
    The next worker replays the listing and the read from the record (the model is
    offered the tools the run saw; ``forecast`` is not called again), waits for the
    approval of ``book``, and books once, with its idempotency key."""
    pytest.importorskip("fastmcp")
    from django.contrib.auth.models import Permission, User

    from approvals.models import ApprovalRequest
    from tests.contrib import mcp_agents as ma
    from tests.contrib import pai_agents as pa

    trip = ma.pai_trip if adapter == "pai" else ma.oai_trip
    first = workers.start(wait=True, crash_at="model:2", **ADAPTER_ENV)
    run = trip.start("plan a trip to Oslo", started_by="os:requester")
    ended = lambda: Run.objects.get(pk=run.id).status in TERMINAL  # noqa: E731
    wait_until(lambda: proc_env.crashed("model:2") or ended(), 60, what="the kill at model:2")
    assert proc_env.crashed("model:2"), Run.objects.get(pk=run.id).error
    first.proc.wait(10)
    log = ma.server_log()
    assert [e["tool"] for e in log if e["kind"] == "call"] == ["forecast"]
    (proc_env.dir / "mcp.jsonl.changed").touch()  # the server now lists one tool more

    workers.start(wait=True, **ADAPTER_ENV)
    wait_for_run(run.id, timeout=60, statuses=(RunStatus.WAITING,))
    alice, _ = User.objects.get_or_create(username="alice")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    approval_decide(
        request_id=ApprovalRequest.objects.get(run_id=run.id).pk, user=alice, approve=True
    )
    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error

    log = ma.server_log()
    calls = [(e["tool"], e["key"]) for e in log if e["kind"] == "call"]
    assert calls == [("forecast", f"{run.id}:tool:forecast"), ("book", f"{run.id}:tool:book")]
    models = [(c["name"], c["tools"]) for c in pa.calls() if c["kind"] == "model"]
    # the killed request ran again (it never finished), each other once; every request
    # was offered the tools the run listed before the server changed: the recorded list
    assert [name for name, _ in models] == ["1", "2", "2", "3"]
    assert {tuple(tools) for _, tools in models} == {("book", "forecast")}
