"""``durable_llm``: the scripted model behind ``ctx.llm`` -- replies, tool calls, a
stream, provider failures classified as in production, and the requests it was sent."""

from __future__ import annotations

import pytest

from durable.models import RunStatus, Step, StepAttempt, StreamEvent
from tests.durable.testing import kit_workflows as kw  # noqa: F401 - registers kit.chat


def test_replies_come_in_order_and_requests_name_their_run(durable_env, durable_llm):
    durable_llm.reply(tool_calls=[{"name": "refund", "arguments": {"amount": 5}}])
    durable_llm.reply("second")
    first = durable_env.run(durable_env.start("kit.chat", {"ask": "one"}))
    second = durable_env.run(durable_env.start("kit.chat", {"ask": "two"}))

    assert first.output_value() == {"content": None, "calls": ["refund"]}
    assert second.output_value() == {"content": "second", "calls": []}
    [asked] = durable_llm.requests_of(first.id)
    assert asked.messages == [{"role": "user", "content": "one"}]
    assert (asked.step_id, asked.stream) == ("llm", False)
    step = Step.objects.get(run=second, step_id="llm")
    assert step.output_value()["scripted"] is True
    assert step.output_value()["usage"]["total_tokens"] == 15


def test_a_recorded_reply_is_not_asked_again_after_a_crash(durable_env, durable_llm):
    durable_llm.reply("once")
    durable_env.crash_at("llm", "after_checkpoint")
    run = durable_env.run(durable_env.start("kit.chat", {"ask": "hi"}))
    assert run.output_value() == {"content": "once", "calls": []}
    assert len(durable_llm.requests) == 1 and len(durable_env.crashes) == 1


def test_a_streamed_reply_reaches_the_runs_stream(durable_env, durable_llm):
    durable_llm.reply("three little words")
    run = durable_env.run(durable_env.start("kit.chat", {"ask": "hi", "stream": True}))

    assert run.output_value() == {"content": "three little words", "calls": []}
    assert durable_llm.requests[0].stream
    tokens = StreamEvent.objects.filter(run=run, kind="token").order_by("seq")
    assert "".join(e.data["delta"] for e in tokens) == "three little words"


def test_a_429_is_retried_after_its_retry_after_without_sleeping(durable_env, durable_llm):
    durable_llm.fail(429, retry_after=30).reply("after the limit")
    run = durable_env.run(durable_env.start("kit.chat", {"ask": "hi"}))

    assert run.status == RunStatus.SUCCEEDED, run.error
    [failed] = StepAttempt.objects.filter(run=run)
    assert failed.retry_delay >= 30 and "429" in failed.message
    assert len(durable_llm.requests) == 2


def test_a_400_goes_back_to_the_agent_and_a_401_fails_the_run(durable_env, durable_llm):
    durable_llm.fail(400)
    recoverable = durable_env.run(durable_env.start("kit.chat", {"ask": "hi"}))
    assert recoverable.output_value() == {"recoverable": "BadRequestError"}

    durable_llm.fail(401)
    refused = durable_env.run(durable_env.start("kit.chat", {"ask": "hi"}))
    assert refused.status == RunStatus.FAILED
    assert refused.error["type"] == "AuthenticationError"


def test_a_responder_answers_once_the_queue_is_empty_and_then_the_script_ends(
    durable_env, durable_llm
):
    durable_llm.respond(lambda request: f"echo: {request.last_message['content']}")
    run = durable_env.run(durable_env.start("kit.chat", {"ask": "ping"}))
    assert run.output_value()["content"] == "echo: ping"

    durable_llm.respond(lambda request: None)  # nothing more to say
    ended = durable_env.run(durable_env.start("kit.chat", {"ask": "more"}))
    assert ended.status == RunStatus.FAILED
    assert ended.error["type"] == "ScriptExhausted"
    assert "durable_llm.reply" in ended.error["message"]


@pytest.mark.parametrize("bad", [3, ["a list"]])
def test_a_reply_that_is_neither_text_nor_a_dict_is_a_type_error(durable_env, durable_llm, bad):
    durable_llm.respond(lambda request: bad)
    run = durable_env.run(durable_env.start("kit.chat", {"ask": "x"}))
    assert run.status == RunStatus.FAILED and run.error["type"] == "TypeError"
