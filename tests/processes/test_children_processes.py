"""Child runs across real worker processes: SIGKILL a worker while a child runs a step.

``tests.children.slow_parent`` (``tests/durable/runtime/child_workflows.py``) records a step,
starts ``tests.children.slow_leaf`` and waits for it; the child records a quick step and
then sleeps in a slow one. The step bodies append one line per call to
``$CRASH_TEST_DIR/children_effects.jsonl``, so "ran once" is counted across processes.
Worker A is SIGKILLed inside the child's slow step; worker B recovers the child, whose
end wakes the parent, and both finish with each side effect once (the killed step's
body started twice and finished once).
"""

from __future__ import annotations

from collections import Counter

import pytest

import durable
from durable.models import AttemptOutcome, Run, RunStatus, StepAttempt
from tests import crash_workflows as cw
from tests.durable.runtime import child_workflows  # noqa: F401  (registers the workflows here too)
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.durable.runtime.child_workflows"}


def effects(proc_env) -> Counter:
    return Counter(e["effect"] for e in cw.read_jsonl(proc_env.dir / "children_effects.jsonl"))


def test_worker_killed_inside_a_child_step_then_child_and_parent_finish(workers, proc_env):
    a = workers.start(wait=True, **ENV)
    run = durable.start("tests.children.slow_parent", {"seconds": 4.0, "tag": "x"})
    child_id = f"{run.id}.slow"
    wait_until(lambda: effects(proc_env)["child:slow:started"] == 1, 40, what="the slow step")
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING  # its worker was freed
    assert Run.objects.get(pk=child_id).status == RunStatus.RUNNING
    a.kill()  # SIGKILL inside the child's slow step

    workers.start(**ENV)
    child = wait_for_run(child_id, timeout=60)
    assert child.status == RunStatus.SUCCEEDED, child.error
    parent = wait_for_run(run.id, timeout=60)
    assert parent.status == RunStatus.SUCCEEDED, parent.error
    assert parent.output_value() == {"done": "x"}
    assert child.finished_at <= parent.finished_at
    assert effects(proc_env) == Counter(
        {
            "parent:before": 1,
            "child:first": 1,
            "child:slow:started": 2,  # the killed try and the recovered one
            "child:slow:done": 1,
            "parent:after": 1,
        }
    )
    lost = StepAttempt.objects.filter(run_id=child_id, step__step_id="slow")
    assert [a.outcome for a in lost] == [AttemptOutcome.WORKER_LOST]
    assert list(Run.objects.filter(parent_run=run).values_list("id", flat=True)) == [child_id]
