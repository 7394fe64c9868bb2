"""A worker SIGKILLed in the middle of a streamed model call (docs/streaming.md).


The scripted model (examples/fake_llm.py, in a thread of the test process) holds its
first stream after three words (``[fault:stream_hold=3]``), a point the test controls:
the worker has streamed them and waits for the rest when it is killed. Another worker
takes the run over, asks the model again and records its reply once; the run's stream
shows the three words, an ``interrupted`` event, then the whole reply.
"""

from __future__ import annotations

import pytest

import durable
from durable.models import RunStatus, Step, StreamEvent
from tests import stream_workflows  # noqa: F401  (registers the workflows)
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.stream_workflows"}


def text_of(events) -> str:
    return "".join(e.data["delta"] for e in events if e.kind == "token")


def test_a_worker_killed_mid_stream_the_stream_says_so_and_the_reply_is_recorded_once(
    workers, proc_env, streaming_llm
):
    first = workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    run = durable.start("stream.chat", {"message": "[fault:stream_hold=3] tell me about otters"})

    def partial() -> bool:
        return text_of(StreamEvent.objects.filter(run_id=run.id).order_by("seq")) == (
            "(scripted model, no"
        )

    wait_until(partial, 30, what="the first three words in the run's stream")
    workers.kill(first)  # mid-stream: the model has more to say, nothing is recorded
    assert not Step.objects.filter(run_id=run.id).exists()
    workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error

    (step,) = Step.objects.filter(run=run)  # the model call is recorded once
    reply = run.output_value()
    assert step.kind == "llm" and step.output_value() == reply
    assert (
        reply["content"].startswith("(scripted model, no script") and "otters" in reply["content"]
    )
    assert run.tokens_used == reply["usage"]["total_tokens"]
    assert len(streaming_llm.received) == 2  # asked again once, after the lost worker

    events = list(StreamEvent.objects.filter(run_id=run.id).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    cut = next(i for i, e in enumerate(events) if e.kind == "interrupted")
    before, after = events[:cut], events[cut + 1 :]
    assert before[0].kind == "step_started" and text_of(before) == "(scripted model, no"
    assert "step_ended" not in {e.kind for e in before}
    assert events[cut].data == {
        "reason": "worker_lost",
        "message": "the worker was lost; the call is asked again",
    }
    assert after[0].kind == "step_started" and after[-1].kind == "step_ended"
    assert text_of(after) == reply["content"]
    assert {e.step_id for e in events} == {"llm"}
