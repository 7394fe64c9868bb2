"""Child runs (``ctx.start_child`` / ``ctx.wait_child``), in process.

Runs are driven with ``durable.testing.drive``; :func:`settle` drives a whole tree (the
root and every run whose id starts with the root's) until nothing is due.
"""

from __future__ import annotations

import pytest
from django.db import OperationalError
from django.db.models import Q

import durable
from durable.models import Run, RunStatus, Step, StepKind, TraceEvent, Wait, WaitKind, WaitStatus
from durable.runtime.checkpoint import Checkpoints
from durable.testing import drive
from durable.vocabulary import EventKind
from tests.durable.runtime import child_workflows as cwf

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

DUE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.RETRYING, RunStatus.COMPENSATING)


@pytest.fixture(autouse=True)
def _reset():
    cwf.reset()
    yield
    cwf.reset()


def tree(root_id: str):
    return Run.objects.filter(Q(pk=root_id) | Q(pk__startswith=f"{root_id}.")).order_by("id")


def settle(root_id: str, rounds: int = 30) -> Run:
    """Drive every due run of the tree until none is due; returns the fresh root."""
    for _ in range(rounds):
        due = [r.id for r in tree(root_id) if r.status in DUE]
        if not due:
            break
        for run_id in due:
            drive(run_id)
    return Run.objects.get(pk=root_id)


def test_start_wait_and_result():
    run = durable.start(
        "tests.children.parent", {"items": [{"n": 1, "id": "a"}, {"n": 20, "tag": "b"}]}
    )
    root = settle(run.id)
    assert root.status == RunStatus.SUCCEEDED, root.error
    first, second = f"{run.id}.a", f"{run.id}.tests.children.leaf.1"
    assert root.output_value() == {"total": 42, "children": [first, second]}
    children = Run.objects.filter(parent_run=run).order_by("id")
    assert [c.id for c in children] == sorted([first, second])
    assert all(c.status == RunStatus.SUCCEEDED for c in children)
    starts = Step.objects.filter(run=run, kind=StepKind.CHILD).order_by("position")
    assert [s.step_id for s in starts] == ["child:a", "child:tests.children.leaf"]
    assert [s.output_value()["run_id"] for s in starts] == [first, second]
    waits = Wait.objects.filter(run=run, kind=WaitKind.CHILD).order_by("position")
    assert [w.key for w in waits] == [first, second]
    assert all(w.status == WaitStatus.RESOLVED for w in waits)
    # each side effect once, though the parent replayed its history after every wake
    assert cwf.EFFECTS == {"parent:before": 1, "leaf:1": 1, "leaf:b": 1, "parent:after": 1}
    assert all(s.replay_count >= 1 for s in starts)


def test_a_child_end_wakes_its_parent_in_the_same_transaction():
    run = durable.start("tests.children.parent", {"items": [{"n": 3, "id": "only"}]})
    assert drive(run.id).status == RunStatus.WAITING
    assert Run.objects.get(pk=f"{run.id}.only").status == RunStatus.PENDING
    child = drive(f"{run.id}.only")
    assert child.status == RunStatus.SUCCEEDED
    # woken (and, with Celery, dispatched on that commit) by the child's end
    parent = Run.objects.get(pk=run.id)
    assert parent.status == RunStatus.PENDING
    event = TraceEvent.objects.filter(run=run, kind=EventKind.WAIT_RESOLVED).get()
    assert event.data == {"child": child.id, "status": "succeeded"}
    assert drive(run.id).output_value()["total"] == 6


def test_replay_never_starts_a_second_child():
    run = durable.start("tests.children.parent", {"items": [{"n": 1, "id": "a"}]})
    drive(run.id)
    child = Run.objects.get(pk=f"{run.id}.a")
    # the parent is executed again (as after a lost worker) before the child ran
    Run.objects.filter(pk=run.id).update(status=RunStatus.PENDING)
    assert drive(run.id).status == RunStatus.WAITING
    assert Run.objects.filter(parent_run=run).count() == 1
    assert Run.objects.get(pk=child.id).created_at == child.created_at
    assert settle(run.id).status == RunStatus.SUCCEEDED
    assert cwf.EFFECTS["leaf:1"] == 1


def test_a_fault_between_creating_the_child_and_recording_its_step_creates_one_child(
    monkeypatch,
):
    """The child and the parent's step commit together: a database fault while the step
    is written leaves neither, and the retry creates exactly one child."""
    real = Checkpoints.save_step_txn
    faults = []

    def failing(self, rec, pos, **fields):
        if fields.get("kind") == StepKind.CHILD and not faults:
            assert Run.objects.filter(pk=f"{self.cursor.run_id}.a").exists()  # created, uncommitted
            faults.append(pos)
            raise OperationalError("server closed the connection unexpectedly (injected)")
        return real(self, rec, pos, **fields)

    monkeypatch.setattr(Checkpoints, "save_step_txn", failing)
    run = durable.start("tests.children.parent", {"items": [{"n": 4, "id": "a"}]})
    root = settle(run.id)
    assert faults, "the fault was not injected"
    assert root.status == RunStatus.SUCCEEDED, root.error
    assert Run.objects.filter(parent_run=run).count() == 1
    assert cwf.EFFECTS["leaf:4"] == 1
    assert TraceEvent.objects.filter(run=run, kind=EventKind.DB_FAULT).exists()


def test_a_child_that_exists_already_with_the_same_input_is_adopted_not_duplicated():
    """``durable.start`` is idempotent on the child's run id with the same input."""
    run = durable.start("tests.children.parent", {"items": [{"n": 2, "id": "a"}]})
    early = durable.start("tests.children.leaf", {"n": 2, "id": "a"}, run_id=f"{run.id}.a")
    Run.objects.filter(pk=early.id).update(parent_run=run)
    root = settle(run.id)
    assert root.status == RunStatus.SUCCEEDED, root.error
    assert list(Run.objects.filter(parent_run=run).values_list("id", flat=True)) == [early.id]
    assert cwf.EFFECTS["leaf:2"] == 1


def test_a_run_id_taken_by_a_run_that_is_no_child_is_refused_clearly():
    run = durable.start("tests.children.parent", {"items": [{"n": 2, "id": "a"}]})
    durable.start("tests.children.leaf", {"n": 2, "id": "a"}, run_id=f"{run.id}.a")
    root = settle(run.id)
    assert root.status == RunStatus.FAILED
    assert "is taken by a run that is not a child" in root.error["message"]
    assert not Step.objects.filter(run=run, kind=StepKind.CHILD).exists()


@pytest.mark.parametrize(
    ("items", "run_id", "message"),
    [
        ([{"n": 1, "id": "a.b"}], None, "child_id 'a.b' is not valid"),
        ([{"n": 1, "id": "a"}, {"n": 2, "id": "a"}], None, "is used twice"),
        ([{"n": 1, "id": "x" * 30}], "p" * 100, "over 128"),
    ],
)
def test_bad_child_ids_fail_the_parent_with_a_clear_error(items, run_id, message):
    run = durable.start("tests.children.parent", {"items": items}, run_id=run_id)
    root = settle(run.id)
    assert root.status == RunStatus.FAILED
    assert message in root.error["message"], root.error
    assert Run.objects.filter(parent_run=run).count() == (1 if "twice" in message else 0)


def test_child_failure_is_caught_by_the_parent():
    run = durable.start("tests.children.catching", {})
    root = settle(run.id)
    assert root.status == RunStatus.SUCCEEDED, root.error
    child_id = f"{run.id}.tests.children.leaf.1"
    assert root.output_value() == {"caught": "failed", "child": child_id, "type": "PermanentError"}
    assert Run.objects.get(pk=child_id).status == RunStatus.FAILED


def test_uncaught_child_failure_fails_the_parent():
    run = durable.start("tests.children.uncaught", {})
    root = settle(run.id)
    assert root.status == RunStatus.FAILED
    assert root.error["type"] == "ChildFailed"
    assert f"child run {run.id}.bad ended failed" in root.error["message"]
    assert "leaf 1 refuses" in root.error["message"]
    # and why the child's failure was final (S35: a failure says why wherever it shows)
    assert root.error["message"].endswith(
        "(failed for good: the workflow code raised it outside a step; workflow code is not "
        "retried)"
    )


def three_levels(**root) -> str:
    data = {"middle": {"leaf": {"n": 7, "wait_signal": True}}, **root}
    run = durable.start("tests.children.grand", data)
    settle(run.id)
    assert [r.status for r in tree(run.id)] == [RunStatus.WAITING] * 3
    return run.id


def test_cancelling_the_parent_cancels_children_and_grandchildren():
    root_id = three_levels()
    durable.cancel(root_id, by="alice", reason="not needed")
    runs = {r.id: r for r in tree(root_id)}
    assert [r.status for r in runs.values()] == [RunStatus.CANCELLED] * 3
    leaf = runs[f"{root_id}.mid.leaf"]
    assert f"its parent run {root_id}.mid was cancelled" in leaf.error["message"]
    assert not Wait.objects.filter(run_id__in=runs, status=WaitStatus.PENDING).exists()
    settle(root_id)  # nothing runs again
    assert cwf.EFFECTS["leaf:7"] == 1


def test_cancelling_a_child_reaches_its_parent_as_a_failure():
    root_id = three_levels()
    durable.cancel(f"{root_id}.mid.leaf", by="bob")
    root = settle(root_id)
    mid = Run.objects.get(pk=f"{root_id}.mid")
    assert mid.status == RunStatus.FAILED and mid.error["type"] == "ChildFailed"
    assert "ended cancelled" in mid.error["message"]
    assert (
        root.status == RunStatus.FAILED and f"{root_id}.mid ended failed" in root.error["message"]
    )


def test_cancelling_a_finished_parent_leaves_its_children():
    run = durable.start("tests.children.parent", {"items": [{"n": 1, "id": "a"}]})
    settle(run.id)
    with pytest.raises(durable.IllegalTransition):
        durable.cancel(run.id)
    assert Run.objects.get(pk=f"{run.id}.a").status == RunStatus.SUCCEEDED


def test_compensating_the_parent_compensates_the_children_that_wrote():
    data = {"fail": True, "charge": True, "middle": {"charge": "m", "leaf": {"n": 1}}}
    run = durable.start("tests.children.grand", data)
    root = settle(run.id)
    assert root.status == RunStatus.FAILED
    mid, leaf = Run.objects.get(pk=f"{run.id}.mid"), Run.objects.get(pk=f"{run.id}.mid.leaf")
    assert mid.status == leaf.status == RunStatus.SUCCEEDED
    durable.compensate(run.id, by="carol")
    assert Run.objects.get(pk=mid.id).status == RunStatus.COMPENSATING  # it wrote
    assert Run.objects.get(pk=leaf.id).status == RunStatus.SUCCEEDED  # it did not
    root = settle(run.id)
    assert root.status == RunStatus.COMPENSATED
    assert Run.objects.get(pk=mid.id).status == RunStatus.COMPENSATED
    assert sorted(cwf.VOIDS) == ["middle:m", "root"]


def test_compensation_reaches_a_grandchild_that_wrote_and_cancels_a_running_child():
    data = {"middle": {"leaf": {"n": 1, "charge": "g", "wait_signal": True}}}
    run = durable.start("tests.children.grand", data)
    settle(run.id)
    durable.cancel(run.id)  # the whole tree is cancelled...
    durable.compensate(run.id)  # ...and compensated where it wrote: the grandchild
    leaf = Run.objects.get(pk=f"{run.id}.mid.leaf")
    assert leaf.status == RunStatus.COMPENSATING
    assert Run.objects.get(pk=f"{run.id}.mid").status == RunStatus.CANCELLED
    settle(run.id)
    assert Run.objects.get(pk=leaf.id).status == RunStatus.COMPENSATED
    assert cwf.VOIDS == ["g"]


def test_a_child_finished_before_the_wait_is_returned_at_once():
    run = durable.start("tests.children.late_wait", {})
    assert drive(run.id).status == RunStatus.WAITING  # on the signal
    child = drive(f"{run.id}.early")
    assert child.status == RunStatus.SUCCEEDED
    assert Run.objects.get(pk=run.id).status == RunStatus.WAITING  # still on the signal
    durable.signal(run.id, "now")
    root = drive(run.id)
    assert root.status == RunStatus.SUCCEEDED
    assert root.output_value() == {"double": 10}
    wait = Wait.objects.get(run=run, kind=WaitKind.CHILD)
    assert wait.status == WaitStatus.RESOLVED and wait.key == child.id
    # the run never parked on the child: one waiting event, for the signal
    waiting = TraceEvent.objects.filter(run=run, kind=EventKind.WAITING)
    assert [e.step_id for e in waiting] == ["signal:now"]


def test_pending_batched_steps_commit_with_the_childs_start():
    run = durable.start("tests.children.batched", {})
    assert drive(run.id).status == RunStatus.WAITING
    steps = list(Step.objects.filter(run=run).order_by("position").values_list("step_id", "kind"))
    assert steps[:4] == [
        ("read0", "step"),
        ("read1", "step"),
        ("read2", "step"),
        ("child:after-reads", "child"),
    ]
    assert settle(run.id).output_value() == {"double": 4}


def test_waiting_on_a_handle_of_another_run_is_refused():
    other = durable.start("tests.children.leaf", {"n": 1})
    handle = durable.ChildHandle(other.id, "tests.children.leaf", "child:x")
    with pytest.raises(RuntimeError, match="belongs to no workflow"):
        handle.result()


def test_a_fork_reuses_the_child_its_source_started():
    """A fork from after a child's start reuses that start (no second child) and waits on
    the source's child; a fork from the start itself starts a child of its own."""
    run = durable.start("tests.children.uncaught", {})
    assert settle(run.id).status == RunStatus.FAILED
    fork = durable.fork(run.id, from_step="wait:child:bad")
    fork = drive(fork.id)
    assert fork.status == RunStatus.FAILED and fork.error["type"] == "ChildFailed"
    assert f"child run {run.id}.bad ended failed" in fork.error["message"]
    assert not Run.objects.filter(parent_run=fork).exists()
    again = durable.fork(run.id, from_step="child:bad")
    drive(again.id)
    assert list(Run.objects.filter(parent_run=again).values_list("id", flat=True)) == [
        f"{again.id}.bad"
    ]
