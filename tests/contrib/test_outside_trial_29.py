"""Outside trial 29: failures reported publicly against other durable-execution
integrations of PydanticAI, the OpenAI Agents SDK and LangGraph, replayed on Durable.

Each test names the public report it comes from and asserts what the framework's own
documentation promises. Replays are in-process: an approval's resume executes the run
again from the top (as a worker recovering after a SIGKILL does), so "ran once" across
the resume is "ran once" across a replay. Side effects are counted in
``tests.contrib.pai_agents.CALLS``.
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import pytest
from agents import Agent as OAIAgent
from agents import Model, Usage, function_tool, handoff
from agents import ModelResponse as OAIModelResponse
from django.contrib.auth.models import Permission, User
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt
from pydantic import BaseModel
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    ModelRequest,
    ModelResponse,
    RunContext,
    TextPart,
    ToolCallPart,
    ToolFailed,
    ToolReturn,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.langgraph import graph_workflow
from durable.contrib.openai_agents import durable_run, register
from durable.contrib.pydantic_ai import DurableAgent, StepSettings
from durable.models import RunStatus, Step
from durable.testing import drive
from tests.contrib import pai_agents as pa
from tests.contrib.openai_doc_agents import _call, _items, _text

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    pa.CALLS.clear()
    REFUSALS.clear()


@pytest.fixture
def alice():
    user = User.objects.create_user("alice", password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


def counted(kind: str | None = None) -> Counter:
    return Counter(c["name"] for c in pa.CALLS if kind is None or c["kind"] == kind)


def approve_all(run, user, **kw):
    for req in ApprovalRequest.objects.filter(run=run, status="pending"):
        approval_decide(request_id=req.pk, user=user, approve=True, **kw)
    return drive(run.id)


# ===================================================================== PydanticAI


def _tool_parts(messages, kinds=("tool-return", "retry-prompt")) -> list[Any]:
    return [
        p for m in messages if isinstance(m, ModelRequest) for p in m.parts if p.part_kind in kinds
    ]


def _seen(messages) -> list[list[Any]]:
    """What the model was shown of each tool call, as (tool, outcome, content)."""
    return [[p.tool_name, getattr(p, "outcome", None), p.content] for p in _tool_parts(messages)]


def _then_approval_then_answer(first: list[ToolCallPart]):
    """A model that makes ``first``'s calls, then a call needing approval, then answers
    with what it was shown (JSON) -- so a replay shows a different history as a
    different answer."""

    def model(messages, info: AgentInfo) -> ModelResponse:
        n = sum(isinstance(m, ModelResponse) for m in messages) + 1
        pa.record("model", str(n))
        if n == 1:
            return ModelResponse(parts=list(first))
        if n == 2:
            return ModelResponse(parts=[ToolCallPart("confirm", {"note": "ok"}, "call-confirm")])
        return ModelResponse(parts=[TextPart(json.dumps(_seen(messages), default=str))])

    return model


# --- ToolFailed -------------------------------------------------------------------

failing_agent = Agent(
    FunctionModel(_then_approval_then_answer([ToolCallPart("charge", {"order_id": "A-1"}, "c1")])),
    name="t29-failing",
)


@failing_agent.tool_plain
def charge(order_id: str) -> str:
    """Charge an order (the card is declined: a terminal failure)."""
    pa.record("tool", "charge")
    raise ToolFailed(f"card declined for {order_id}")


@failing_agent.tool_plain(requires_approval=True)
def confirm(note: str) -> str:
    """Confirm (needs approval)."""
    pa.record("tool", "confirm")
    return "confirmed"


durable_failing = DurableAgent(failing_agent, name="t29.pai-toolfailed", version="1")


def test_pai_a_tool_failed_reaches_the_model_once_and_is_not_retried_as_a_step(alice):
    """pydantic/pydantic-ai PR #5585 (``ToolFailed``: "a failed tool result the model
    sees ... does not consume the tool's retry budget") and PR #6640 (DBOS/Prefect: a
    control-flow exception escaping a durable step was retry-classified by the engine,
    which "re-executed the side-effecting call up to max_attempts times"). On Durable the
    tool must run once, its failure reach the model as PydanticAI's failed tool return,
    and the replay after the approval not run it again."""
    run = drive(durable_failing.start("charge A-1").id)
    assert run.status == RunStatus.WAITING, run.error
    assert counted("tool") == Counter({"charge": 1})
    run = approve_all(run, alice)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert counted("tool") == Counter({"charge": 1, "confirm": 1})
    result = durable_failing.decode(run.output_value())
    failed = [p for p in _tool_parts(result.messages) if p.tool_name == "charge"]
    assert len(failed) == 1 and failed[0].outcome == "failed"
    assert failed[0].content == "card declined for A-1"
    assert Step.objects.get(run=run, step_id="tool:charge").attempts == 1


# --- ToolReturn with metadata ---------------------------------------------------------

returning_agent = Agent(
    FunctionModel(_then_approval_then_answer([ToolCallPart("fetch", {"order_id": "A-1"}, "c1")])),
    name="t29-returning",
)


@returning_agent.tool_plain
def fetch(order_id: str) -> ToolReturn:
    """Fetch an order; the CRM's record id is metadata for the application only."""
    pa.record("tool", "fetch")
    return ToolReturn(return_value={"order_id": order_id, "amount": 30}, metadata={"crm": "r-9"})


returning_agent.tool_plain(confirm, requires_approval=True)
durable_returning = DurableAgent(returning_agent, name="t29.pai-toolreturn", version="1")


def test_pai_a_tool_return_keeps_its_metadata_and_the_model_sees_only_its_value(alice):
    """pydantic/pydantic-ai issue #4676 ("ToolReturn.metadata silently dropped by
    TemporalAgent"; fix PR #4746). PydanticAI's docs: ``metadata`` is "not sent to the
    LLM", the model sees ``return_value``. On Durable, across the replay of the
    approval's resume, the ``ToolReturnPart`` must carry the value and the metadata."""
    run = drive(durable_returning.start("fetch A-1").id)
    assert run.status == RunStatus.WAITING, run.error
    run = approve_all(run, alice)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert counted("tool") == Counter({"fetch": 1, "confirm": 1})
    result = durable_returning.decode(run.output_value())
    part = next(p for p in _tool_parts(result.messages) if p.tool_name == "fetch")
    assert part.content == {"order_id": "A-1", "amount": 30}
    assert part.metadata == {"crm": "r-9"}
    # what the model was shown in its last request: the value, not the ToolReturn's fields
    assert json.loads(result.output)[0] == ["fetch", "success", {"order_id": "A-1", "amount": 30}]


# --- deps as a dataclass, sync instructions and output validator ---------------------


@dataclass
class Shop:
    customer: str
    limit: int


def _deps_model(messages, info: AgentInfo) -> ModelResponse:
    n = sum(isinstance(m, ModelResponse) for m in messages) + 1
    pa.record("model", str(n), instructions=info.instructions)
    if n == 1:
        return ModelResponse(parts=[ToolCallPart("pay", {"amount": 40}, "c1")])
    retried = any(
        isinstance(m, ModelResponse) and any(getattr(p, "content", "") == "PAID?" for p in m.parts)
        for m in messages
    )
    text = "paid" if retried else "PAID?"  # the validator asks for a retry once
    return ModelResponse(parts=[TextPart(text)])


#: with an output validator, DeferredToolRequests in its own output type (as PydanticAI's
#: deferred-tools docs write it): PydanticAI refuses a run's output_type otherwise
deps_agent = Agent(
    FunctionModel(_deps_model),
    deps_type=Shop,
    output_type=[str, DeferredToolRequests],
    name="t29-deps",
)


@deps_agent.instructions
def _who(ctx: RunContext[Shop]) -> str:  # sync, as pydantic/pydantic-ai#2805
    return f"The customer is {ctx.deps.customer}."


@deps_agent.tool(requires_approval=True)
def pay(ctx: RunContext[Shop], amount: int) -> str:
    """Pay (needs approval); the limit comes from the deps."""
    pa.record("tool", "pay", deps=type(ctx.deps).__name__)
    return f"paid {min(amount, ctx.deps.limit)} for {ctx.deps.customer}"


@deps_agent.output_validator
def _lowercase(ctx: RunContext[Shop], output: str) -> str:  # sync, as #2805
    from pydantic_ai import ModelRetry

    if output != output.lower():
        raise ModelRetry("answer in lower case")
    return f"{output} ({ctx.deps.customer})"


durable_deps = DurableAgent(deps_agent, name="t29.pai-deps", version="1")


def test_pai_dataclass_deps_reach_sync_instructions_tools_and_validators_after_resume(alice):
    """pydantic/pydantic-ai PR #5900 / issue #5893 (TemporalAgent: dataclass deps arrived
    as a raw dict, "AttributeError: 'dict' object has no attribute ...") and issue #2805
    (sync instructions and output validators stalled a Temporal workflow). The deps are
    the dataclass in the instructions, the tool and the validator, before and after the
    approval's resume."""
    run = drive(durable_deps.start("pay 40", deps=Shop(customer="Ada", limit=25)).id)
    assert run.status == RunStatus.WAITING, run.error
    run = approve_all(run, alice)
    assert run.status == RunStatus.SUCCEEDED, run.error
    result = durable_deps.decode(run.output_value())
    assert result.output == "paid (Ada)"
    assert [c["deps"] for c in pa.CALLS if c["name"] == "pay"] == ["Shop"]
    assert {c["instructions"] for c in pa.CALLS if c["kind"] == "model"} == {"The customer is Ada."}
    assert counted("model") == Counter({"1": 1, "2": 1, "3": 1})
    returned = next(p for p in _tool_parts(result.messages) if p.tool_name == "pay")
    assert returned.content == "paid 25 for Ada"


def test_pai_output_validators_without_deferred_requests_are_refused_when_registered():
    """The same agent without ``DeferredToolRequests`` in its output type: every run
    failed with PydanticAI's "Cannot set a custom run `output_type` when the agent has
    output validators" (DurableAgent added it per run); now registration says what to
    change."""
    agent = Agent(FunctionModel(_deps_model), deps_type=Shop, name="t29-deps-plain")
    agent.output_validator(_lowercase)
    with pytest.raises(ValueError, match="needs DeferredToolRequests in its own output_type"):
        DurableAgent(agent, name="t29.pai-deps-plain", version="1")


# --- a tool whose argument is a model, its arguments edited by the approver ----------


class RefundRequest(BaseModel):
    order_id: str
    amount: int


def _refund_model(messages, info: AgentInfo) -> ModelResponse:
    n = sum(isinstance(m, ModelResponse) for m in messages) + 1
    pa.record("model", str(n))
    if n == 1:
        args = {"request": {"order_id": "A-1", "amount": 30}}
        return ModelResponse(parts=[ToolCallPart("refund_typed", args, "c1")])
    return ModelResponse(parts=[TextPart(json.dumps(_seen(messages), default=str))])


typed_agent = Agent(FunctionModel(_refund_model), name="t29-typed")


@typed_agent.tool_plain(requires_approval=True)
def refund_typed(request: RefundRequest) -> dict[str, Any]:
    """Refund (needs approval); the argument is a model."""
    pa.record("tool", "refund_typed", type=type(request).__name__, amount=request.amount)
    return {"refunded": request.amount}


durable_typed = DurableAgent(typed_agent, name="t29.pai-typed", version="1")


def test_pai_an_edited_model_argument_reaches_the_tool_as_its_type(alice):
    """pydantic/pydantic-ai issue #2666 / PR #2686 ("Properly deserialize complex tool
    arguments with Temporal": a pydantic-model argument arrived as a dict). The approver
    edits the nested argument; the tool receives a ``RefundRequest`` with the edit."""
    run = drive(durable_typed.start("refund A-1").id)
    assert run.status == RunStatus.WAITING, run.error
    req = ApprovalRequest.objects.get(run=run)
    assert req.payload_for_display()["payload"]["params"] == {
        "request": {"order_id": "A-1", "amount": 30}
    }
    approval_decide(
        request_id=req.pk,
        user=alice,
        approve=True,
        edited={"tool": "refund_typed", "params": {"request": {"order_id": "A-1", "amount": 12}}},
    )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    calls = [c for c in pa.CALLS if c["name"] == "refund_typed"]
    assert [(c["type"], c["amount"]) for c in calls] == [("RefundRequest", 12)]


# ================================================================ OpenAI Agents SDK


class Script(Model):
    """Plays each agent by the first line of its instructions (``script:<name>``): the
    function ``SCRIPTS[name](items, tool_names)`` gives the output items."""

    async def get_response(
        self,
        system_instructions,
        input,
        model_settings,
        tools,
        output_schema,
        handoffs,
        tracing,
        **kwargs,
    ) -> OAIModelResponse:
        name = (system_instructions or "").split("\n")[0].removeprefix("script:")
        pa.record("model", name)
        names = [t.name for t in tools] + [h.tool_name for h in handoffs]
        output = SCRIPTS[name](_items(input), names)
        return OAIModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a scripted model: the adapter never streams a model request")


def _outputs(items) -> list[str]:
    return [str(i.get("output")) for i in items if i.get("type") == "function_call_output"]


def _calls(items) -> list[str]:
    return [i.get("name") for i in items if i.get("type") == "function_call"]


@function_tool(needs_approval=True)
def ship(order_id: str) -> str:
    """Ship an order (needs approval)."""
    pa.record("tool", "ship")
    return f"shipped {order_id}"


def _on_handoff(ctx) -> None:
    """The SDK's docs: "useful for things like kicking off some data fetching as soon
    as you know a handoff is being invoked" -- a side effect."""
    pa.record("handoff", "on_handoff")


def _desk(items, names):
    if "transfer_to_shipping" not in _calls(items):
        return [_call("transfer_to_shipping", {}, 1)]
    return [_text("back at the desk")]


def _shipping(items, names):
    if "ship" not in _calls(items):
        return [_call("ship", {"order_id": "S-1"}, 2)]
    return [_text(f"Shipping says: {_outputs(items)[-1]}")]


shipping = OAIAgent(name="Shipping", instructions="script:shipping", model=Script(), tools=[ship])
desk = OAIAgent(
    name="Desk",
    instructions="script:desk",
    model=Script(),
    handoffs=[handoff(shipping, on_handoff=_on_handoff)],
)
register(desk, name="t29.oai-on-handoff", version="1")


def test_oai_a_handoffs_on_handoff_callback_runs_once_across_a_replay(alice):
    """openai/openai-agents-python docs, handoffs.md: ``on_handoff`` is "a callback
    function that executes when the handoff is invoked" (a side effect: "kicking off some
    data fetching"); Durable's docs: each handoff is the step ``handoff:<agent>``, "the
    same agent takes over" on replay. The replay of the approval's resume must not call
    ``on_handoff`` again (cf. temporalio/sdk-python PR #1122: handoffs under a durable
    replay)."""
    run = drive(durable_run(desk, "ship S-1").id)
    assert run.status == RunStatus.WAITING, run.error
    assert counted("handoff") == Counter({"on_handoff": 1})
    run = approve_all(run, alice)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == "Shipping says: shipped S-1"
    assert counted("tool") == Counter({"ship": 1})
    assert counted("handoff") == Counter({"on_handoff": 1})  # not again on the replay


# --- a handoff loop: A -> B -> A ---------------------------------------------------


def _front(items, names):
    calls = _calls(items)
    if "transfer_to_billing" not in calls:
        return [_call("transfer_to_billing", {}, 1)]
    if "ship" not in calls:
        return [_call("ship", {"order_id": "L-1"}, 3)]
    return [_text("front: done")]


def _billing(items, names):
    return [_call("transfer_to_front", {}, 2)]


front = OAIAgent(name="Front", instructions="script:front", model=Script(), tools=[ship])
billing = OAIAgent(name="Billing", instructions="script:billing", model=Script())
front.handoffs = [billing]
billing.handoffs = [front]
register(front, name="t29.oai-loop", version="1")


def test_oai_a_handoff_back_to_an_earlier_agent_keeps_its_model_calls_steps(alice):
    """temporalio/sdk-python PR #1122 ("Fix model replacement on looping handoffs":
    "when a handoff loops back to an earlier agent, it will not have had its model
    replaced, resulting in an attempt to use a standard model rather than the temporal
    wrapper"). Front -> Billing -> Front: every model call, the second Front's too, is a
    step, so the approval's replay asks no model again."""
    run = drive(durable_run(front, "loop").id)
    assert run.status == RunStatus.WAITING, run.error
    before = counted("model")
    assert before == Counter({"front": 2, "billing": 1})
    run = approve_all(run, alice)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == "front: done"
    assert counted("model") == Counter({"front": 3, "billing": 1})
    steps = set(Step.objects.filter(run=run).values_list("step_id", flat=True))
    assert {"handoff:Billing", "handoff:Front", "model#4"} <= steps


# --- an approval inside an agent used as a tool --------------------------------------


def _inner(items, names):
    if "ship" not in _calls(items):
        return [_call("ship", {"order_id": "N-1"}, 1)]
    return [_text(f"inner: {_outputs(items)[-1]}")]


def _outer(items, names):
    if "ask_shipping" not in _calls(items):
        return [_call("ask_shipping", {"input": "ship N-1"}, 2)]
    return [_text(f"outer: {_outputs(items)[-1]}")]


inner = OAIAgent(name="Inner", instructions="script:inner", model=Script(), tools=[ship])
outer = OAIAgent(
    name="Outer",
    instructions="script:outer",
    model=Script(),
    tools=[inner.as_tool(tool_name="ask_shipping", tool_description="Ask shipping.")],
)
register(outer, name="t29.oai-nested-approval", version="1")

SCRIPTS = {
    "desk": _desk,
    "shipping": _shipping,
    "front": _front,
    "billing": _billing,
    "inner": _inner,
    "outer": _outer,
}


def test_oai_an_approval_inside_an_agent_used_as_a_tool_runs_the_tool_once(alice):
    """openai/openai-agents-js issues #243 and #680 ("Nested needsApproval through agents
    as tools do not work": after approving, the nested tool never ran); the Python SDK's
    human_in_the_loop.md surfaces a nested agent's approvals as the outer run's
    interruptions. Durable's docs mark it "untested". Approved in the inbox, the nested
    tool must run once and the outer agent answer with its result."""
    run = drive(durable_run(outer, "ship N-1 via shipping").id)
    assert run.status == RunStatus.WAITING, run.error
    assert ApprovalRequest.objects.filter(run=run, status="pending").count() == 1
    run = approve_all(run, alice)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert counted("tool") == Counter({"ship": 1})
    assert run.output_value()["final_output"] == "outer: inner: shipped N-1"
    # the root cause: a replayed call came back with an unknown extra ``async_`` (its
    # field dumped by name, not by its alias ``async``), which the SDK refuses to copy
    # and which a Responses API request would carry
    assert "async_" not in json.dumps(run.output_value()["items"])


# ======================================================================== LangGraph


class Answers(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answers: Annotated[list[Any], operator.add]
    items: list[str]


def _sub_graph():
    def prepare(state: Answers):
        pa.record("node", "prepare")
        return {"log": ["prepare"]}

    def first(state: Answers):
        pa.record("node", "first")
        return {"answers": [["first", interrupt("first question")]]}

    def second(state: Answers):
        pa.record("node", "second")
        return {"answers": [["second", interrupt("second question")]]}

    sub = StateGraph(Answers)
    sub.add_node("prepare", prepare)
    sub.add_node("first", first)
    sub.add_node("second", second)
    sub.add_edge(START, "prepare")
    sub.add_edge("prepare", "first")
    sub.add_edge("first", "second")
    sub.add_edge("second", END)
    return sub.compile()


def subgraph_graph() -> StateGraph:
    """parent: one node that is a compiled subgraph (prepare -> first -> second, the
    last two each asking a question), then ``done``."""

    def done(state: Answers):
        pa.record("node", "done")
        return {"log": ["done"]}

    g = StateGraph(Answers)
    g.add_node("sub", _sub_graph())
    g.add_node("done", done)
    g.add_edge(START, "sub")
    g.add_edge("sub", "done")
    g.add_edge("done", END)
    return g


graph_workflow("t29.lg-subgraph", "1", subgraph_graph, resume="answer")


def _answer_pending(run, user, value):
    req = ApprovalRequest.objects.get(run=run, status="pending")
    approval_decide(request_id=req.pk, user=user, approve=True, edited={"value": value})
    return drive(run.id)


def test_lg_each_interrupt_of_a_subgraph_gets_its_own_answer_and_earlier_nodes_run_once(
    alice,
):
    """langchain-ai/langgraph issue #2870 ("Resume value get reused when resuming parent
    graph which has subgraph with multiple interrupts") and #4796 ("Subgraph (using
    interrupt) restarts instead of resuming from internal breakpoint"; also #6792).
    LangGraph's docs: a subgraph added as a node resumes at its interrupted node, and
    each ``interrupt()`` returns the resume value given for it."""
    run = drive(durable.start("t29.lg-subgraph", {"log": []}).id)
    assert run.status == RunStatus.WAITING, run.error
    run = _answer_pending(run, alice, "A")
    assert run.status == RunStatus.WAITING, run.error
    run = _answer_pending(run, alice, "B")
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["answers"] == [["first", "A"], ["second", "B"]]
    assert counted("node")["prepare"] == 1  # finished before the interrupt: not again
    assert counted("node")["done"] == 1


def send_graph() -> StateGraph:
    """Send fan-out: one ``review`` branch per item, each asking about its item."""

    def fan_out(state: Answers):
        return [Send("review", {"items": [item]}) for item in state["items"]]

    def review(state: Answers):
        item = state["items"][0]
        pa.record("node", f"review-{item}")
        return {"answers": [[item, interrupt(f"keep {item}?")]]}

    g = StateGraph(Answers)
    g.add_node("review", review)
    g.add_conditional_edges(START, fan_out)
    g.add_edge("review", END)
    return g


graph_workflow("t29.lg-send", "1", send_graph, resume="answer")


def test_lg_interrupts_in_send_branches_each_get_their_own_answer(alice):
    """langchain-ai/langgraph PR #6254 (``test_interrupt_with_send_payloads``: a single
    resume map resumes every Send branch's interrupt) and PR #4406 (resume by interrupt
    id). The three branches ask at once; answered in the inbox in another order, each
    branch gets its own answer."""
    run = drive(durable.start("t29.lg-send", {"items": ["x", "y", "z"]}).id)
    assert run.status == RunStatus.WAITING, run.error
    reqs = list(ApprovalRequest.objects.filter(run=run, status="pending"))
    assert len(reqs) == 3
    by_item = {r.payload_for_display()["payload"]["value"].split()[1][:-1]: r for r in reqs}
    for item in ["z", "x", "y"]:
        approval_decide(
            request_id=by_item[item].pk, user=alice, approve=True, edited={"value": item.upper()}
        )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sorted(run.output_value()["answers"]) == [["x", "X"], ["y", "Y"], ["z", "Z"]]


# ===================================================== a provider's HTTP status on a model call

#: model requests still to fail, each a status (then the model answers)
REFUSALS: list[int] = []


def _provider_model(messages, info: AgentInfo) -> ModelResponse:
    from pydantic_ai.exceptions import ModelHTTPError

    pa.record("model", "provider")
    if REFUSALS:
        status = REFUSALS.pop(0)
        raise ModelHTTPError(status, "gpt-x", {"error": f"status {status}"}, headers={})
    return ModelResponse(parts=[TextPart("answered")])


durable_provider = DurableAgent(
    Agent(FunctionModel(_provider_model), name="t29-provider"),
    name="t29.pai-provider",
    version="1",
    model_step=StepSettings(retry=durable.RetryPolicy(initial_interval=0.01, jitter=False)),
)


@pytest.mark.parametrize(
    ("status", "ends", "requests"),
    [(404, RunStatus.FAILED, 1), (401, RunStatus.FAILED, 1), (429, RunStatus.SUCCEEDED, 2)],
)
def test_pai_a_providers_refusal_fails_at_once_and_a_rate_limit_is_retried(status, ends, requests):
    """temporalio/sdk-python PR #982 (retryability of the model activity by the
    provider's status) and temporalio/samples-python #230 / sdk-python #1177 (a status
    classified the wrong way round); pydantic/pydantic-ai PR #5900 ("the activity retries
    forever, so the workflow hangs instead of failing"). Durable's README: "transient
    ones (429, 503 ...) are retried ..., permanent ones (401, 403, 404) stop the step".
    PydanticAI's ``ModelHTTPError`` carries the status itself (no ``response``): it was
    "an unknown error of a step", a 404 tried three times."""
    REFUSALS[:] = [status]
    run = drive(durable_provider.start("hello").id)
    assert run.status == ends, run.error
    assert counted("model") == Counter({"provider": requests})
    assert Step.objects.get(run=run, step_id="model").attempts == requests
    if ends == RunStatus.FAILED:
        assert run.error["classification"] == "permanent"
        assert f"HTTP {status} is permanent" in run.error["reason"]


class Refusing(Model):
    """A provider that refuses the request (400: the context is too long)."""

    async def get_response(self, *args: Any, **kwargs: Any) -> OAIModelResponse:
        import httpx
        import openai

        pa.record("model", "refusing")
        request = httpx.Request("POST", "https://api.openai.com/v1/responses")
        raise openai.BadRequestError(
            "context_length_exceeded", response=httpx.Response(400, request=request), body=None
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a scripted model: the adapter never streams a model request")


refused = OAIAgent(name="Refused", instructions="script:refused", model=Refusing())
register(refused, name="t29.oai-refused", version="1")


def test_oai_a_refused_model_request_fails_the_run_with_the_providers_message():
    """temporalio/sdk-python PR #982 ("Add exception catching logic to model activity")
    and temporalio/samples-python #230 ("Non retryable OpenAI status code"): a 400 from
    the provider fails the run, once, saying why. On Durable the 400 was recorded as
    "the model can fix it" and the adapter then failed on its own record: "TypeError:
    'ModelRecoverable' object is not subscriptable"."""
    run = drive(durable_run(refused, "a very long prompt").id)
    assert run.status == RunStatus.FAILED
    assert "context_length_exceeded" in run.error["message"], run.error
    assert "not subscriptable" not in run.error["message"]
    assert counted("model") == Counter({"refusing": 1})
