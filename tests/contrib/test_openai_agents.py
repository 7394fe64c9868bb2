"""durable_run: the OpenAI Agents SDK on Durable, driven in-process against the scripted
LLM server (``tests/contrib/oai_agents.py``)."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
from agents import Agent
from django.contrib.auth.models import Permission, User

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.openai_agents import durable_run, retried_by_durable
from durable.models import Run, RunStatus, Step
from durable.testing import drive
from tests.contrib import oai_agents as oa
from tests.contrib import openai_doc_agents  # noqa: F401 (registers oai.docs.*)
from tests.contrib import pai_agents as pa

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_calls(monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    pa.CALLS.clear()
    oa.FLAKY.clear()


@pytest.fixture
def alice():
    user = User.objects.create_user("alice", password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


def tools_run() -> Counter:
    return Counter(c["name"] for c in pa.CALLS)


def model_requests(llm) -> int:
    return sum(1 for e in llm.log if e["script"] == "refund-desk" and e["status"] == 200)


def waiting() -> Run:
    run = drive(durable_run(oa.triage, "Please refund order B-7", started_by="os:requester").id)
    assert run.status == RunStatus.WAITING, run.error
    return run


def test_model_calls_tools_and_the_handoff_are_steps_each_run_once(scripted_llm, alice):
    run = waiting()
    steps = list(
        Step.objects.filter(run=run).order_by("position").values_list("step_id", flat=True)
    )
    assert steps[:5] == ["model", "handoff:Refunds", "model#2", "tool:lookup_order", "model#3"]
    assert model_requests(scripted_llm) == 3 and tools_run() == Counter({"lookup_order": 1})
    req = ApprovalRequest.objects.get(run=run)
    assert "refund_order" in req.title
    # the arguments as the object the model wrote, not its JSON text
    assert req.payload_for_display()["payload"]["arguments"] == {"order_id": "B-7", "amount": 30}
    approval_decide(request_id=req.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    # the resume replayed the three recorded model calls and the lookup
    assert model_requests(scripted_llm) == 4
    assert tools_run() == Counter({"lookup_order": 1, "refund_order": 1})
    refund = next(c for c in pa.CALLS if c["name"] == "refund_order")
    assert refund["key"] == f"{run.id}:tool:refund_order"
    out = run.output_value()
    assert out["final_output"] == "Refunded 30 for order B-7."
    assert out["last_agent"] == "Refunds"


def test_a_rejection_reaches_the_model_through_the_sdks_reject(scripted_llm, alice):
    run = waiting()
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=req.pk, user=alice, approve=False, comment="not eligible")
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert tools_run() == Counter({"lookup_order": 1})
    out = run.output_value()
    message = "The call to refund_order was rejected by alice: not eligible"
    assert out["final_output"] == f"No refund for order B-7. {message}"
    outputs = [i for i in out["items"] if i.get("type") == "function_call_output"]
    assert outputs[-1]["output"] == message


@pytest.mark.parametrize(
    "lost",
    [
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.HTTPStatusError(
            "503",
            request=httpx.Request("POST", "http://payments/v1/refunds"),
            response=httpx.Response(503),
        ),
    ],
    ids=["dropped", "503"],
)
def test_a_tool_failure_that_may_have_written_is_retried_with_its_key_not_shown_to_the_model(
    scripted_llm, lost
):
    # the SDK's default turns any tool exception into "Please try again" for the model,
    # which calls again as a new step, with a new key: a refund whose answer was lost
    # was made twice (found by the chaos audit, examples/chaos_frameworks.py)
    oa.FLAKY[:] = [lost]
    run = drive(durable_run(oa.flaky_refunds, "Please refund order B-7").id)
    assert run.status == RunStatus.WAITING, run.error  # the refund's approval
    lookups = [c for c in pa.CALLS if c["name"] == "lookup_order"]
    assert [c["key"] for c in lookups] == [f"{run.id}:tool:lookup_order"] * 2
    step = Step.objects.get(run=run, step_id="tool:lookup_order")
    assert step.attempts == 2 and '"amount": 30' in step.output_value()
    assert not Step.objects.filter(run=run, step_id="tool:lookup_order#2").exists()


def _unavailable() -> httpx.HTTPStatusError:
    response = httpx.Response(503, request=httpx.Request("POST", "http://payments/v1/refunds"))
    return httpx.HTTPStatusError("503", request=response.request, response=response)


@pytest.mark.parametrize(("failures", "ends"), [(4, RunStatus.WAITING), (5, RunStatus.FAILED)])
def test_tool_retry_is_the_policy_of_the_function_tools_steps(scripted_llm, failures, ends):
    """Found by the 1,000-run chaos audit: a function tool's step had the default step
    policy (3 attempts), so three 429s in a row from a service failed the run, while the
    same tool as a Durable tool (5-8 attempts) went on. ``tool_retry`` sets it: five
    attempts, every one with the step's key."""
    oa.FLAKY[:] = [_unavailable() for _ in range(failures)]
    run = drive(durable_run(oa.patient_refunds, "Please refund order B-7").id)
    assert run.status == ends, run.error
    lookups = [c for c in pa.CALLS if c["name"] == "lookup_order"]
    assert [c["key"] for c in lookups] == [f"{run.id}:tool:lookup_order"] * 5
    step = Step.objects.get(run=run, step_id="tool:lookup_order")
    assert step.attempts == 5


def test_a_tool_error_that_did_not_write_still_reaches_the_model(scripted_llm):
    oa.FLAKY[:] = [ValueError("order B-7 is archived")]
    run = drive(durable_run(oa.flaky_refunds, "Please refund order B-7").id)
    assert len([c for c in pa.CALLS if c["name"] == "lookup_order"]) == 1
    step = Step.objects.get(run=run, step_id="tool:lookup_order")
    assert step.attempts == 1 and "An error occurred" in step.output_value()  # the SDK's
    assert retried_by_durable(httpx.ReadTimeout("read timed out"))
    refused = httpx.Response(400, request=httpx.Request("POST", "http://payments/v1/refunds"))
    assert not retried_by_durable(
        httpx.HTTPStatusError("400", request=refused.request, response=refused)
    )


def test_an_unregistered_agent_cannot_be_run():
    with pytest.raises(LookupError, match="not registered"):
        durable_run(Agent(name="stray"), "hi")


def guardrail_calls() -> Counter:
    return Counter(c["name"] for c in pa.CALLS if c["kind"] == "guardrail")


def checker_requests(llm) -> int:
    return sum(1 for c in pa.CALLS if c == {"kind": "model", "name": "checker"})


def test_guardrails_are_steps_a_replay_does_not_run_again(scripted_llm, alice):
    """The bug of issue 29: an input guardrail ran again on every replay, so an
    agent-backed one called its model again, unrecorded. Now each guardrail is a step
    recording its ``GuardrailFunctionOutput``: the approval's resume replays it."""
    run = drive(durable_run(oa.guarded_refunds, "Please refund order B-7").id)
    assert run.status == RunStatus.WAITING, run.error
    assert guardrail_calls() == Counter({"refund_check": 1}) and checker_requests(scripted_llm) == 1
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=req.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    # the resume replayed the guardrail: neither it nor its model ran again
    assert guardrail_calls() == Counter({"refund_check": 1, "no_card_numbers": 1})
    assert checker_requests(scripted_llm) == 1
    step = Step.objects.get(run=run, step_id="input_guardrail:refund_check")
    assert step.output_value()["tripwire_triggered"] is False
    assert step.output_value()["output_info"] == {"checker": "yes"}
    assert (
        Step.objects.get(run=run, step_id="output_guardrail:no_card_numbers").output_value()[
            "tripwire_triggered"
        ]
        is False
    )


def test_an_approver_edits_the_arguments_as_an_object_and_the_tool_receives_them(
    scripted_llm, alice
):
    run = drive(durable_run(oa.flaky_refunds, "Please refund order B-7").id)
    req = ApprovalRequest.objects.get(run=run)
    assert req.allow_edit
    approval_decide(
        request_id=req.pk,
        user=alice,
        approve=True,
        edited={"tool": "refund_order", "arguments": {"order_id": "B-7", "amount": 20}},
    )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    refund = next(c for c in pa.CALLS if c["name"] == "refund_order")
    assert refund["amount"] == 20  # an int, as the tool's signature says
    outputs = [i for i in run.output_value()["items"] if i.get("type") == "function_call_output"]
    assert json.loads(outputs[-1]["output"]) == {"order_id": "B-7", "refunded": 20}


def test_a_run_configs_tool_error_formatter_words_a_rejection(scripted_llm, alice):
    """The SDK's documented custom rejection text (``RunConfig.tool_error_formatter``)
    reaches the model; Durable's own message no longer overrides it."""
    run = drive(durable_run(oa.formatted_refunds, "Please refund order B-7").id)
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=req.pk, user=alice, approve=False, comment="not eligible")
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    outputs = [i for i in run.output_value()["items"] if i.get("type") == "function_call_output"]
    assert outputs[-1]["output"] == "Refund declined by policy (refund_order)."


def test_a_context_changed_by_a_tool_survives_the_replay_and_hooks_see_the_run(alice):
    """``context=`` (rebuilt as the registered ``context_type``): ``remember`` adds a note
    to it, then ``report`` waits for approval. The resume replays ``remember`` without
    running it, and the context it recorded is the one ``report`` reads. The run's
    ``hooks`` see the tools; a per-run ``run_config`` reaches the model."""
    run = drive(
        durable_run(
            oa.noter,
            "How many notes?",
            context=oa.Notes(user="ada"),
            run_config={"model_settings": {"temperature": 0.25}},
        ).id
    )
    assert run.status == RunStatus.WAITING, run.error
    step = Step.objects.get(run=run, step_id="tool:remember")
    assert step.output_value() == {"output": "noted", "context": {"user": "ada", "count": 1}}
    approval_decide(request_id=ApprovalRequest.objects.get(run=run).pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == "ada has 1 note(s)"
    assert [c["name"] for c in pa.CALLS if c["kind"] == "tool"] == ["remember"]
    assert {c["temperature"] for c in pa.CALLS if c["kind"] == "model"} == {0.25}
    hooks = [c["name"] for c in pa.CALLS if c["kind"] == "hook"]
    assert "tool_start:remember" in hooks and "tool_start:report" in hooks
    with pytest.raises(TypeError, match="unknown run_config settings: temprature"):
        durable_run(oa.noter, "hi", run_config={"temprature": 0})


def test_a_run_started_before_guardrails_were_steps_resumes_as_it_was_recorded(scripted_llm, alice):
    """Its input is the SDK's input alone (no ``{"input": ...}``): its replay must find
    the steps at the positions it recorded them, so its guardrails are not steps (they
    run again, as they did) and an agent used as a tool stays one ``tool:`` step."""
    from durable import start

    run = drive(start("oai.guarded-desk", "Please refund order B-7").id)
    assert run.status == RunStatus.WAITING, run.error
    approval_decide(request_id=ApprovalRequest.objects.get(run=run).pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    steps = set(Step.objects.filter(run=run).values_list("step_id", flat=True))
    assert not {s for s in steps if "guardrail" in s}
    assert guardrail_calls()["refund_check"] == 2  # as before: once per execution
    nested = drive(start("oai.docs.agents-as-tools", "Say 'Hello, how are you?' in Spanish.").id)
    assert nested.status == RunStatus.SUCCEEDED, nested.error
    assert Step.objects.filter(run=nested, step_id="tool:translate_to_spanish").exists()
