"""A reader following a run live while its worker is SIGKILLed mid-stream
(docs/streaming.md#a-worker-lost-mid-stream).

Streams of other tools hung forever, or ended as if the answer were complete, when the
process producing them died: https://github.com/exo-explore/exo/issues/1586,
https://github.com/deeptoai-com/kin/pull/22,
https://github.com/RunanywhereAI/runanywhere-sdks/pull/722. Here a ``durable.stream``
reader that started before the kill must see the cut-off part, the ``interrupted``
event, the whole new reply, each event once, and stop when the run ends.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections

import durable
from durable.models import RunStatus, StreamEvent
from tests import stream_workflows  # noqa: F401  (registers the workflows)
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.stream_workflows"}


def test_a_live_reader_sees_the_cut_the_retry_and_the_end_when_the_worker_dies(
    workers, proc_env, streaming_llm
):
    first = workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    run = durable.start("stream.chat", {"message": "[fault:stream_hold=3] tell me about owls"})
    seen: list[dict] = []
    failure: list[BaseException] = []

    def read() -> None:
        try:
            for event in durable.stream(run.id, poll=0.05, timeout=90):
                seen.append(event)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failure.append(exc)
        finally:
            connections.close_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(
        lambda: (
            "".join(e["data"].get("delta", "") for e in seen if e["kind"] == "token")
            == "(scripted model, no"
        ),
        30,
        what="the reader to have the first three words",
    )
    workers.kill(first)
    workers.start(wait=True, **streaming_llm.env, **WORKER_ENV)
    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    reader.join(30)
    assert not reader.is_alive(), "the reader still follows a run that ended"
    assert not failure, failure

    stored = list(StreamEvent.objects.filter(run_id=run.id).order_by("seq"))
    assert [e["seq"] for e in seen] == [e.seq for e in stored]  # each once, in order
    kinds = [e["kind"] for e in seen]
    cut = kinds.index("interrupted")
    assert seen[cut]["data"]["reason"] == "worker_lost"
    assert kinds[cut + 1] == "step_started" and kinds[-1] == "step_ended"
    after = "".join(e["data"]["delta"] for e in seen[cut:] if e["kind"] == "token")
    assert after == run.output_value()["content"]
