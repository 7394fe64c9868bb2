"""A held resource is released only when its holder has stopped: a limited call whose
try timed out keeps its concurrency slot (and the execution its lease) until its body
-- or, for an LLM call, the provider's answer -- has ended
(docs/limits.md#a-timed-out-call-keeps-what-it-holds)."""

from __future__ import annotations

import pytest

import durable
from durable.models import AttemptOutcome, LimitSlot, RunStatus, Step, StepAttempt, TraceEvent
from durable.testing import drive
from examples._http import start
from tests.durable.runtime import held_slot_workflows as hw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _provider(monkeypatch):
    monkeypatch.setattr(hw, "PROVIDER", hw.Provider(slow=1.5))
    return hw.PROVIDER


def _events(run_id: str) -> list[tuple[str, str]]:
    return list(TraceEvent.objects.filter(run_id=run_id).values_list("kind", "message"))


def _tries(run_id: str) -> tuple[list[str], int]:
    """The failed tries' outcomes, and the step's tries in all."""
    rows = StepAttempt.objects.filter(run_id=run_id).order_by("attempt")
    return [a.outcome for a in rows], Step.objects.get(run_id=run_id).attempts


def test_s32_a_timed_out_llm_call_keeps_its_slot_until_the_provider_answered(settings, monkeypatch):
    """S32: ``concurrency=1`` for the model; the first try times out after 0.3 s while
    the provider takes 1.5 s; the retry is admitted only once that answer arrived, so
    the provider never serves two requests at once."""
    settings.DURABLE = {**settings.DURABLE, "LLM_LIMITS": {"held-model": {"concurrency": 1}}}
    server = start(hw.llm_router(), "held-llm")
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{server.server_address[1]}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "scripted")
        run = drive(durable.start("held.llm", {}).id)
    finally:
        server.shutdown()
    assert run.status == RunStatus.SUCCEEDED, (run.error, _events(run.id))
    assert run.output_value() == "answered"
    provider = hw.PROVIDER
    assert provider.peak == 1, "the provider served two requests at once"
    assert provider.requests == 2 and provider.ended.is_set()
    assert _tries(run.id) == ([AttemptOutcome.TIMED_OUT], 2)
    assert not LimitSlot.objects.exists()


def test_a_timed_out_tool_keeps_its_concurrency_slot_until_its_body_ended():
    """A tool of ``concurrency=1`` and ``timeout=0.2``: its first body outlives the
    timeout (0.6 s); the retry starts only after that body ended, never beside it."""
    hw.PROVIDER.slow = 0.6
    run = drive(durable.start("held.tool", {}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert hw.PROVIDER.requests == 2
    assert hw.PROVIDER.peak == 1, "two bodies of a concurrency=1 tool ran at once"
    assert _tries(run.id) == ([AttemptOutcome.TIMED_OUT], 2)
    assert not LimitSlot.objects.exists()


@pytest.mark.parametrize("then", ["retry", "fail"])
def test_an_execution_gives_its_lease_back_only_after_its_timed_out_body_ended(then):
    """A step's try times out while its body goes on; the execution then gives the
    lease back (a stored retry, or the run's failure) -- but only once the body ended,
    so no other worker can run the step beside it, and the workflow's
    ``max_concurrent_runs`` slot is not freed while it runs."""
    from durable.worker.engine import execute

    run = durable.start("held.lease", {"then": then})
    execute(run.id, worker_id="held-worker")
    run.refresh_from_db()
    assert run.status == (RunStatus.RETRYING if then == "retry" else RunStatus.FAILED)
    assert run.lease_token == ""
    assert hw.PROVIDER.ended.is_set(), "the lease was given back while the body still ran"
    assert not LimitSlot.objects.exists()
