"""``Runner.run_streamed`` on durable OpenAI Agents runs across real worker processes
(docs/streaming.md): a caller follows the run with ``durable_run_streamed`` while a
worker streams it, and a worker SIGKILLed mid-stream is taken over by another.

The scripted model (examples/fake_llm.py, in a thread of the test process) holds the
first stream after three words (``[fault:stream_hold=3]``), a point the test controls.
The reader runs ``StreamedRun.stream_events()`` in a thread of its own, as a caller
outside the worker would.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from openai.types.responses import ResponseErrorEvent, ResponseTextDeltaEvent

from durable.contrib.openai_agents import durable_run_streamed
from durable.models import Run, RunStatus, Step, StreamEvent
from tests.contrib import oai_stream_agents as osa
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.contrib.oai_stream_agents"}
QUESTION = "[fault:stream_hold=3] tell me about otters"


class Reader:
    """``result.stream_events()`` read in a thread: what it yielded so far, in order."""

    def __init__(self, result: Any) -> None:
        self.result = result
        self.events: list[Any] = []
        self.error: BaseException | None = None
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        async def main() -> None:
            async for event in self.result.stream_events():
                self.events.append(event)

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            self.error = exc
        finally:
            from django.db import connections

            connections.close_all()
            self.done.set()

    def raw(self) -> list[Any]:
        return [e.data for e in list(self.events) if e.type == "raw_response_event"]

    def text(self) -> str:
        return "".join(e.delta for e in self.raw() if isinstance(e, ResponseTextDeltaEvent))


def test_a_caller_reads_the_reply_while_the_worker_streams_it(workers, proc_env, streaming_llm):
    workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    result = durable_run_streamed(osa.echo, QUESTION)
    reader = Reader(result)
    # the model holds after three words: the caller has them while the run still runs
    wait_until(lambda: reader.text() == "(scripted model, no", 30, what="three words, live")
    assert Run.objects.get(pk=result.run_id).status == RunStatus.RUNNING
    assert not result.is_complete
    streaming_llm.release.set()
    assert reader.done.wait(60) and reader.error is None, reader.error
    run = Run.objects.get(pk=result.run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert result.is_complete and result.final_output == run.output_value()["final_output"]
    assert reader.text() == result.final_output and "otters" in result.final_output
    kinds = [e.type for e in reader.events]
    assert kinds[0] == "agent_updated_stream_event"
    assert kinds[-1] == "run_item_stream_event"
    assert reader.events[-1].item.type == "message_output_item"
    assert [e.type for e in reader.raw()][0] == "response.created"
    assert [e.type for e in reader.raw()][-1] == "response.completed"


def test_a_worker_killed_mid_stream_the_caller_sees_the_cut_and_the_reply_recorded_once(
    workers, proc_env, streaming_llm
):
    first = workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    result = durable_run_streamed(osa.echo, QUESTION)
    reader = Reader(result)
    wait_until(lambda: reader.text() == "(scripted model, no", 30, what="three words, live")
    workers.kill(first)  # mid-stream: the model has more to say, nothing is recorded
    assert not Step.objects.filter(run_id=result.run_id).exists()
    workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    run = wait_for_run(result.run_id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert reader.done.wait(30) and reader.error is None, reader.error

    (step,) = Step.objects.filter(run=run)  # the model call is recorded once
    assert step.step_id == "model"
    reply = run.output_value()["final_output"]
    assert reply.startswith("(scripted model, no script") and "otters" in reply
    assert len(streaming_llm.received) == 2  # asked again once, after the lost worker

    # the run's stream: the cut try, interrupted, the whole new try; items once
    events = list(StreamEvent.objects.filter(run_id=run.id).order_by("seq"))
    kinds = [e.kind for e in events]
    assert kinds.count("interrupted") == 1 and kinds.count("agent_updated") == 1
    assert kinds.count("run_item") == 1 and kinds[-1] == "run_item"

    # the caller's SDK-shaped stream says the same: the partial text, an error event
    # naming the cut, then response.created of the new try and its whole text
    raw = reader.raw()
    cut = next(i for i, e in enumerate(raw) if isinstance(e, ResponseErrorEvent))
    assert raw[cut].code == "worker_lost"
    before = "".join(e.delta for e in raw[:cut] if isinstance(e, ResponseTextDeltaEvent))
    after = "".join(e.delta for e in raw[cut:] if isinstance(e, ResponseTextDeltaEvent))
    assert before == "(scripted model, no" and after == reply
    assert raw[cut + 1].type == "response.created" and raw[-1].type == "response.completed"
    assert [e.type for e in reader.events].count("agent_updated_stream_event") == 1
    assert result.is_complete and result.final_output == reply
