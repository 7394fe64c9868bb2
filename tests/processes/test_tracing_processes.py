"""Traces across real processes: a run started in this process, executed by a Celery
worker that exports over OTLP/HTTP (``DURABLE_OTEL=1``) to a collector in the test, and
recovered by a second worker after the first was SIGKILLed -- every execution's spans in
the one trace that ``durable.start`` opened (docs/observability.md#tracing)."""

from __future__ import annotations

import pytest

import durable
from durable.models import RunStatus
from tests import otel_support
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


@pytest.fixture(autouse=True)
def _tracing():
    with otel_support.tracing():
        yield


@pytest.fixture
def collector():
    found = otel_support.Collector()
    yield found
    found.close()


def traced_env(collector) -> dict[str, str]:
    return {
        "DURABLE_OTEL": "1",
        "OTEL_SERVICE_NAME": "durable-test-worker",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export soon after a span ends
    }


def test_a_run_recovered_by_another_worker_after_a_sigkill_stays_in_its_trace(
    workers, proc_env, collector
):
    env = traced_env(collector)
    first = workers.start(**env, wait=True)
    otel_support.EXPORTER.clear()

    run = durable.start("crash.slow_first", {"seconds": 60})
    [start] = [
        s
        for s in otel_support.EXPORTER.get_finished_spans()
        if s.name == "durable.start" and s.attributes["durable.run.id"] == run.id
    ]
    trace_id = format(start.context.trace_id, "032x")
    wait_until(
        lambda: any(i["run"] == run.id for i in proc_env.invocations()),
        30,
        what="the slow step to start in the first worker",
    )
    first.kill()  # SIGKILL: its spans of this execution are never exported
    second = workers.start(**env, wait=True)
    assert wait_for_run(run.id, timeout=60).status == RunStatus.SUCCEEDED

    def executed() -> list[dict]:
        return [
            s
            for s in collector.spans("durable.step")
            if s["trace_id"] == trace_id and s["attributes"].get("durable.step.id") == "after"
        ]

    def run_spans() -> list[dict]:
        return [
            s for s in collector.spans("durable.run") if s["attributes"]["durable.run.id"] == run.id
        ]

    def recovered_ended() -> bool:  # the run span ends after its last step's: a later batch
        return bool(executed()) and any(
            s["attributes"].get("durable.run.status") == "succeeded" for s in run_spans()
        )

    wait_until(recovered_ended, 20, what="the second worker's spans", sweep=False)
    [after] = executed()
    assert after["service"] == "durable-test-worker"
    runs = run_spans()
    for execution in runs:  # every execution that ended: in the start's trace
        assert execution["trace_id"] == trace_id
        assert execution["attributes"]["durable.workflow"] == "crash.slow_first"
        for link in execution["links"]:  # what woke it, when it came from another trace
            assert link["attributes"]["durable.link"] == "dispatcher"
            assert link["trace_id"] != trace_id
    recovered = [s for s in runs if s["attributes"].get("durable.run.status") == "succeeded"]
    assert len(recovered) == 1
    assert after["parent_id"] == recovered[0]["span_id"]
    slow = [
        s
        for s in collector.spans("durable.step")
        if s["attributes"].get("durable.step.id") == "slow" and s["trace_id"] == trace_id
    ]
    assert [s["attributes"]["durable.step.attempt"] for s in slow] == [2]
    assert second.alive()


def test_a_run_a_worker_executes_joins_the_trace_of_the_span_that_started_it(
    workers, proc_env, collector
):
    workers.start(**traced_env(collector), wait=True)
    from opentelemetry import trace

    with trace.get_tracer("test").start_as_current_span("request") as request:
        run = durable.start("crash.abc", {"n": 1})
    trace_id = format(request.get_span_context().trace_id, "032x")
    assert wait_for_run(run.id, timeout=60).status == RunStatus.SUCCEEDED

    def ended() -> list[dict]:
        return [
            s
            for s in collector.spans("durable.run")
            if s["attributes"].get("durable.run.id") == run.id
        ]

    [execution] = wait_until(ended, 20, what="the worker's run span", sweep=False)
    assert execution["trace_id"] == trace_id
    steps = wait_until(
        lambda: [s for s in collector.spans("durable.step") if s["trace_id"] == trace_id],
        20,
        what="the step spans",
        sweep=False,
    )
    assert {s["attributes"]["durable.step.id"] for s in steps} >= {"A", "B", "C"}
    assert all(s["parent_id"] == execution["span_id"] for s in steps)
