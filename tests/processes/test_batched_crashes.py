"""Batched checkpoints under SIGKILL: a worker killed inside a batch, at every position.

``crash.batched_chain`` (``tests/batched_crash_workflows.py``) is r0..r3 (read-only,
batched), the unsafe write w, then r4, r5. Worker A kills itself at one point; worker B
takes over once the dead worker is noticed. Then: (a) the write ran only when every
step before it was committed (its body records what it saw), (b) the run ends with the
output of an uninterrupted run and one transfer, (c) exactly the steps a crash there
can lose -- the pending batch and the step in flight -- ran once more, nothing else.
Batches are flushed by size only (a 60 s delay), with ``BATCH_MAX_STEPS`` 32 and 2.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

import durable
from durable.models import Run, RunStatus, Step
from tests import batched_crash_workflows as bcw
from tests import crash_workflows as cw
from tests.harness import wait_for_run

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

SEGMENTS = (("r0", "r1", "r2", "r3"), ("r4", "r5"))
INPUT = {"n": 1}
EXPECTED_OUTPUT = {
    "first": [10, 20, 30, 40],
    "transfer": {"transfer_id": "X-1", "total": 100},
    "after": [40, 50],
}

CASES = [(32, f"r{i}:before") for i in range(6)] + [
    (32, "w:before"),
    (32, "w:after_effect"),
    (32, "chain:before_complete"),
    (2, "r2:before"),
    (2, "r3:before"),
    (2, "r5:before"),
    (2, "chain:before_complete"),
]


def lost_at(point: str, limit: int) -> set[str]:
    """The steps a crash at ``point`` loses: the batch pending there (flushed by size
    every ``limit`` steps of a segment, and always before the write) and the step whose
    body was running."""
    step, _, _ = point.partition(":")
    if step == "w":
        return {"w"} if point == "w:before" else set()
    for segment in SEGMENTS:
        if step in segment:
            j = segment.index(step)
            return set(segment[j - j % limit : j + 1])
    last = SEGMENTS[-1]  # chain:before_complete: the tail of the last segment
    return set(last[len(last) - len(last) % limit :])


def test_the_model_of_lost_steps():
    assert lost_at("r2:before", 32) == {"r0", "r1", "r2"}
    assert lost_at("r3:before", 2) == {"r2", "r3"}
    assert lost_at("chain:before_complete", 32) == {"r4", "r5"}
    assert lost_at("chain:before_complete", 2) == set()


@pytest.mark.parametrize(("limit", "point"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_kill_inside_a_batch_loses_only_what_may_run_again(workers, proc_env, limit, point):
    env = {
        "DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.batched_crash_workflows",
        "DURABLE_BATCH_MAX_STEPS": str(limit),
        "DURABLE_BATCH_MAX_DELAY_MS": "60000",
    }
    run = durable.start("crash.batched_chain", INPUT)
    a = workers.start(crash_at=point, **env)
    assert a.wait_exit(timeout=60) == -signal.SIGKILL, f"worker A should have died at {point}"
    assert proc_env.crashed(point)
    assert Run.objects.get(pk=run.id).status == RunStatus.RUNNING  # held by a dead worker

    workers.start(**env)
    run = wait_for_run(run.id, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, run.error

    # (a) the write ran only once everything before it was committed
    transfers = [e for e in proc_env.effects() if e["service"] == "transfers"]
    assert [e["params"]["durable_before"] for e in transfers] == [[0, 1, 2, 3]]
    # (b) the uninterrupted run's output, the same step ids at the same positions
    assert run.output_value() == EXPECTED_OUTPUT
    steps = list(Step.objects.filter(run=run).order_by("position"))
    assert [(s.position, s.step_id, s.status) for s in steps] == [
        (i, sid, "succeeded") for i, sid in enumerate(bcw.CHAIN)
    ]
    # (c) what the crash could lose ran once more; nothing else did
    lost = lost_at(point, limit)
    calls = Counter(
        i["step"] for i in proc_env.invocations() if i["run"] == run.id and i["kind"] == "step"
    )
    assert calls == Counter({sid: 2 if sid in lost else 1 for sid in bcw.CHAIN}), lost
    reconciles = [i for i in proc_env.invocations() if i["kind"] == "reconcile"]
    assert len(reconciles) == (1 if point.startswith("w:") else 0)
    assert run.claims == 2 and cw.read_jsonl(proc_env.dir / "effects.jsonl")
