"""Batched checkpoints, in-process: what is durable when, and what a crash can lose.

The guarantees (docs/architecture.md#batched-checkpoints), checked from inside the step
bodies (``tests/durable/runtime/batching_workflows.py`` logs the committed positions each body
sees): a write runs only after every earlier step is committed; a batch is flushed at
``BATCH_MAX_STEPS`` or after ``BATCH_MAX_DELAY_MS``; waits, failures, stops and the
run's end commit what is pending; a crash loses only a suffix of batched steps, which
the next execution runs again at the same positions.
"""

from __future__ import annotations

import random

import pytest

import durable
from durable.checks import check_durable
from durable.exceptions import DurableConfigurationError
from durable.models import RunStatus, Step, StepAttempt, StepStatus, TraceEvent
from durable.runtime import llm as llm_module
from durable.testing import drive, make_due
from durable.waits.closing import wake_due
from durable.worker.engine import execute
from tests.durable import engine_workflows as ew
from tests.durable.runtime import batching_workflows as bw

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ["read", "read_sync", "read_batched", "step_b", "step", "llm", "llm_sync", "write", "idem"]


@pytest.fixture(autouse=True)
def _reset(monkeypatch):
    bw.reset()
    monkeypatch.setattr(llm_module, "chat", bw.fake_chat)
    yield
    bw.reset()


@pytest.fixture
def batch_size(settings):
    def set_limits(steps: int = 32, delay_ms: float = 60_000.0) -> None:
        settings.DURABLE = {
            **settings.DURABLE,
            "BATCH_MAX_STEPS": steps,
            "BATCH_MAX_DELAY_MS": delay_ms,
        }

    set_limits()
    return set_limits


def _start(ops: list[str], workflow: str = "batch.ops") -> str:
    return durable.start(workflow, {"ops": ops}).id


def _seen(label: str) -> list[list[int]]:
    """The committed positions each call of ``label``'s body saw, in call order."""
    return [entry["durable"] for entry in bw.LOG if entry["label"] == label]


def _rows(run_id: str) -> list[tuple[int, str, str, str]]:
    return list(
        Step.objects.filter(run_id=run_id)
        .order_by("position")
        .values_list("position", "step_id", "status", "durability")
    )


def _is_batched(op: str, workflow: str) -> bool:
    if op in ("read_batched", "step_b"):
        return True
    return workflow == "batch.ops" and op in ("read", "llm")


# --- the happy path ----------------------------------------------------------------


def test_a_chain_of_reads_is_committed_together_and_recorded_as_batched(batch_size):
    run_id = _start(["read"] * 5)
    run = drive(run_id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [f"read{i}@{i}" for i in range(5)]
    assert [_seen(f"read{i}") for i in range(5)] == [[[]]] * 5  # nothing flushed mid-chain
    assert _rows(run_id) == [(i, f"read{i}", "succeeded", "batched") for i in range(5)]
    assert run.steps_executed == 5 and run.cursor_position == 5
    events = TraceEvent.objects.filter(run_id=run_id, kind="step_executed").order_by("id")
    assert [(e.step_id, e.data["batched"]) for e in events] == [
        (f"read{i}", True) for i in range(5)
    ]


def test_replaying_a_batched_run_reruns_nothing(batch_size):
    run_id = _start(["read", "read", "sleep", "read"])
    assert drive(run_id).status == RunStatus.WAITING
    make_due(run_id)
    wake_due()
    run = drive(run_id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert dict(bw.CALLS) == {"read0": 1, "read1": 1, "read3": 1}
    assert run.steps_replayed == 2  # read0 and read1 (the timer is recorded now)


# --- the flush rules -----------------------------------------------------------------


def test_a_batch_is_flushed_every_batch_max_steps(batch_size):
    batch_size(steps=3)
    run = drive(_start(["read"] * 8))

    assert run.status == RunStatus.SUCCEEDED, run.error
    for i in range(8):
        assert _seen(f"read{i}") == [list(range(i - i % 3))], i
    assert run.steps_executed == 8 and run.cursor_position == 8


def test_a_zero_delay_commits_each_batched_step_at_once(batch_size):
    batch_size(delay_ms=0)
    run = drive(_start(["read"] * 4))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [_seen(f"read{i}") for i in range(4)] == [[list(range(i))] for i in range(4)]


def test_a_pending_step_older_than_the_delay_is_flushed_before_the_next_step(batch_size):
    batch_size(delay_ms=20)
    run = drive(_start(["read", "pause", "read", "read"]))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert _seen("read2") == [[0]]  # read0 waited 30 ms: flushed before read2 started
    assert _seen("read3") == [[0]]  # read2 was added just now: still pending


@pytest.mark.parametrize("write", ["write", "idem"])
def test_a_write_runs_only_after_every_earlier_step_is_committed(batch_size, write):
    run = drive(_start(["read", "step_b", "llm", write, "read", "read"]))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert _seen(f"{write}3") == [[0, 1, 2]]
    assert _seen("read4") == [[0, 1, 2, 3]]
    assert [row[3] for row in _rows(run.id)] == ["batched"] * 3 + ["sync"] + ["batched"] * 2


@pytest.mark.parametrize("seed", range(12))
def test_random_sequences_keep_the_flush_rules(batch_size, seed):
    """Any mix of calls, any batch size: each body sees a committed prefix followed only
    by batched steps, fewer than BATCH_MAX_STEPS of them; a write sees everything."""
    rnd = random.Random(seed)
    limit = rnd.choice([1, 2, 3, 5, 32])
    batch_size(steps=limit)
    workflow = rnd.choice(["batch.ops", "batch.ops_sync"])
    ops = [rnd.choice(KINDS) for _ in range(rnd.randint(4, 14))]
    run = drive(_start(ops, workflow))

    assert run.status == RunStatus.SUCCEEDED, run.error
    for entry in bw.LOG:
        pos, seen = entry["position"], entry["durable"]
        assert seen == list(range(len(seen))), (ops, entry)  # a prefix, in step order
        pending = ops[len(seen) : pos]
        assert all(_is_batched(op, workflow) for op in pending), (ops, entry)
        assert len(pending) < limit, (ops, entry)
        if entry["label"].startswith(("write", "idem")):
            assert seen == list(range(pos)), (ops, entry)
    expected = [
        (i, f"{op}{i}", "succeeded", "batched" if _is_batched(op, workflow) else "sync")
        for i, op in enumerate(ops)
    ]
    assert _rows(run.id) == expected
    assert run.steps_executed == len(ops) and run.cursor_position == len(ops)
    assert run.tokens_used == 10 * sum(op.startswith("llm") for op in ops)


# --- what ends an execution commits what is pending ----------------------------------


def test_a_wait_parks_the_run_after_committing_the_batch(batch_size):
    run = drive(_start(["read", "read", "sleep", "read"]))

    assert run.status == RunStatus.WAITING
    assert _rows(run.id) == [
        (0, "read0", "succeeded", "batched"),
        (1, "read1", "succeeded", "batched"),
    ]
    assert run.cursor_position == 2 and run.steps_executed == 2


def test_a_failure_record_commits_the_batch_before_it(batch_size):
    run = drive(_start(["read", "step_b", "fail"]))

    assert run.status == RunStatus.FAILED
    assert _rows(run.id) == [
        (0, "read0", "succeeded", "batched"),
        (1, "step_b1", "succeeded", "batched"),
        (2, "fail2", "failed", "sync"),
    ]


def test_a_step_retried_in_process_records_its_failed_try_synchronously(batch_size):
    bw.ACTIONS["read1"] = "transient"
    run = drive(_start(["read", "read", "read"]))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert _seen("read1") == [[], [0]]  # the failure record committed read0 with it
    assert _rows(run.id) == [
        (0, "read0", "succeeded", "batched"),
        (1, "read1", "succeeded", "sync"),  # its row exists since the failed try
        (2, "read2", "succeeded", "batched"),
    ]
    assert StepAttempt.objects.filter(run_id=run.id).count() == 1


def test_a_cancel_during_a_batch_records_the_pending_steps_and_starts_no_write(batch_size):
    bw.ACTIONS["read1"] = "cancel"
    run = drive(_start(["read", "read", "read", "write", "read"]))

    assert run.status == RunStatus.CANCELLED
    assert "write3" not in bw.CALLS and not bw.WRITES
    # batched steps do not read the status: read2 ran, and everything that ran is recorded
    assert [row[:3] for row in _rows(run.id)] == [(i, f"read{i}", "succeeded") for i in range(3)]


def test_a_cancel_seen_at_a_size_flush_stops_the_run_after_recording(batch_size):
    batch_size(steps=3)
    bw.ACTIONS["read1"] = "cancel"
    run = drive(_start(["read"] * 6))

    assert run.status == RunStatus.CANCELLED
    assert [row[0] for row in _rows(run.id)] == [0, 1, 2]
    assert "read3" not in bw.CALLS


def test_a_lost_lease_writes_nothing_of_the_batch(batch_size):
    bw.ACTIONS["read1"] = "steal"
    execute(_start(["read", "read", "read", "write"]))

    assert Step.objects.count() == 0 and not bw.WRITES and "write3" not in bw.CALLS


# --- crashes ----------------------------------------------------------------------------

CRASH_OPS = ["read", "llm", "step_b", "write", "read", "read", "step", "read"]


def _result(op: str, i: int) -> object:
    if op == "llm":
        return f"llm{i}"
    if op == "write":
        return {"written": f"write{i}"}
    return f"{op}{i}@{i}"


@pytest.mark.parametrize("at", [i for i, op in enumerate(CRASH_OPS) if op != "llm"])
def test_a_crash_loses_only_the_pending_suffix_and_replay_runs_it_again(batch_size, at):
    label = f"{CRASH_OPS[at]}{at}"
    bw.ACTIONS[label] = "crash"
    run_id = _start(CRASH_OPS)
    with pytest.raises(ew.Crash):
        drive(run_id)
    committed = [row[0] for row in _rows(run_id)]
    # committed: everything before the last synchronous call that began before the crash
    # (a write commits everything before it even before its body runs)
    sync_before = [i for i in range(at) if not _is_batched(CRASH_OPS[i], "batch.ops")]
    boundary = at - 1 if CRASH_OPS[at] == "write" else max(sync_before, default=-1)
    assert committed == list(range(boundary + 1)), committed

    ew.expire_lease(run_id)
    run = drive(run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [_result(op, i) for i, op in enumerate(CRASH_OPS)]
    assert [row[1] for row in _rows(run_id)] == [f"{op}{i}" for i, op in enumerate(CRASH_OPS)]
    lost = range(boundary + 1, at + 1)
    for i, op in enumerate(CRASH_OPS):
        assert bw.CALLS[f"{op}{i}"] == (2 if i in lost else 1), (i, op)
    assert not any(status != StepStatus.SUCCEEDED for _, _, status, _ in _rows(run_id))


# --- declarations ------------------------------------------------------------------------


@pytest.mark.parametrize("safety", ["idempotent_write", "unsafe_write"])
def test_a_batched_write_tool_is_refused_naming_it(safety):
    with pytest.raises(DurableConfigurationError, match="tool 'pay.now'.*cannot be batched"):

        @durable.tool(name="pay.now", safety=safety, durability="batched")
        def pay(amount: int) -> int:
            return amount


def test_an_unknown_durability_is_refused_naming_where_it_came_from():
    with pytest.raises(DurableConfigurationError, match=r"durable.tool\(name='t.x'\).*'lazy'"):

        @durable.tool(name="t.x", safety="read_only", durability="lazy")
        def t(x: int) -> int:
            return x

    with pytest.raises(DurableConfigurationError, match=r"durable.workflow\(name='w.x'\).*'async'"):

        @durable.workflow(name="w.x", durability="async")
        def w(ctx, data):
            return data


def test_an_unknown_step_durability_fails_the_run_naming_the_call(batch_size):
    run = drive(durable.start("batch.bad_step", {}).id)

    assert run.status == RunStatus.FAILED
    assert "ctx.step('odd', durability=...)" in run.error["message"]
    assert "'fast'" in run.error["message"]


def test_overrides_per_tool_and_per_llm_call(batch_size):
    run = drive(_start(["read_batched", "read", "llm", "llm_sync"], "batch.ops_sync"))
    assert [row[3] for row in _rows(run.id)] == ["batched", "sync", "sync", "sync"]

    run = drive(_start(["read_sync", "read", "llm", "llm_sync"], "batch.ops"))
    assert [row[3] for row in _rows(run.id)] == ["sync", "batched", "batched", "sync"]
    assert run.tokens_used == 20 and "scripted-llm" in run.tags


@pytest.mark.parametrize(
    ("name", "value", "check"),
    [
        ("BATCH_MAX_STEPS", 0, "durable.E003"),
        ("BATCH_MAX_STEPS", "many", "durable.E003"),
        ("BATCH_MAX_DELAY_MS", -1, "durable.E006"),
        ("BATCH_MAX_DELAY_MS", "soon", "durable.E006"),
    ],
)
def test_impossible_batch_settings_are_reported_at_start_up(settings, name, value, check):
    assert not [m for m in check_durable() if m.id in ("durable.E003", "durable.E006")]
    settings.DURABLE = {**settings.DURABLE, name: value}
    assert [m.id for m in check_durable() if name in m.msg] == [check]


def _written(run_id: str) -> dict[str, list]:
    skip = {"id", "run_id", "started_at", "finished_at"}
    steps = [
        {
            f.attname: getattr(s, f.attname)
            for f in Step._meta.concrete_fields
            if f.attname not in skip
        }
        for s in Step.objects.filter(run_id=run_id).order_by("position")
    ]
    events = [
        (e.kind, e.step_id, {k: v for k, v in (e.data or {}).items() if k != "seconds"})
        for e in TraceEvent.objects.filter(run_id=run_id, kind="step_executed").order_by("id")
    ]
    return {"steps": steps, "events": events}


def test_a_flush_writes_awkward_text_as_the_orm_path_does(batch_size, monkeypatch):
    """The one-statement flush sends each column as an array (PostgreSQL): quotes,
    braces, commas, backslashes, NUL and surrogates in ids, inputs and outputs reach the
    rows as the ORM's transactional path writes them (on SQLite both are that path)."""
    from durable import postgres
    from durable.postgres import batches

    flushes: list[int] = []
    one_statement = batches.flush_in_one_statement

    def counted(owner, batch):
        flushes.append(len(batch.pending))
        return one_statement(owner, batch)

    monkeypatch.setattr(batches, "flush_in_one_statement", counted)
    batch_size(steps=4)
    texts = bw.AWKWARD_TEXTS
    fast = drive(durable.start("batch.awkward", {"texts": texts}).id)
    assert fast.status == RunStatus.SUCCEEDED, fast.error
    if postgres.available():
        assert flushes[:2] == [4, 4]  # the one-statement flush wrote them
    monkeypatch.setattr(postgres, "available", lambda: False)
    orm = drive(durable.start("batch.awkward", {"texts": texts}).id)
    assert orm.status == RunStatus.SUCCEEDED, orm.error
    assert _written(fast.id) == _written(orm.id)
    assert len(_written(fast.id)["steps"]) == len(texts)
    assert fast.output == orm.output
