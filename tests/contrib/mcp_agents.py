"""Agents whose tools come from a real MCP server (``tests/mcp_stdio_server.py`` on
stdio), under both adapters, for tests/contrib/test_mcp_adapters.py and the worker
processes of tests/processes/test_mcp_processes.py.

``mcpa.pai-trip`` (PydanticAI, an ``MCPToolset`` with id ``weather``) and
``mcpa.oai-trip`` (OpenAI Agents, ``mcp_servers=[MCPServerStdio(name="weather")]``)
play the same script: ask ``forecast`` (``read_only``), then ``book`` (approval), then
answer with both results. The server appends its starts and calls to ``server_log()``
(``$CRASH_TEST_DIR/mcp.jsonl`` in worker processes, else ``LOG``); every model request
is ``record("model", n, tools=<the tool names offered>)`` of ``pai_agents``
(``CRASH_AT=model:2`` kills a worker there).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from agents import Agent as OaiAgent
from agents import Model, ModelProvider, ModelResponse, RunConfig
from agents.mcp import MCPServerStdio
from agents.usage import Usage
from fastmcp.client.transports import StdioTransport
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic_ai import Agent, ModelMessage, ModelRequest, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai import ModelResponse as PaiResponse
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.function import AgentInfo, FunctionModel

from durable.contrib.mcp import McpSafety
from durable.contrib.openai_agents import register
from durable.contrib.pydantic_ai import DurableAgent, current_idempotency_key
from tests.contrib.pai_agents import record
from tests.crash_workflows import read_jsonl

SERVER = str(Path(__file__).resolve().parent.parent / "mcp_stdio_server.py")
#: where the server logs when no $CRASH_TEST_DIR is set (set by the in-process tests)
LOG: list[str] = [""]

SAFETY = {"weather": McpSafety(safety={"forecast": "read_only"}, requires_approval=["book"])}


def server_log() -> list[dict[str, Any]]:
    folder = os.environ.get("CRASH_TEST_DIR")
    path = Path(folder) / "mcp.jsonl" if folder else Path(LOG[0])
    return read_jsonl(path) if path.exists() else []


def _log_path() -> str:
    folder = os.environ.get("CRASH_TEST_DIR")
    return str(Path(folder) / "mcp.jsonl") if folder else LOG[0]


def set_log(path: str) -> None:
    """(In-process tests) the log of the servers started from now on."""
    LOG[0] = path
    pai_toolset.client.transport.args[1] = path  # type: ignore[attr-defined]
    hooked_toolset.client.transport.args[1] = path  # type: ignore[attr-defined]
    slow_toolset.client.transport.args[1] = path  # type: ignore[attr-defined]
    oai_server.params.args[1] = path
    oai_slow_server.params.args[1] = path


# ---------------------------------------------------------------- PydanticAI


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    return {
        part.tool_name: part.content
        for m in messages
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, ToolReturnPart)
    }


def _pai_model(messages: list[ModelMessage], info: AgentInfo) -> PaiResponse:
    n = sum(isinstance(m, PaiResponse) for m in messages) + 1
    record("model", str(n), tools=sorted(t.name for t in info.function_tools))
    done = _returns(messages)
    if "forecast" not in done:
        return PaiResponse(parts=[ToolCallPart("forecast", {"city": "Oslo"}, "call-1")])
    if "book" not in done:
        return PaiResponse(parts=[ToolCallPart("book", {"city": "Oslo"}, "call-2")])
    return PaiResponse(
        parts=[TextPart(json.dumps({"sky": done["forecast"], "trip": done["book"]}))]
    )


pai_toolset: MCPToolset[Any] = MCPToolset(
    # no kept-alive server between connections: each test's server logs to its own file
    StdioTransport(command=sys.executable, args=[SERVER, _log_path()], keep_alive=False),
    id="weather",
)
pai_agent = Agent(FunctionModel(_pai_model), toolsets=[pai_toolset], name="trip")
pai_trip = DurableAgent(pai_agent, name="mcpa.pai-trip", version="1", mcp_safety=SAFETY)

#: what ``tenant_hook`` saw: (tool, current_idempotency_key())
HOOKED: list[tuple[str, str | None]] = []


async def tenant_hook(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
    """A ``process_tool_call`` adding the run's tenant to each call's ``_meta``."""
    HOOKED.append((name, current_idempotency_key()))
    return await call_tool(name, args, metadata={"tenant": "t-1"})


def _forecast_only(messages: list[ModelMessage], info: AgentInfo) -> PaiResponse:
    done = _returns(messages)
    if "forecast" not in done:
        return PaiResponse(parts=[ToolCallPart("forecast", {"city": "Bergen"}, "call-1")])
    return PaiResponse(parts=[TextPart(json.dumps(done["forecast"]))])


hooked_toolset: MCPToolset[Any] = MCPToolset(
    StdioTransport(command=sys.executable, args=[SERVER, _log_path()], keep_alive=False),
    id="hooked",
    process_tool_call=tenant_hook,
)
hooked_trip = DurableAgent(
    Agent(FunctionModel(_forecast_only), toolsets=[hooked_toolset]),
    name="mcpa.pai-hooked",
    version="1",
)


#: ``book`` under a 2-second read timeout (with ``LOG.slow``, the server holds its answer)
slow_toolset: MCPToolset[Any] = MCPToolset(
    StdioTransport(command=sys.executable, args=[SERVER, _log_path()], keep_alive=False),
    id="slow",
    read_timeout=2.0,
)
slow_trip = DurableAgent(
    Agent(FunctionModel(_pai_model), toolsets=[slow_toolset]),
    name="mcpa.pai-slow",
    version="1",
    mcp_safety={"slow": McpSafety(safety={"forecast": "read_only"})},
)


# ---------------------------------------------------------------- OpenAI Agents


def _said(items: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    calls: dict[str, str] = {}
    for item in items:
        item = item if isinstance(item, dict) else item.model_dump()
        if item.get("type") == "function_call":
            calls[item["call_id"]] = item["name"]
        if item.get("type") == "function_call_output":
            out[calls.get(item["call_id"], "?")] = item["output"]
    return out


def _call(name: str, n: int) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{n}",
        type="function_call",
        name=name,
        arguments=json.dumps({"city": "Oslo"}),
        call_id=f"call_{name}_{n}",
        status="completed",
    )


class TripModel(Model):
    async def get_response(self, system_instructions, input, model_settings, tools, *a, **k):
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        done = _said(items)
        n = len(done) + 1
        record("model", str(n), tools=sorted(t.name for t in tools))
        if "forecast" not in done:
            output: Any = _call("forecast", 1)
        elif "book" not in done:
            output = _call("book", 2)
        else:
            output = ResponseOutputMessage(
                id="msg_1",
                type="message",
                role="assistant",
                status="completed",
                content=[
                    ResponseOutputText(type="output_text", text=json.dumps(done), annotations=[])
                ],
            )
        return ModelResponse(output=[output], usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class TripProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return TripModel()


oai_server = MCPServerStdio(
    params={"command": sys.executable, "args": [SERVER, _log_path()]},
    name="weather",
    cache_tools_list=False,
)
oai_agent = OaiAgent(name="Trip", instructions="Plan a trip.", mcp_servers=[oai_server])
oai_trip = register(
    oai_agent,
    name="mcpa.oai-trip",
    run_config=RunConfig(model_provider=TripProvider(), tracing_disabled=True),
    mcp_safety=SAFETY,
)

#: ``book`` under a 2-second session timeout (with ``LOG.slow``, the server holds its answer)
oai_slow_server = MCPServerStdio(
    params={"command": sys.executable, "args": [SERVER, _log_path()]},
    name="slow",
    cache_tools_list=False,
    client_session_timeout_seconds=2.0,
)
oai_slow_trip = register(
    OaiAgent(name="Trip", instructions="Plan a trip.", mcp_servers=[oai_slow_server]),
    name="mcpa.oai-slow",
    run_config=RunConfig(model_provider=TripProvider(), tracing_disabled=True),
    mcp_safety={"slow": McpSafety(safety={"forecast": "read_only"})},
)
