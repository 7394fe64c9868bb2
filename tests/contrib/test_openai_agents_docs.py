"""The OpenAI Agents SDK's documentation examples on Durable (``openai_doc_agents``): each
behaves as its page says, and every model call is a step made once.

Pages (github.com/openai/openai-agents-python, ``docs/``): ``guardrails.md`` (input,
output and tool guardrails), ``context.md``, ``human_in_the_loop.md``, ``tools.md``
(agents as tools), ``sessions/index.md``. Where the docs' ``Runner.run`` raises
(a guardrail's tripwire), the Durable run fails with that exception's type.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.contrib.auth.models import Permission, User

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.openai_agents import durable_run
from durable.models import Run, RunStatus, Step
from durable.testing import drive
from tests.contrib import openai_doc_agents as docs
from tests.contrib import pai_agents as pa

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_calls(monkeypatch, tmp_path):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    monkeypatch.setattr(docs, "sessions_db", lambda: str(tmp_path / "sessions.db"))
    pa.CALLS.clear()


def models() -> Counter:
    return Counter(c["name"] for c in pa.CALLS if c["kind"] == "model")


def tools() -> Counter:
    return Counter(c["name"] for c in pa.CALLS if c["kind"] == "tool")


def model_steps(run: Run) -> int:
    return Step.objects.filter(run=run, step_id__regex=r"^model(#\d+)?$").count()


def test_input_guardrail_trips_on_math_homework():
    """guardrails.md, input guardrails: "This should trip the guardrail" -- ``Runner.run``
    raises ``InputGuardrailTripwireTriggered``. The guardrail's own agent is asked once,
    inside the guardrail's step, which records its ``MathHomeworkOutput``."""
    run = drive(durable_run(docs.agent, "Hello, can you help me solve for x: 2x + 3 = 11?").id)
    assert run.status == RunStatus.FAILED
    assert "InputGuardrailTripwireTriggered" in str(run.error)
    assert models()["Guardrail check"] == 1
    step = Step.objects.get(run=run, step_id="input_guardrail:math_guardrail")
    record = step.output_value()
    assert record["tripwire_triggered"] is True
    assert record["output_info"]["is_math_homework"] is True
    assert record["type"].endswith(":MathHomeworkOutput")
    # the support agent's request ran in parallel (run_in_parallel=True) or was cancelled;
    # either way each one made is a step
    assert models()["Customer support agent"] == model_steps(run)


def test_input_guardrail_lets_a_support_question_through():
    run = drive(durable_run(docs.agent, "Where is my order?").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == "Happy to help with your order."
    assert models() == Counter({"Guardrail check": 1, "Customer support agent": 1})


def test_output_guardrail_trips_on_math_in_the_answer():
    """guardrails.md, output guardrails: the answer includes math, so ``Runner.run`` raises
    ``OutputGuardrailTripwireTriggered``."""
    run = drive(
        durable_run(docs.output_agent, "Hello, can you help me solve for x: 2x + 3 = 11?").id
    )
    assert run.status == RunStatus.FAILED
    assert "OutputGuardrailTripwireTriggered" in str(run.error)
    assert models() == Counter({"Structured support agent": 1, "Output check": 1})
    step = Step.objects.get(run=run, step_id="output_guardrail:math_output_guardrail")
    assert step.output_value()["tripwire_triggered"] is True


@pytest.mark.parametrize(
    ("text", "ran", "seen"),
    [
        ("hello world", 1, "length:11"),
        ("my key is sk-123", 0, "Remove secrets before calling this tool."),
    ],
    ids=["allowed", "secret"],
)
def test_tool_guardrails_allow_or_reject_the_call(text, ran, seen):
    """guardrails.md, tool guardrails: ``block_secrets`` rejects a call whose arguments hold
    a secret (the model gets the message, the tool does not run); otherwise the tool's
    result reaches the model. Both guardrails are steps."""
    run = drive(durable_run(docs.classifier, text).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == f"Classified: {seen}"
    assert tools()["classify_text"] == ran
    block = Step.objects.get(run=run, step_id="tool_input_guardrail:block_secrets")
    assert block.output_value()["behavior"]["type"] == ("allow" if ran else "reject_content")
    redact = Step.objects.filter(run=run, step_id="tool_output_guardrail:redact_output")
    assert redact.count() == ran


def test_context_reaches_the_tool():
    """context.md: the tool reads ``wrapper.context`` -- "The user John is 47 years old"."""
    run = drive(
        durable_run(
            docs.assistant, "What is the age of the user?", context=docs.UserInfo("John", 123)
        ).id
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == "The user John is 47 years old."
    assert run.input_value()["context"] == {"name": "John", "uid": 123}


@pytest.fixture
def alice():
    user = User.objects.create_user("alice", password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "rejected"])
def test_human_in_the_loop_pauses_for_oakland(alice, approve):
    """human_in_the_loop.md: ``needs_oakland_approval`` pauses the run (an interruption)
    for Oakland; approved, the tool runs; rejected, the model gets the rejection."""
    run = drive(durable_run(docs.weather, "What is the temperature in Oakland?").id)
    assert run.status == RunStatus.WAITING, run.error
    req = ApprovalRequest.objects.get(run=run)
    assert req.payload_for_display()["payload"]["arguments"] == {"city": "Oakland"}
    approval_decide(request_id=req.pk, user=alice, approve=approve)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()["final_output"]
    if approve:
        assert out == "The temperature in Oakland is 20° Celsius"
    else:
        assert out == "The call to get_temperature was rejected by alice"
    assert tools()["get_temperature"] == int(approve)
    assert models()["Weather assistant"] == model_steps(run) == 2


def test_a_city_that_needs_no_approval_runs_straight_through():
    run = drive(durable_run(docs.weather, "What is the temperature in Paris?").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert not ApprovalRequest.objects.filter(run=run).exists()


def test_agents_as_tools_record_the_nested_agents_model_calls():
    """tools.md, agents as tools: the orchestrator calls ``translate_to_spanish``; the
    Spanish agent's model call is a step of the run (not hidden inside a tool step)."""
    run = drive(durable_run(docs.orchestrator_agent, "Say 'Hello, how are you?' in Spanish.").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == "In Spanish: Hola, ¿cómo estás?"
    assert models() == Counter({"orchestrator_agent": 2, "Spanish agent": 1})
    assert model_steps(run) == 3
    assert not Step.objects.filter(run=run, step_id="tool:translate_to_spanish").exists()


def test_a_session_remembers_the_previous_turn():
    """sessions/index.md: the second turn remembers the first -- "San Francisco", then
    "California". The session's reads and writes are steps."""
    first = drive(
        durable_run(docs.concise, "What city is the Golden Gate Bridge in?", session_id="c123").id
    )
    assert first.output_value()["final_output"] == "San Francisco"
    second = drive(durable_run(docs.concise, "What state is it in?", session_id="c123").id)
    assert second.status == RunStatus.SUCCEEDED, second.error
    assert second.output_value()["final_output"] == "California"
    steps = set(Step.objects.filter(run=second).values_list("step_id", flat=True))
    assert {"session:get_items", "session:add_items"} <= steps
