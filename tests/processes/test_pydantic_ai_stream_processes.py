"""A DurableAgent that streams, on real workers (docs/streaming.md): a caller follows
the reply with PydanticAI's ``run_stream`` while the worker streams it, and a worker
SIGKILLed mid-stream leaves a partial reply, an ``interrupted`` event and the new try,
with the model request recorded once.

The model is PydanticAI's ``OpenAIChatModel`` against the scripted model
(examples/fake_llm.py, in a thread of the test process), which holds its first stream
after three words (``[fault:stream_hold=3]``) until the test lets it go or kills the
worker: the point where the reader must already have the partial text.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import connection

from durable.models import Run, RunStatus, Step, StreamEvent
from tests.contrib import pai_stream_agents as sa
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.contrib.pai_stream_agents"}
PROMPT = "[fault:stream_hold=3] tell me about otters"
PARTIAL = "(scripted model, no"  # the three words before the hold


def status(run_id: str) -> str:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).get()


def test_a_caller_reads_the_text_with_run_stream_while_the_worker_streams_it(
    workers, proc_env, streaming_llm
):
    workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    seen: list[tuple[str, str, bool]] = []

    async def main():
        async with sa.durable_scripted.run_stream(PROMPT) as response:
            async for text in response.stream_text():
                held = text == PARTIAL and not streaming_llm.release.is_set()
                run_status = await asyncio.to_thread(in_thread, status, response.run_id)
                recorded = await asyncio.to_thread(in_thread, has_steps, response.run_id)
                seen.append((text, run_status, recorded))
                if held:  # the reader has the first words; the model holds the rest
                    streaming_llm.release.set()
            return response.run_id, await response.get_output()

    run_id, output = asyncio.run(main())
    # live: the reader had the first words while the run ran, nothing recorded yet
    assert (PARTIAL, RunStatus.RUNNING, False) in seen
    assert seen[-1][0] == output
    assert output.startswith("(scripted model, no script") and "otters" in output
    assert all(b[0].startswith(a[0]) for a, b in zip(seen, seen[1:], strict=False))
    (step,) = Step.objects.filter(run_id=run_id, step_id__startswith="model")
    assert step.step_id == "model"
    assert len(streaming_llm.received) == 1


def in_thread(fn, *args):
    try:
        return fn(*args)
    finally:
        connection.close()


def has_steps(run_id: str) -> bool:
    return Step.objects.filter(run_id=run_id).exists()


def test_a_worker_killed_mid_stream_the_reader_sees_the_cut_and_the_request_is_recorded_once(
    workers, proc_env, streaming_llm
):
    first = workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    run = sa.durable_scripted.start(PROMPT, stream=True)
    follower = sa.durable_scripted.stream(run.id, timeout=90)
    texts: list[str] = []
    failure: list[BaseException] = []

    def read() -> None:
        try:
            texts.extend(follower.stream_text())
        except BaseException as exc:  # pragma: no cover - reported by the assertion below
            failure.append(exc)
        finally:
            connection.close()

    reader = threading.Thread(target=read, name="reader")
    reader.start()
    wait_until(lambda: PARTIAL in texts, 30, what="the reader to have the first three words")
    workers.kill(first)  # mid-stream: the model has more to say, nothing is recorded
    assert not Step.objects.filter(run_id=run.id).exists()
    workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    reader.join(30)
    assert not reader.is_alive() and not failure, failure

    (step,) = Step.objects.filter(run=run)  # the model request is recorded once
    assert step.step_id == "model"
    output = sa.durable_scripted.decode(run.output_value()).output
    assert len(streaming_llm.received) == 2  # asked again once, after the lost worker
    # the reader: the cut-off text, then the new try's from its start, to the output
    cut = texts.index(PARTIAL) + 1
    # the text started over with the new try: the last is the reply, not the cut-off
    # words followed by it
    assert texts[-1] == output and follower.restarts == 1
    for part in (texts[:cut], texts[cut:]):  # each try's text grows from its own start
        assert all(b.startswith(a) for a, b in zip(part, part[1:], strict=False))

    events = list(StreamEvent.objects.filter(run_id=run.id).order_by("seq"))
    kinds = [e.kind for e in events]
    at = kinds.index("interrupted")
    assert events[at].data["reason"] == "worker_lost"
    assert kinds[0] == "step_started" and "step_ended" not in kinds[:at]
    assert kinds[at + 1] == "step_started" and kinds[-1] == "step_ended"
    assert "".join(e.data["delta"] for e in events[at:] if e.kind == "token") == output
    assert {e.step_id for e in events} == {"model"}
