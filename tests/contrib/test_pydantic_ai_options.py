"""DurableAgent's run options: ``deps``, ``usage_limits``, ``model_settings``, ``toolsets``
and the step settings of model requests and tool calls, driven in-process.

Each option is stored with the run at ``start`` and given back to every execution of it:
the first, and the resume after an approval (a new execution that replays the first's
steps), so a run resumed on another worker sees the same options.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from pydantic_ai import (
    Agent,
    ModelMessage,
    ModelResponse,
    RunContext,
    TextPart,
    Tool,
    ToolCallPart,
    UsageLimits,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.pydantic_ai import DurableAgent, StepSettings
from durable.models import Run, RunStatus, Step
from durable.testing import drive
from tests.contrib import pai_agents as pa

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[dict[str, Any]] = []


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    SEEN.clear()
    pa.CALLS.clear()
    pa.FLAKY.clear()


def approve_all(run: Run) -> Run:
    alice, _ = User.objects.get_or_create(username="alice")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    for req in ApprovalRequest.objects.filter(run=run, status="pending"):
        approval_decide(request_id=req.pk, user=alice, approve=True)
    return drive(run.id)


# ------------------------------------------------------------------ deps


@dataclasses.dataclass
class Shop:
    customer: str
    discount: Decimal
    opened: datetime
    api_key: str


def _shop_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    system = [p.content for m in messages for p in m.parts if p.part_kind == "system-prompt"]
    SEEN.append({"system": system})
    if not any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(parts=[ToolCallPart("quote", {"amount": 100}, "q-1")])
    return ModelResponse(parts=[TextPart("quoted")])


shop_agent: Agent[Shop, str] = Agent(FunctionModel(_shop_model), deps_type=Shop, name="shop")


@shop_agent.system_prompt
def _who(ctx: RunContext[Shop]) -> str:
    return f"The customer is {ctx.deps.customer}."


@shop_agent.tool(requires_approval=True)
def quote(ctx: RunContext[Shop], amount: int) -> str:
    """Quote a price after the customer's discount (needs approval)."""
    SEEN.append({"deps": ctx.deps})
    return str(Decimal(amount) * (1 - ctx.deps.discount))


durable_shop = DurableAgent(shop_agent, name="pai.shop", version="1")

SHOP = Shop("ada", Decimal("0.15"), datetime(2026, 1, 2, 3, 4, tzinfo=UTC), "sk-live-4242")


def test_deps_are_stored_with_the_run_and_rebuilt_for_the_execution_after_an_approval():
    run = drive(durable_shop.start("quote 100", deps=SHOP).id)
    assert run.status == RunStatus.WAITING, run.error
    # the secret field is stored encrypted, as any value under a secret key
    assert "sk-live-4242" not in Run.objects.get(pk=run.id).input
    run = approve_all(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    # the tool ran in the execution after the approval: the same deps, of the same types
    (tool_deps,) = [s["deps"] for s in SEEN if "deps" in s]
    assert tool_deps == SHOP and isinstance(tool_deps.discount, Decimal)
    assert all(s["system"] == ["The customer is ada."] for s in SEEN if "system" in s)
    result = durable_shop.decode(run.output_value())
    assert result.output == "quoted"
    returns = [p for m in result.messages for p in m.parts if p.part_kind == "tool-return"]
    assert [p.content for p in returns] == ["85.00"]


@dataclasses.dataclass
class Session:
    user: str
    http: httpx.AsyncClient


session_agent: Agent[Session, str] = Agent(
    FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("hi")])),
    deps_type=Session,
)
durable_session = DurableAgent(session_agent, name="pai.session", version="1")


def test_deps_that_cannot_be_stored_are_refused_at_start_naming_the_field():
    before = Run.objects.count()
    with pytest.raises(durable.PayloadError, match=r"deps\.http: a httpx\.AsyncClient") as err:
        durable_session.start("hi", deps=Session("ada", httpx.AsyncClient()))
    assert "deps_factory" in str(err.value)
    assert Run.objects.count() == before  # nothing half-written


FACTORY_CALLS: list[Any] = []


def _session_from(stored: dict[str, Any]) -> Session:
    FACTORY_CALLS.append(stored)
    return Session(stored["user"], httpx.AsyncClient())


def _session_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(parts=[ToolCallPart("whoami", {}, "w-1")])
    return ModelResponse(parts=[TextPart("done")])


factory_agent: Agent[Session, str] = Agent(FunctionModel(_session_model), deps_type=Session)


@factory_agent.tool(requires_approval=True)
def whoami(ctx: RunContext[Session]) -> str:
    """Say who the user is, with a live client (needs approval)."""
    assert isinstance(ctx.deps.http, httpx.AsyncClient) and not ctx.deps.http.is_closed
    return ctx.deps.user


durable_factory = DurableAgent(
    factory_agent, name="pai.session-factory", version="1", deps_factory=_session_from
)


def test_a_deps_factory_builds_unstorable_deps_at_each_execution_from_what_was_stored():
    FACTORY_CALLS.clear()
    run = drive(durable_factory.start("who?", deps={"user": "ada"}).id)
    assert run.status == RunStatus.WAITING, run.error
    run = approve_all(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert FACTORY_CALLS == [{"user": "ada"}, {"user": "ada"}]  # one per execution
    returns = [
        p
        for m in durable_factory.decode(run.output_value()).messages
        for p in m.parts
        if p.part_kind == "tool-return"
    ]
    assert [p.content for p in returns] == ["ada"]


# ------------------------------------------------------------------ usage, settings, toolsets


def test_usage_limits_count_the_whole_run_across_its_approval():
    """The refund agent's run makes two model requests before its approval and one
    after: a limit of two requests stops the third, though it is the new turn's first."""
    run = drive(
        pa.durable_refund_agent.start(
            "refund order A-1", usage_limits=UsageLimits(request_limit=2)
        ).id
    )
    assert run.status == RunStatus.WAITING, run.error
    run = approve_all(run)
    assert run.status == RunStatus.FAILED
    assert "request_limit" in run.error["message"]
    assert "model:3" not in [f"{c['kind']}:{c['name']}" for c in pa.CALLS]


def _settings_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    SEEN.append(
        {
            "settings": dict(info.model_settings or {}),
            "tools": sorted(t.name for t in info.function_tools),
        }
    )
    if "forecast" in SEEN[-1]["tools"] and not any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(parts=[ToolCallPart("forecast", {"city": "Paris"}, "f-1")])
    return ModelResponse(parts=[TextPart("ok")])


weather = FunctionToolset(id="weather")


@weather.tool_plain
def forecast(city: str) -> str:
    """The forecast of a city."""
    return f"sunny in {city}"


settings_agent: Agent[None, str] = Agent(FunctionModel(_settings_model))
durable_settings = DurableAgent(
    settings_agent, name="pai.settings", version="1", toolsets=[weather]
)


def test_model_settings_and_a_registered_toolset_reach_every_request():
    run = drive(
        durable_settings.start(
            "weather?", model_settings={"temperature": 0.2}, toolsets=["weather"]
        ).id
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [s["settings"].get("temperature") for s in SEEN] == [0.2, 0.2]
    assert [s["tools"] for s in SEEN] == [["forecast"], ["forecast"]]
    assert Step.objects.filter(run=run, step_id="tool:forecast").exists()
    # a run without them: neither
    SEEN.clear()
    run = drive(durable_settings.start("weather?").id)
    assert [s["tools"] for s in SEEN] == [[]] and "temperature" not in SEEN[0]["settings"]


def test_unstorable_settings_and_unregistered_toolsets_are_refused_at_start():
    before = Run.objects.count()
    with pytest.raises(durable.PayloadError, match=r"model_settings\['timeout'\]"):
        durable_settings.start("x", model_settings={"timeout": httpx.Timeout(3.0)})
    with pytest.raises(ValueError, match="not one of the agent's registered toolsets"):
        durable_settings.start("x", toolsets=[FunctionToolset(id="other")])
    with pytest.raises(ValueError, match="not one of the agent's registered toolsets"):
        durable_settings.start("x", toolsets=["other"])
    assert Run.objects.count() == before


# ------------------------------------------------------------------ step settings

SLOW: list[float] = []


async def _slow_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    SEEN.append({"request": len(messages)})
    if SLOW:
        await asyncio.sleep(SLOW.pop(0))
    return ModelResponse(parts=[TextPart("done")])


slow_agent: Agent[None, str] = Agent(FunctionModel(_slow_model))
durable_slow = DurableAgent(
    slow_agent,
    name="pai.slow",
    version="1",
    model_step=StepSettings(
        timeout=0.2, retry=durable.RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False)
    ),
)


@pytest.mark.parametrize(("sleeps", "ends"), [([30], RunStatus.SUCCEEDED), ([30, 30], "failed")])
def test_a_model_step_timeout_cancels_the_request_and_retries_it(sleeps, ends):
    SLOW[:] = sleeps
    run = drive(durable_slow.start("hello").id)
    assert run.status == ends, run.error
    step = Step.objects.get(run=run, step_id="model")
    assert step.attempts == 2
    if ends == "failed":
        assert "did not finish within 0.2 s" in run.error["message"]


once = durable.RetryPolicy(max_attempts=1)
patient = durable.RetryPolicy(max_attempts=4, initial_interval=0.01, jitter=False)
metadata_agent: Agent[None, pa.Summary] = Agent(
    FunctionModel(pa._script("refund")),
    output_type=pa.Summary,
    tools=[Tool(pa.flaky_lookup, name="lookup", metadata={"durable": StepSettings(retry=once)})],
)
metadata_agent.tool_plain(pa.refund, requires_approval=True)
durable_metadata = DurableAgent(
    metadata_agent, name="pai.metadata", version="1", tool_step=StepSettings(retry=patient)
)
by_name = DurableAgent(
    metadata_agent,
    name="pai.by-name",
    version="1",
    tool_step=StepSettings(retry=once),
    tool_steps={"lookup": StepSettings(retry=patient)},
)


def _unavailable() -> list[Exception]:
    request = httpx.Request("GET", "http://orders/A-1")
    response = httpx.Response(503, request=request)
    return [httpx.HTTPStatusError("503", request=request, response=response) for _ in range(3)]


@pytest.mark.parametrize(
    ("agent", "attempts", "ends"),
    [(durable_metadata, 1, RunStatus.FAILED), (by_name, 4, RunStatus.WAITING)],
    ids=["tool-metadata-over-tool_step", "tool_steps-by-name-over-tool_step"],
)
def test_per_tool_step_settings(agent, attempts, ends):
    pa.FLAKY[:] = _unavailable()
    run = drive(agent.start("refund order A-1").id)
    assert run.status == ends, run.error
    assert Step.objects.get(run=run, step_id="tool:lookup").attempts == attempts


# ------------------------------------------------------------------ model at run time


def _named(name: str) -> FunctionModel:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        SEEN.append({"model": name})
        return ModelResponse(parts=[TextPart(f"from {name}")])

    return FunctionModel(model)


fast = _named("fast")
chooser_agent: Agent[None, str] = Agent(_named("default"))
durable_chooser = DurableAgent(
    chooser_agent,
    name="pai.chooser",
    version="1",
    models={"fast": fast, "slow": lambda: _named("slow")},
)


def test_a_run_chooses_a_registered_model_by_name_or_instance_or_a_model_name():
    outputs = [
        durable_chooser.decode(drive(durable_chooser.start("hi", **kw).id).output_value()).output
        for kw in ({}, {"model": "fast"}, {"model": fast}, {"model": "slow"})
    ]
    assert outputs == ["from default", "from fast", "from fast", "from slow"]
    run = drive(durable_chooser.start("hi", model="test").id)  # PydanticAI's TestModel
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Run.objects.get(pk=run.id).input_value()["model"] == "test"
    before = Run.objects.count()
    with pytest.raises(ValueError, match="not one of the agent's registered models"):
        durable_chooser.start("hi", model=_named("other"))
    assert Run.objects.count() == before


def test_stored_deps_that_no_longer_fit_the_deps_type_fail_the_run_saying_so(monkeypatch):
    @dataclasses.dataclass
    class Renamed:
        client: str

    run = drive(durable_shop.start("quote 100", deps=SHOP).id)
    assert run.status == RunStatus.WAITING, run.error
    monkeypatch.setattr(shop_agent, "_deps_type", Renamed)  # a deploy changed the type
    run = approve_all(run)
    assert run.status == RunStatus.FAILED
    assert "no longer fit the agent's deps_type" in run.error["message"]
    assert "new workflow version" in run.error["message"]
