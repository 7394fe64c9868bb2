"""``Runner.run_streamed`` on a durable OpenAI Agents run (``register(..., stream=True)``),
driven in-process: each model request is a step recording the same response as
unstreamed and writing the run's stream live; a replay writes nothing; the run's items
reach the stream once; ``StreamedRun`` rebuilds the SDK's events from it; the SDK's own
streaming docs examples run as written (``tests/contrib/oai_stream_agents.py``)."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from contextlib import redirect_stdout

import pytest
from agents import ItemHelpers, ModelResponse, Usage
from django.contrib.auth.models import Permission, User
from openai.types.responses import ResponseTextDeltaEvent

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.openai_agents import StreamedRun, durable_run, durable_run_streamed
from durable.contrib.openai_agents._model import _dump
from durable.contrib.openai_agents._stream import Relay, replayed_events
from durable.models import Run, RunStatus, Step, StreamEvent
from durable.testing import drive
from tests.contrib import oai_agents as oa
from tests.contrib import oai_stream_agents as osa
from tests.contrib import pai_agents as pa
from tests.contrib.openai_doc_agents import _call, _text

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_calls(monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    pa.CALLS.clear()
    osa.NESTED.clear()
    osa.CUT_AFTER.clear()


def events(run: Run) -> list[StreamEvent]:
    return list(StreamEvent.objects.filter(run=run).order_by("seq"))


def model_records(run: Run) -> dict[str, dict]:
    steps = Step.objects.filter(run=run, step_id__regex=r"^model(#\d+)?$")
    return {s.step_id: s.output_value() for s in steps}


def approve(run: Run) -> Run:
    alice = User.objects.create_user("alice", password="x")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    request = ApprovalRequest.objects.get(run_id=run.id)
    approval_decide(request_id=request.pk, user=alice, approve=True)
    return drive(run.id)


# --- the mapping -------------------------------------------------------------------------


def test_a_streamed_response_maps_to_the_runs_kinds_and_makes_the_recorded_response():
    usage = Usage(requests=1, input_tokens=3, output_tokens=5, total_tokens=8)
    response = ModelResponse(
        output=[_text("Hello there"), _call("lookup", {"id": 7}, 2)], usage=usage, response_id="r9"
    )
    written: list[tuple[str, dict]] = []
    relay = Relay(lambda kind, data: written.append((str(kind), data)))
    for event in replayed_events(response):
        relay.add(event)
    assert written == [
        ("token", {"delta": "Hello there"}),
        ("tool_call_started", {"index": 1, "id": "call_lookup_2", "name": "lookup"}),
        ("tool_call_delta", {"index": 1, "delta": '{"id": 7}'}),
        (
            "tool_call_ended",
            {"index": 1, "id": "call_lookup_2", "name": "lookup", "arguments": '{"id": 7}'},
        ),
    ]
    # the record a streamed try makes is the one get_response's step makes
    assert _dump(relay.response()) == _dump(response)
    assert relay.ended() == {
        "finish_reason": "completed",
        "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8},
    }


def test_a_stream_without_a_completed_response_fails_the_try():
    relay = Relay(lambda kind, data: None)
    with pytest.raises(Exception, match="did not produce a final response"):
        relay.response()


# --- in the worker -----------------------------------------------------------------------


def test_each_streamed_request_is_a_step_recorded_as_unstreamed_and_a_replay_streams_nothing(
    scripted_llm,
):
    plain = drive(durable_run(oa.triage, "Please refund order B-7").id)
    run = drive(durable_run(osa.stream_triage, "Please refund order B-7").id)
    assert run.status == plain.status == RunStatus.WAITING
    recorded, unstreamed = model_records(run), model_records(plain)
    assert recorded.keys() == unstreamed.keys() == {"model", "model#2", "model#3"}
    for step_id, record in recorded.items():  # the same response, call ids aside
        assert [i["type"] for i in record["output"]] == [
            i["type"] for i in unstreamed[step_id]["output"]
        ]
        assert [i.get("arguments") for i in record["output"]] == [
            i.get("arguments") for i in unstreamed[step_id]["output"]
        ]
        assert record.keys() == unstreamed[step_id].keys()
    before = events(run)
    kinds = Counter(e.kind for e in before)
    assert kinds["step_started"] == kinds["step_ended"] == 3
    assert [e.data["name"] for e in before if e.kind == "tool_call_ended"] == [
        "transfer_to_refunds",
        "lookup_order",
        "refund_order",
    ]
    assert [e.data["agent"] for e in before if e.kind == "agent_updated"] == ["Triage", "Refunds"]

    run = approve(run)  # the execution replays the three recorded requests
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["final_output"] == "Refunded 30 for order B-7."
    after = events(run)
    assert [(e.seq, e.kind, e.step_id) for e in after[: len(before)]] == [
        (e.seq, e.kind, e.step_id) for e in before
    ]
    new = after[len(before) :]
    assert {e.step_id for e in new if e.step_id} == {"model#4"}  # nothing replayed streams
    assert "".join(e.data["delta"] for e in new if e.kind == "token") == (
        "Refunded 30 for order B-7."
    )
    items = [e.data["name"] for e in after if e.kind == "run_item"]
    assert items == [
        "handoff_requested",
        "handoff_occured",
        "tool_called",
        "tool_output",
        "tool_called",
        "tool_output",
        "message_output_created",
    ]
    assert sum(1 for e in scripted_llm.log if e["script"] == "refund-desk") == 3 + 4


def test_a_run_recorded_unstreamed_replays_streamed(scripted_llm):
    """The records are one shape: a run recorded by ``get_response`` finishes under the
    streaming runner, its recorded requests replayed (derived events, none written)."""
    run = drive(durable_run(oa.triage, "Please refund order B-7").id)
    Run.objects.filter(pk=run.id).update(workflow_name="oai.stream-desk")
    run = approve(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [e.step_id for e in events(run) if e.kind == "step_started"] == ["model#4"]


def test_an_agent_tools_on_stream_gets_the_sdks_events_live_and_on_a_replay():
    """``Agent.as_tool(on_stream=...)`` (the SDK's in-run streaming hook): the nested run
    is streamed, each of its requests a step of the run; a replay derives the events
    from the records and writes nothing."""
    run = drive(durable_run(osa.orchestrator, "Jokes?").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert "4 jokes" in run.output_value()["final_output"]
    live = list(osa.NESTED)
    assert ("raw_response_event", "ResponseTextDeltaEvent") in live
    assert ("run_item_stream_event", "RunItemStreamEvent") in live
    deltas = [e for e in live if e[1] == "ResponseTextDeltaEvent"]
    assert len(deltas) > 10  # word by word, as the model streamed it
    assert Counter(c["name"] for c in pa.CALLS if c["kind"] == "model") == Counter(
        {"orchestrator": 2, "joker": 2}
    )
    nested = [e for e in events(run) if e.kind == "step_started"]
    assert [e.step_id for e in nested] == ["model#2", "model#3"]  # the joker's, streamed

    # a replay of the whole run: the records' events, no model asked, nothing written
    osa.NESTED.clear()
    written = len(events(run))
    Run.objects.filter(pk=run.id).update(status=RunStatus.PENDING)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(events(run)) == written
    replayed = list(osa.NESTED)
    assert [e for e in replayed if e[1] == "ResponseTextDeltaEvent"] == [
        ("raw_response_event", "ResponseTextDeltaEvent")
    ]  # the recorded text in one delta
    assert Counter(c["name"] for c in pa.CALLS if c["kind"] == "model")["joker"] == 2


def test_run_streamed_needs_a_streaming_runner():
    with pytest.raises(ValueError, match="does not stream: register it with stream=True"):
        durable_run_streamed(oa.triage, "Hello")


# --- the caller: the SDK's streaming docs, as written -------------------------------------


async def stream_text_main(result) -> None:
    """docs/streaming.md, raw response events: only ``Runner.run_streamed(agent,
    input=...)`` became ``durable_run_streamed(agent, input=...)`` (then driven)."""
    async for event in result.stream_events():
        if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent):
            print(event.data.delta, end="", flush=True)


async def stream_items_main(result) -> None:
    """docs/streaming.md, run item events and agent events, as written there."""
    print("=== Run starting ===")

    async for event in result.stream_events():
        # We'll ignore the raw responses event deltas
        if event.type == "raw_response_event":
            continue
        # When the agent updates, print that
        elif event.type == "agent_updated_stream_event":
            print(f"Agent updated: {event.new_agent.name}")
            continue
        # When items are generated, print them
        elif event.type == "run_item_stream_event":
            if event.item.type == "tool_call_item":
                print("-- Tool was called")
            elif event.item.type == "tool_call_output_item":
                print(f"-- Tool output: {event.item.output}")
            elif event.item.type == "message_output_item":
                print(f"-- Message output:\n {ItemHelpers.text_message_output(event.item)}")
            else:
                pass  # Ignore other event types

    print("=== Run complete ===")


def printed(main, result) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        asyncio.run(main(result))
    return out.getvalue()


def test_docs_stream_text_prints_the_reply_token_by_token():
    result = durable_run_streamed(osa.agent, input="Please tell me 5 jokes.")
    assert isinstance(result, StreamedRun) and not result.is_complete
    drive(result.run_id)
    text = printed(stream_text_main, result)
    assert text.startswith("Sure, here are 5 jokes: 0. Why did joke 0 cross the road?")
    assert result.is_complete and result.final_output == text


def test_docs_stream_items_prints_the_tool_the_output_and_the_message():
    result = durable_run_streamed(osa.items_agent, input="Hello")
    drive(result.run_id)
    text = printed(stream_items_main, result)
    lines = text.splitlines()
    assert lines[:4] == [
        "=== Run starting ===",
        "Agent updated: Joker",
        "-- Tool was called",
        "-- Tool output: 4",
    ]
    assert lines[4] == "-- Message output:"
    assert lines[5].startswith(" Sure, here are 4 jokes:")
    assert lines[-1] == "=== Run complete ===" and len(lines) == 7
    assert result.final_output.startswith("Sure, here are 4 jokes:")
    assert result.current_agent is osa.items_agent  # the registered Agent, by name
    assert [i.type for i in result.new_items] == [
        "tool_call_item",
        "tool_call_output_item",
        "message_output_item",
    ]


def test_the_follower_stops_at_an_approval_and_goes_on_after_it(scripted_llm):
    result = osa.stream_desk.run_streamed("Please refund order B-7")
    run = drive(result.run_id)
    assert run.status == RunStatus.WAITING

    async def names() -> list[str]:
        return [
            getattr(e, "name", e.type)
            async for e in result.stream_events()
            if e.type != "raw_response_event"
        ]

    first = asyncio.run(names())
    assert first[-1] == "tool_called" and not result.is_complete
    approve(run)
    rest = asyncio.run(names())
    assert rest == ["agent_updated_stream_event", "tool_output", "message_output_created"]
    assert result.is_complete and result.final_output == "Refunded 30 for order B-7."


def test_the_follower_raises_the_runs_failure(scripted_llm):
    result = durable_run_streamed(osa.items_agent, input="Hello")
    Run.objects.filter(pk=result.run_id).update(status=RunStatus.FAILED)

    async def read() -> None:
        async for _ in result.stream_events():
            pass

    from durable import RunFailed

    with pytest.raises(RunFailed):
        asyncio.run(read())
    assert result.is_complete and result.final_output is None


@pytest.mark.parametrize("mode", ["immediate", "after_turn"])
def test_the_followers_cancel_cancels_a_run_not_yet_ended_and_ends_the_stream(mode):
    """``cancel()`` as the SDK's (``RunResultStreaming.cancel``): the run is cancelled,
    never executed, and ``stream_events()`` ends without ``RunFailed`` -- the caller
    asked for it."""
    result = durable_run_streamed(osa.agent, input="Please tell me 5 jokes.")
    result.cancel(mode)
    if mode == "immediate":
        assert result.is_complete

    async def read() -> list[object]:
        return [event async for event in result.stream_events()]

    assert asyncio.run(read()) == []
    run = Run.objects.get(pk=result.run_id)
    assert run.status == RunStatus.CANCELLED and not Step.objects.filter(run=run).exists()
    assert result.is_complete and result.final_output is None
    drive(run.id)  # a worker that comes for it later executes nothing
    assert not Step.objects.filter(run=run).exists()


def test_the_followers_cancel_of_an_ended_run_changes_nothing_and_a_bad_mode_is_named():
    result = durable_run_streamed(osa.agent, input="Please tell me 5 jokes.")
    drive(result.run_id)
    with pytest.raises(ValueError, match="mode"):
        result.cancel("now")
    result.cancel("after_turn")
    assert Run.objects.get(pk=result.run_id).status == RunStatus.SUCCEEDED


def test_a_model_that_cannot_stream_fails_the_run_at_once_naming_it_and_the_step():
    run = drive(durable_run(osa.mute, "Is this a refund?").id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "PermanentError"
    assert "step 'model': the model 'CheckerModel' cannot stream" in run.error["message"]
    assert "without stream=True" in run.error["message"]
    (attempts,) = Step.objects.filter(run=run).values_list("attempts", flat=True)
    assert attempts == 1  # refused once, not retried


def test_the_replay_check_replays_a_streamed_run_dry_and_writes_nothing(scripted_llm):
    import json

    from durable.services import export
    from durable.testing import replay

    run = drive(durable_run(osa.stream_triage, "Please refund order B-7").id)
    doc = json.loads(export.to_json(export.export_run(run.id)))
    written = len(events(run))
    # as if a crash lost them: a live execution would write them again
    lost, _ = StreamEvent.objects.filter(run=run, kind="run_item").delete()
    report = replay(doc)
    assert report.compatible, report
    assert report.outcome == "continues" and report.replayed == 5
    assert lost == 5 and len(events(run)) == written - lost  # the dry replay wrote none


# --- in the worker: the SDK's streaming docs as workflow code -----------------------------


def drive_printing(run_id: str) -> tuple[Run, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        run = drive(run_id)
    return run, out.getvalue()


def test_docs_stream_text_as_workflow_code_prints_live_and_replays_the_record():
    import durable

    run, text = drive_printing(
        durable.start("oai.docs.stream-text-in-worker", "Please tell me 5 jokes.").id
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert text.startswith("Sure, here are 5 jokes: 0. Why did joke 0 cross the road?")
    assert "".join(e.data["delta"] for e in events(run) if e.kind == "token") == text
    written = len(events(run))

    # executed again (a replay): the record's text, no model asked, nothing written
    Run.objects.filter(pk=run.id).update(status=RunStatus.PENDING)
    run, again = drive_printing(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert again == text and len(events(run)) == written
    assert Counter(c["name"] for c in pa.CALLS if c["kind"] == "model") == Counter({"joker": 1})


def test_docs_stream_items_as_workflow_code_prints_the_items():
    import durable

    run, text = drive_printing(durable.start("oai.docs.stream-items-in-worker", "Hello").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    lines = text.splitlines()
    assert lines[:4] == [
        "=== Run starting ===",
        "Agent updated: Joker",
        "-- Tool was called",
        "-- Tool output: 4",
    ]
    assert lines[4] == "-- Message output:" and lines[-1] == "=== Run complete ==="
    assert run.output_value().startswith("Sure, here are 4 jokes:")
    steps = list(
        Step.objects.filter(run=run).order_by("position").values_list("step_id", flat=True)
    )
    assert steps == ["model", "tool:how_many_jokes", "model#2"]
    follower = StreamedRun(run.id)  # any run's stream, in the SDK's shapes
    asyncio.run(_drain(follower))
    assert follower.final_output == run.output_value()
    assert [i.type for i in follower.new_items] == [
        "tool_call_item",
        "tool_call_output_item",
        "message_output_item",
    ]


async def _drain(result) -> None:
    async for _ in result.stream_events():
        pass


def test_a_try_cut_mid_stream_is_retried_the_stream_and_the_caller_say_so():
    """A try whose stream fails (a dropped connection) is retried by the step; the run's
    stream has the partial text, ``step_ended`` with the error, ``interrupted`` (failed)
    and the new try; the caller gets ``error`` events, then the whole reply; the
    response is recorded once."""
    from openai.types.responses import ResponseErrorEvent

    osa.CUT_AFTER.append(3)
    result = durable_run_streamed(osa.agent, input="Please tell me 5 jokes.")
    run = drive(result.run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    written = events(run)
    cut = next(i for i, e in enumerate(written) if e.kind == "interrupted")
    assert written[cut].data["reason"] == "failed"
    assert (
        written[cut - 1].kind == "step_ended" and "stream was cut" in written[cut - 1].data["error"]
    )
    assert "".join(e.data["delta"] for e in written[:cut] if e.kind == "token") == "Sure, here are "
    (step,) = Step.objects.filter(run=run)
    assert step.attempts == 2
    reply = run.output_value()["final_output"]
    assert step.output_value()["output"][0]["content"][0]["text"] == reply

    seen = []

    async def read() -> None:
        async for event in result.stream_events():
            seen.append(event)

    asyncio.run(read())
    raw = [e.data for e in seen if e.type == "raw_response_event"]
    errors = [e for e in raw if isinstance(e, ResponseErrorEvent)]
    assert [e.code for e in errors] == ["failed", "failed"]  # the try's end, interrupted
    last = max(i for i, e in enumerate(raw) if isinstance(e, ResponseErrorEvent))
    text = "".join(e.delta for e in raw[last:] if isinstance(e, ResponseTextDeltaEvent))
    assert text == reply == result.final_output
