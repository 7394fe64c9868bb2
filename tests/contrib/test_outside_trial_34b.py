"""Cases of the second outside trial of issue 34 (MCP), a new user's first hour with
``manage.py durable mcp``, from public reports of MCP servers:

- a tool annotated ``date`` or with a pydantic model got the JSON text or dict it was
  sent (FastMCP converts through the tool's pydantic model: jlowin/fastmcp reports of
  tools receiving ``str`` for ``datetime`` parameters in other servers);
- a result's text block and its ``structuredContent`` disagreed on a ``datetime``
  (clients that read only the text -- most of them -- saw another value:
  modelcontextprotocol/python-sdk structured output reports);
- ``tasks/list`` took a cursor it never issued as page one (the spec's pagination
  section: an invalid cursor is -32602);
- the stdio server on a database never migrated started, and then failed every call
  (the user only sees "tool call failed" in the client).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

pytest.importorskip("mcp")

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS

import durable
from durable.contrib.mcp.server import build_server
from durable.models import Run
from durable.worker.engine import execute

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
#: what the tools below were given: (parameter, Python type name)
SEEN: list[tuple[str, str]] = []


class Address(BaseModel):
    city: str
    zip: str


@durable.tool(name="trial34b.schedule", safety="read_only")
def schedule(day: dt.date, at: list[dt.time], where: Address, note: str = "") -> dict:
    """Plan a visit on a day, at some times, at an address."""
    SEEN.extend(
        [("day", type(day).__name__), ("at", type(at[0]).__name__), ("where", type(where).__name__)]
    )
    return {"weekday": day.strftime("%A"), "first": at[0].isoformat(), "city": where.city}


@durable.tool(name="trial34b.clock", safety="read_only")
def clock() -> dict:
    """The server's time and a price."""
    return {
        "now": dt.datetime(2026, 12, 5, 9, 30, tzinfo=dt.UTC),
        "price": Decimal("19.90"),
        "tags": ("a", "b"),
    }


def session(*steps):
    async def main():
        server = build_server(lambda ctx: ("t34b", "t34b"), execute=execute, call_wait=5.0)
        async with Client(server, mode="legacy") as client:
            return [await step(client) for step in steps]

    return anyio.run(main)


def test_arguments_reach_the_tool_as_its_annotated_types():
    SEEN.clear()
    arguments = {
        "day": "2026-12-07",
        "at": ["09:30:00", "14:00:00"],
        "where": {"city": "Lyon", "zip": "69001"},
    }
    (result,) = session(lambda c: c.call_tool("trial34b.schedule", arguments))
    assert result.is_error is not True, result.content
    assert result.structured_content["result"] == {
        "weekday": "Monday",
        "first": "09:30:00",
        "city": "Lyon",
    }
    assert SEEN == [("day", "date"), ("at", "time"), ("where", "Address")]
    # what is recorded is what the client sent (the approval's hash covers that)
    run = Run.objects.get(id=result.structured_content["call_id"])
    assert run.input_value()["arguments"] == arguments


def test_a_wrong_date_is_a_tool_error_naming_the_field_and_runs_nothing():
    SEEN.clear()
    bad = {"day": "7 December", "at": [], "where": {"city": "Lyon", "zip": "1"}}
    (result,) = session(lambda c: c.call_tool("trial34b.schedule", bad))
    assert result.is_error is True
    assert "day" in result.content[0].text
    assert SEEN == []


def test_the_text_block_carries_the_same_values_as_the_structured_content():
    (result,) = session(lambda c: c.call_tool("trial34b.clock", {}))
    assert result.is_error is not True, result.content
    assert json.loads(result.content[0].text) == result.structured_content
    assert result.structured_content["result"] == {
        "now": "2026-12-05T09:30:00Z",
        "price": "19.90",
        "tags": ["a", "b"],
    }


class ListRequest(types.Request[types.RequestParams, str]):
    method: str = "tasks/list"
    params: types.RequestParams | None = None


@pytest.mark.parametrize("cursor", ["bogus", "-1", "1e3", "٣"])
def test_tasks_list_refuses_a_cursor_it_never_issued(cursor):
    async def listing(c):
        try:
            await c.session._dispatcher.send_raw_request("tasks/list", {"cursor": cursor}, None)
        except MCPError as exc:
            return exc
        return None

    (refused,) = session(listing)
    assert refused is not None, f"cursor {cursor!r} taken as a page"
    assert refused.error.code == INVALID_PARAMS
    assert "cursor" in refused.error.message


def test_tasks_list_takes_its_own_cursor():
    async def listing(c):
        return await c.session._dispatcher.send_raw_request("tasks/list", {"cursor": "0"}, None)

    (page,) = session(listing)
    assert page["tasks"] == []


def test_the_stdio_server_on_an_unmigrated_database_says_what_to_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["DURABLE_VAR_DIR"] = str(tmp_path)  # a fresh SQLite file: no tables at all
    done = subprocess.run(
        [sys.executable, "manage.py", "durable", "mcp"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""  # stdout is the protocol's
    assert "Traceback" not in done.stderr, done.stderr
    assert "has no Durable tables yet" in done.stderr and "manage.py migrate" in done.stderr
