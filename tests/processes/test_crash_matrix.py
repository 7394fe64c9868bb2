"""Crash matrix: SIGKILL a real worker at every step of the reference agent, restart.

The reference agent (``tests/crash_workflows.py``: plan -> kb.search -> tickets.create
-> payments.refund -> email.send -> summary) runs once uninterrupted; then, for every
step x {before, after_effect}, worker A kills itself there, worker B takes over after
the lease expires, and the run must end exactly as the uninterrupted one: the same
output, the same external effects (one ticket, one refund, one email), no checkpointed
step run again, and the lost try recorded as ``worker_lost``.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

import durable
from durable.models import AttemptOutcome, Operation, OperationStatus, Run, RunStatus, StepAttempt
from tests import crash_workflows as cw
from tests.harness import wait_for_run

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(90),
]

CASES = [(step, "before") for step in cw.AGENT_STEPS] + [
    (step, "after_effect") for step in cw.AGENT_EFFECT_STEPS
]

#: the uninterrupted run's observations, filled by the first test that needs them
_BASELINE: dict[str, object] = {}


def normalised_effects(effects: list[dict], run_id: str) -> list[tuple]:
    """``(service, key with the run id replaced, params, result)`` in the order made."""
    return [
        (e["service"], e["key"].replace(run_id, "<run>"), e["params"], e["result"])
        for e in effects
        if e["key"].startswith(f"{run_id}:")
    ]


def step_counts(invocations: list[dict], run_id: str, kind: str = "step") -> Counter:
    return Counter(i["step"] for i in invocations if i["run"] == run_id and i["kind"] == kind)


def run_uninterrupted(workers, folder) -> dict[str, object]:
    folder.mkdir(exist_ok=True)
    worker = workers.start(crash_dir=folder)
    run = durable.start("crash.support_agent", cw.AGENT_INPUT)
    run = wait_for_run(run.id, timeout=40)
    assert run.status == RunStatus.SUCCEEDED, run.error
    worker.kill()
    effects = cw.read_jsonl(folder / "effects.jsonl")
    invocations = cw.read_jsonl(folder / "invocations.jsonl")
    return {
        "output": run.output_value(),
        "effects": normalised_effects(effects, run.id),
        "steps": step_counts(invocations, run.id),
    }


def baseline(workers, tmp_path) -> dict[str, object]:
    if not _BASELINE:
        _BASELINE.update(run_uninterrupted(workers, tmp_path / "baseline"))
    return _BASELINE


def test_uninterrupted_reference_run(workers, tmp_path):
    _BASELINE.clear()
    ref = baseline(workers, tmp_path)
    assert ref["steps"] == Counter({step: 1 for step in cw.AGENT_STEPS})
    assert [(service, key) for service, key, _, _ in ref["effects"]] == [
        ("tickets", "<run>:tickets.create"),
        ("payments", "<run>:payments.refund"),
        ("email", "<run>:email.send"),
    ]
    assert ref["output"]["ticket"] == "T-1" and ref["output"]["email"] == "M-1"
    assert ref["output"]["refund"] == {"refund_id": "R-1", "amount": "19.90"}


@pytest.mark.parametrize(("step", "phase"), CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_crash_and_resume_matches_uninterrupted_run(workers, proc_env, tmp_path, step, phase):
    ref = baseline(workers, tmp_path)
    point = f"{step}:{phase}"

    run = durable.start("crash.support_agent", cw.AGENT_INPUT)
    a = workers.start(crash_at=point)
    code = a.wait_exit(timeout=30)
    assert code == -signal.SIGKILL, f"worker A should have killed itself at {point}"
    assert proc_env.crashed(point)
    assert Run.objects.get(pk=run.id).status == RunStatus.RUNNING  # held by a dead worker

    workers.start()  # worker B: no crash switch
    run = wait_for_run(run.id, timeout=40)
    assert run.status == RunStatus.SUCCEEDED, run.error

    # the same result and the same external effects as without the crash
    assert run.output_value() == ref["output"]
    assert normalised_effects(proc_env.effects(), run.id) == ref["effects"]
    assert Counter(e["service"] for e in proc_env.effects()) == Counter(
        {"tickets": 1, "payments": 1, "email": 1}
    )

    # no checkpointed step ran again; the crashed one ran again only when it had to
    invocations = proc_env.invocations()
    expected = Counter({s: 1 for s in cw.AGENT_STEPS})
    reran = phase == "before" or cw.get_safety(step) == "idempotent_write"
    if reran:
        expected[step] = 2  # the killed try, then the try of worker B
    assert step_counts(invocations, run.id) == expected
    reconciled = Counter({step: 1}) if cw.get_safety(step) == "unsafe_write" else Counter()
    assert step_counts(invocations, run.id, kind="reconcile") == reconciled
    if step != "plan":
        assert step_counts(invocations, run.id)["plan"] == 1, "the LLM call was paid twice"

    # the lost try is on record, and nothing else failed
    attempts = list(StepAttempt.objects.filter(run_id=run.id).select_related("step"))
    assert [(a.step.step_id, a.attempt, a.outcome) for a in attempts] == [
        (step, 1, AttemptOutcome.WORKER_LOST)
    ]
    run = Run.objects.get(pk=run.id)
    assert run.claims == 2 and run.lease_token == "" and run.lease_owner == ""
    assert (
        not Operation.objects.filter(run_id=run.id)
        .exclude(status=OperationStatus.SUCCEEDED)
        .exists()
    )
