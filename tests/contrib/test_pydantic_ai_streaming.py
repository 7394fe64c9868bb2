"""A DurableAgent that streams (docs/streaming.md): the run's stream written live, each
model request recorded once in the shape of an unstreamed one, the run's
``event_stream_handler`` handed PydanticAI's own events (live, or derived from the
record on a replay), and a caller following the run in PydanticAI's shapes.

The agents are tests/contrib/pai_stream_agents.py: PydanticAI's "Streaming Events and
Final Output" example (its ``handle_event`` and ``event_stream_handler`` as the page
writes them) ``run_agent.py``'s ``run_stream`` example and ``streamed_user_profile.py``'s
``stream_output``. Driven in-process here; the
worker-process tests (a reader while the reply arrives, a worker killed mid-stream) are
tests/processes/test_pydantic_ai_stream_processes.py.
"""

from __future__ import annotations

import asyncio
import json
from datetime import date
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection
from pydantic_ai import (
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
)
from pydantic_ai.exceptions import UserError

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.pydantic_ai._follow import _Reader
from durable.contrib.pydantic_ai._stream import StreamMapping
from durable.models import RunStatus, Step, StreamEvent
from durable.observability import logcontext
from durable.testing import drive
from tests.contrib import pai_stream_agents as sa

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "What will the weather be like in Paris on Tuesday?"

#: the page's output (run_events.py, all events of the run), its final line left out
PAGE = [
    "[Request] Starting part 0: ToolCallPart(tool_name='weather_forecast', tool_call_id='0001')",
    '[Request] Part 0 args delta: {"location":"Pa',
    '[Request] Part 0 args delta: ris","forecast_',
    '[Request] Part 0 args delta: date":"2030-01-',
    '[Request] Part 0 args delta: 01"}',
    "[Tools] The LLM calls tool='weather_forecast' with "
    'args={"location":"Paris","forecast_date":"2030-01-01"} (tool_call_id=\'0001\')',
    "[Tools] Tool call '0001' returned => The forecast in Paris on 2030-01-01 is 24°C and sunny.",
    "[Request] Starting part 0: TextPart(content='It will be ')",
    "[Result] The model starting producing a final result (tool_name=None)",
    "[Request] Part 0 text delta: 'warm and sunny '",
    "[Request] Part 0 text delta: 'in Paris on '",
    "[Request] Part 0 text delta: 'Tuesday.'",
]
FINAL = "[Result] The model starting producing a final result (tool_name=None)"
ANSWER = "It will be warm and sunny in Paris on Tuesday."
ARGS = '{"location":"Paris","forecast_date":"2030-01-01"}'


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    sa.MODEL_CALLS.clear()
    sa.output_messages.clear()


def events_of(run_id: str) -> list[StreamEvent]:
    return list(StreamEvent.objects.filter(run_id=run_id).order_by("seq"))


def text_of(events, step_id: str) -> str:
    return "".join(e.data["delta"] for e in events if e.kind == "token" and e.step_id == step_id)


def approve(run_id: str) -> None:
    alice, _ = User.objects.get_or_create(username="alice")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    approval_decide(
        request_id=ApprovalRequest.objects.get(run_id=run_id).pk, user=alice, approve=True
    )


def test_pydantic_ais_stream_events_map_to_the_runs_stream_kinds():
    mapping = StreamMapping()
    call = ToolCallPart("weather_forecast", None, tool_call_id="0001")
    got = [
        mapping.events(e)
        for e in [
            PartStartEvent(index=0, part=TextPart("It will ")),
            PartDeltaEvent(index=0, delta=TextPartDelta("be sunny")),
            PartEndEvent(index=0, part=TextPart("It will be sunny")),
            PartStartEvent(index=1, part=call),
            PartDeltaEvent(index=1, delta=ToolCallPartDelta(args_delta='{"location":')),
            PartDeltaEvent(index=1, delta=ToolCallPartDelta(args_delta={"x": 1})),
            PartEndEvent(index=1, part=ToolCallPart("weather_forecast", ARGS, tool_call_id="0001")),
            PartStartEvent(index=2, part=ToolCallPart("lookup", {"id": 7}, tool_call_id="b")),
        ]
    ]
    assert got == [
        [("token", {"delta": "It will "})],
        [("token", {"delta": "be sunny"})],
        [],  # a text part's end says nothing new
        [("tool_call_started", {"index": 0, "id": "0001", "name": "weather_forecast"})],
        [("tool_call_delta", {"index": 0, "delta": '{"location":'})],
        [("tool_call_delta", {"index": 0, "delta": '{"x": 1}'})],
        [
            (
                "tool_call_ended",
                {"index": 0, "id": "0001", "name": "weather_forecast", "arguments": ARGS},
            )
        ],
        [  # the response's second tool call: index 1 (its part is the third)
            ("tool_call_started", {"index": 1, "id": "b", "name": "lookup"}),
            ("tool_call_delta", {"index": 1, "delta": '{"id": 7}'}),
        ],
    ]


def test_the_pages_handler_gets_pydantic_ais_events_live_and_the_run_streams():
    run = drive(sa.durable_weather.start(PROMPT).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sa.output_messages == PAGE  # the page's output, event for event
    assert sa.MODEL_CALLS == ["weather", "weather"]
    assert sa.durable_weather.decode(run.output_value()).output == ANSWER

    events = events_of(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    first = [(e.kind, e.data) for e in events if e.step_id == "model"]
    kinds = [k for k, _ in first]  # the deltas the writer had not committed yet are merged
    assert [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]] == [
        "step_started",
        "tool_call_started",
        "tool_call_delta",
        "tool_call_ended",
        "step_ended",
    ]
    assert first[1][1] == {"index": 0, "id": "0001", "name": "weather_forecast"}
    assert "".join(d["delta"] for k, d in first if k == "tool_call_delta") == ARGS
    assert first[-2][1]["arguments"] == ARGS
    assert first[-1][1]["usage"]["total_tokens"] > 0
    assert text_of(events, "model#2") == ANSWER
    assert {e.step_id for e in events} == {"model", "model#2"}  # tools do not stream


def test_a_replay_hands_the_handler_the_events_of_the_record_and_streams_nothing():
    run = drive(sa.durable_approve.start(PROMPT).id)
    assert run.status == RunStatus.WAITING, run.error
    # the model's events, live (a call needing approval is a final result: DeferredToolRequests)
    assert sa.output_messages == [PAGE[0], FINAL, *PAGE[1:6]]
    streamed = len(events_of(run.id))

    sa.output_messages.clear()
    approve(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sa.MODEL_CALLS == ["weather", "weather"]  # the first request was not asked again
    # the replayed request: its part whole, derived from the record; then live again
    assert sa.output_messages[0] == (
        f"[Request] Starting part 0: ToolCallPart(tool_name='weather_forecast', "
        f"args='{ARGS}', tool_call_id='0001')"
    )
    # the first turn's call (replayed), then the second turn's: approved, it runs
    assert sa.output_messages[1:] == [FINAL, PAGE[5], *PAGE[5:]]
    events = events_of(run.id)
    assert [e.step_id for e in events[:streamed]] == ["model"] * streamed
    assert {e.step_id for e in events[streamed:]} == {"model#2"}  # nothing of the replay


@pytest.mark.parametrize("first", ["streamed", "whole"])
def test_a_run_recorded_streamed_replays_unstreamed_and_the_other_way(monkeypatch, first):
    handler = sa.durable_approve.event_stream_handler
    monkeypatch.setattr(sa.durable_approve, "event_stream_handler", None)
    if first == "streamed":
        monkeypatch.setattr(sa.durable_approve, "event_stream_handler", handler)
    run = drive(sa.durable_approve.start(PROMPT).id)
    assert run.status == RunStatus.WAITING, run.error
    recorded = Step.objects.get(run=run, step_id="model").output_value()
    assert bool(events_of(run.id)) == (first == "streamed")

    # the resume replays the record the other way
    monkeypatch.setattr(sa.durable_approve, "event_stream_handler", None)
    if first == "whole":
        monkeypatch.setattr(sa.durable_approve, "event_stream_handler", handler)
    approve(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sa.MODEL_CALLS == ["weather", "weather"]
    assert sa.durable_approve.decode(run.output_value()).output == ANSWER
    second = Step.objects.get(run=run, step_id="model#2").output_value()
    # one shape, streamed or not: {"response", "stamps"}, the same parts
    assert set(recorded) == set(second) == {"response", "stamps"}
    assert recorded["response"]["parts"][0]["args"] == ARGS


def test_a_run_chooses_a_registered_handler_by_name():
    run = drive(sa.weather_by_name.start(PROMPT, event_stream_handler="page").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sa.output_messages == PAGE
    sa.output_messages.clear()
    run = drive(sa.weather_by_name.start(PROMPT).id)  # no handler: nothing handed, no stream
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sa.output_messages == [] and events_of(run.id) == []


def test_a_handler_that_is_not_registered_is_refused_at_start():
    with pytest.raises(
        ValueError, match=r"not one of the agent's registered handlers \(\['page'\]"
    ):
        sa.weather_by_name.start(PROMPT, event_stream_handler="other")
    with pytest.raises(ValueError, match="register it with DurableAgent"):
        sa.weather_by_name.start(PROMPT, event_stream_handler=sa.handle_event)


def test_run_stream_inside_a_workflow_is_refused_naming_event_stream_handler():
    with logcontext.bound(run_id="r-inside"), pytest.raises(UserError) as refused:
        sa.durable_capital.run_stream_sync("What is the capital of the UK?")
    assert "inside a durable workflow (run r-inside)" in str(refused.value)
    assert "event_stream_handler" in str(refused.value)

    async def main():
        async with sa.durable_capital.run_stream("What is the capital of the UK?"):
            pass  # pragma: no cover

    with logcontext.bound(run_id="r-inside"), pytest.raises(UserError, match="event_stream"):
        asyncio.run(main())


def test_run_stream_sync_follows_the_text_of_the_run():
    result = sa.durable_capital.run_stream_sync("What is the capital of the UK?")
    drive(result.run_id)  # a worker's job; here, before reading: the reader gets the history
    texts = list(result.stream_text())
    assert texts[-1] == "The capital of the UK is London."
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert result.get_output(timeout=5) == "The capital of the UK is London."
    again = sa.durable_capital.stream(result.run_id)  # anyone may follow it, from the start
    assert "".join(again.stream_text(delta=True)) == "The capital of the UK is London."
    assert sa.MODEL_CALLS == ["capital"]


def test_the_page_run_stream_example_async():
    texts: list[str] = []

    def execute(run_id: str) -> None:
        try:
            drive(run_id)
        finally:
            connection.close()

    async def main():
        async with sa.durable_capital.run_stream("What is the capital of the UK?") as response:
            await asyncio.to_thread(execute, response.run_id)
            async for text in response.stream_text():
                texts.append(text)
            return await response.get_output()

    assert asyncio.run(main()) == "The capital of the UK is London."
    assert texts[-1] == "The capital of the UK is London."


def test_the_pages_streamed_user_profile_example_stream_output():
    user_input = (
        "My name is Ben, I was born on January 28th 1990, I like the chain the dog and the pyramid."
    )
    result = sa.durable_profile.run_stream_sync(user_input)
    drive(result.run_id)
    profiles = list(result.stream_output(debounce_by=None))  # as the page's other example
    bio = "Likes the chain the dog and the pyramid"
    assert profiles[-1] == {"name": "Ben", "dob": date(1990, 1, 28), "bio": bio}
    # partial profiles validated as the output tool's arguments arrived, each growing
    assert all(p.get("bio", "") == bio[: len(p.get("bio", ""))] for p in profiles)
    assert result.get_output(timeout=5) == profiles[-1]


def test_at_an_interrupted_event_the_text_starts_over_with_the_new_try():
    reader = _Reader([str])
    stream = [
        {"kind": "step_started", "data": {"model": "m"}},
        {"kind": "token", "data": {"delta": "(scripted model, no"}},
        {"kind": "interrupted", "data": {"reason": "worker_lost", "message": "..."}},
        {"kind": "step_started", "data": {"model": "m"}},
        {"kind": "token", "data": {"delta": "(scripted model, no script"}},
        {"kind": "token", "data": {"delta": " here."}},
        {"kind": "step_ended", "data": {}},
    ]
    got = [value for event in stream for kind, value in reader.feed(event) if kind == "text"]
    assert got == [
        "(scripted model, no",
        "(scripted model, no script",
        "(scripted model, no script here.",
    ]
    assert reader.restarts == 1


def test_a_try_that_fails_mid_stream_is_announced_and_asked_again_recorded_once():
    sa.FAILED_ONCE.clear()
    run = drive(sa.durable_flaky.start("Will it be sunny?").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sa.MODEL_CALLS == ["flaky", "flaky"]
    # the handler saw the failed try's events, then the new try's (each a fresh stream)
    starts = [m for m in sa.output_messages if m.startswith("[Request] Starting")]
    assert starts == ["[Request] Starting part 0: TextPart(content='It will be ')"] * 2
    events = events_of(run.id)
    kinds = [e.kind for e in events]
    assert kinds[:3] == ["step_started", "token", "step_ended"]
    assert "error" in events[2].data and "connection dropped" in events[2].data["error"]
    assert events[3].kind == "interrupted" and events[3].data["reason"] == "failed"
    assert text_of(events[4:], "model") == "It will be sunny."
    assert Step.objects.filter(run=run, step_id="model").count() == 1


def test_a_model_that_cannot_stream_fails_the_run_once_naming_the_model_and_the_way_out():
    run = drive(sa.durable_whole_only.start("Hello", stream=True).id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "PermanentError" and run.error["step_id"] == "model"
    assert "the model 'whole-only' cannot stream" in run.error["message"]
    assert "use a model that streams, or run without them" in run.error["message"]
    assert sa.MODEL_CALLS == []  # refused before any request, and not tried again
    run = drive(sa.durable_whole_only.start("Hello").id)  # unstreamed, it answers
    assert run.status == RunStatus.SUCCEEDED, run.error


def test_the_replay_check_passes_a_streamed_run_and_writes_nothing_to_its_stream():
    run = drive(sa.durable_approve.start(PROMPT).id)
    assert run.status == RunStatus.WAITING, run.error
    streamed = len(events_of(run.id))
    out = StringIO()
    call_command(
        "durable", "replay-check", "--json", "--workflow", "pai-stream.approve", stdout=out
    )
    report = json.loads(out.getvalue())
    assert report["checked"] == 1 and report["diverged"] == 0, report
    assert len(events_of(run.id)) == streamed
    assert sa.MODEL_CALLS == ["weather"]


def test_a_follower_gives_up_after_its_timeout_naming_where_to_go_on():
    run = sa.durable_capital.start("What is the capital of the UK?", stream=True)  # no worker
    follower = sa.durable_capital.stream(run.id, timeout=0.3)
    with pytest.raises(TimeoutError, match=r"after 0.3 s .*seq 0; follow on with after=0"):
        list(follower.stream_text())
    drive(run.id)
    assert list(follower.stream_text())[-1] == "The capital of the UK is London."
