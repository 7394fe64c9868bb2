"""The database-fault harness: kill the worker's connection at a random statement of a
run's execution, many times, and check every run's end state and effects.

Each run of ``dbf.two_steps`` (a plain step with a deduped effect, then an unsafe write
with reconcile) gets a plan: for its 1st, 2nd, ... execution, the number of the
statement before which the worker loses its connection (``tests/dbfault_workflows.py``
injects it in the worker: ``pg_terminate_backend`` of its own backend on PostgreSQL,
"database is locked" on SQLite). Statements are counted from the start of the Celery
task, so the claim, the status reads, the ledger, the checkpoints, the completion and
the release are all targets. The plan is random with a printed seed
(``DBFAULT_SEED=<n>`` replays one).

Every run must end SUCCEEDED with each effect once and its write's operation settled;
runs whose plan fired show a ``db_fault`` event or recovered without one (a fault in
the claim, a step's checkpoint or a batch flush is retried in place). The short version
runs by default; the long one is ``pytest -m slow``.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter

import pytest
from django.db import connection

import durable
from durable.models import TERMINAL, Operation, OperationStatus, Run, RunStatus, TraceEvent
from tests import dbfault_workflows as dw
from tests.crash_workflows import read_jsonl
from tests.harness import wait_until

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

MODULES = "tests.crash_workflows,tests.dbfault_workflows"
#: a first execution of dbf.two_steps runs about 15 statements on SQLite, and 6 on
#: PostgreSQL, where the claim, each checkpoint, the write's ledger row and the
#: completion are one statement each (a replay a few more): a planned statement past
#: the end of an execution fires no fault
STATEMENTS = {"sqlite": 16, "postgresql": 7}


def sql_kind(sql: str) -> str:
    words = sql.replace('"', "").split()
    verb = words[0].upper() if words else "?"
    table = next((w for w in words if w.startswith("durable_")), "")
    return f"{verb} {table}".strip()


def run_harness(
    workers, proc_env, tmp_path, *, runs: int, faults_per_run: int, seed: int, timeout: float
) -> None:
    rng = random.Random(seed)
    statements = STATEMENTS[connection.vendor]
    run_ids = [f"dbf-{seed}-{i}" for i in range(runs)]
    plan = {
        rid: [rng.randint(1, statements) for _ in range(rng.randint(1, faults_per_run))]
        for rid in run_ids
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    env = {"DURABLE_WORKFLOW_MODULES": MODULES, "DBFAULT_PLAN": str(plan_path)}
    solo = workers.start(**env)
    prefork = workers.start(pool="prefork", concurrency=2, **env)
    solo.wait_ready()
    prefork.wait_ready()
    for i, rid in enumerate(run_ids):
        durable.start("dbf.two_steps", {"n": i}, run_id=rid)

    def settled():
        rows = {r.id: r for r in Run.objects.filter(pk__in=run_ids)}
        return rows if all(r.status in TERMINAL for r in rows.values()) else None

    context = f"seed {seed} (replay with DBFAULT_SEED={seed}); plan {plan}"
    try:
        rows = wait_until(settled, timeout, what=f"{runs} runs to finish")
    except AssertionError:
        states = Counter(Run.objects.filter(pk__in=run_ids).values_list("status", flat=True))
        raise AssertionError(f"not finished: {dict(states)}; {context}") from None

    fired = read_jsonl(proc_env.dir / "faults.jsonl")
    effects = dw.effect_counts(proc_env.dir)
    for rid, run in rows.items():
        hits = [
            f"{f['execution']}:{f['statement']} {sql_kind(f['sql'])}"
            for f in fired
            if f["run"] == rid
        ]
        where = f"run {rid} (faults {hits}); {context}"
        assert run.status == RunStatus.SUCCEEDED, f"{run.status} {run.error}; {where}"
        assert effects.get(("tickets", f"{rid}:first")) == 1, where
        assert effects.get(("charges", f"{rid}:dbf.charge")) == 1, where
        assert run.output_value()["n"] == int(rid.rsplit("-", 1)[1]), where
    assert (
        not Operation.objects.filter(run_id__in=run_ids)
        .exclude(status=OperationStatus.SUCCEEDED)
        .exists()
    ), context
    assert sum(effects.values()) == 2 * runs, context
    assert not TraceEvent.objects.filter(run_id__in=run_ids, kind="failed").exists()

    # the harness must have done something: most planned first faults fall within an
    # execution, and some of them interrupted a run or were ridden out by a checkpoint
    # (not only a claim retried in place)
    assert len(fired) >= runs // 2, f"only {len(fired)} faults fired; {context}"
    events = TraceEvent.objects.filter(run_id__in=run_ids)
    assert (
        events.filter(kind="db_fault").exists()
        or events.filter(kind="step_executed", data__has_key="db_faults").exists()
    ), context
    kinds = Counter(sql_kind(f["sql"]) for f in fired)
    print(f"seed {seed}: {len(fired)} faults in {runs} runs; statements hit: {dict(kinds)}")


def _seed(default: int) -> int:
    return int(os.environ.get("DBFAULT_SEED") or default)


@pytest.mark.timeout(240)
def test_db_fault_harness_short(workers, proc_env, tmp_path):
    run_harness(
        workers,
        proc_env,
        tmp_path,
        runs=12,
        faults_per_run=2,
        seed=_seed(random.randrange(10**6)),
        timeout=90,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_db_fault_harness_long(workers, proc_env, tmp_path):
    run_harness(
        workers,
        proc_env,
        tmp_path,
        runs=80,
        faults_per_run=4,
        seed=_seed(random.randrange(10**6)),
        timeout=600,
    )
