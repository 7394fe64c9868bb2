"""Requests racing with one key, with real threads and real transactions: exactly one
answers "created" (201, or a signal that is not a duplicate); the others answer with its
result (200) or a conflict (409), never a second 201, and one row is stored
(docs/requesters-and-signals.md#a-key-names-one-request).

Each thread has its own client and database connection. On PostgreSQL the inserts race
for the primary key (and a signal's run row lock); SQLite serialises the writers, so
there the test holds without a race.
"""

from __future__ import annotations

import pytest

import durable
from durable.models import Run, Signal
from durable.testing import drive
from tests.api.conftest import api_for
from tests.approvals.test_races import run_together
from tests.dashboard import dash_workflows  # noqa: F401  (registers dash.fail)

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 4
TRIALS = 4


def statuses(results) -> list[int]:
    assert all(kind == "ok" for kind, _ in results), results
    return sorted(response.status_code for _, response in results)


def test_racing_starts_with_one_idempotency_key_make_one_run_and_one_201(operator):
    clients = [api_for(operator) for _ in range(THREADS)]
    for trial in range(TRIALS):
        key = {"Idempotency-Key": f"order-{trial}"}
        results = run_together(
            *(
                lambda c=c, key=key: c.post(
                    "/runs", {"workflow": "dash.echo", "input": 1}, headers=key
                )
                for c in clients
            )
        )
        assert statuses(results) == [200] * (THREADS - 1) + [201], (trial, results)
        assert len({r.json()["id"] for _, r in results}) == 1
    assert Run.objects.count() == TRIALS


def test_racing_starts_with_one_key_and_two_inputs_one_wins_the_rest_agree_or_409(operator):
    clients = [api_for(operator) for _ in range(THREADS)]
    for trial in range(TRIALS):
        key = {"Idempotency-Key": f"pay-{trial}"}
        results = run_together(
            *(
                lambda c=c, n=n, key=key: c.post(
                    "/runs", {"workflow": "dash.echo", "input": n % 2}, headers=key
                )
                for n, c in enumerate(clients)
            )
        )
        codes = statuses(results)
        assert codes.count(201) == 1, (trial, codes)
        (winner,) = [r for _, r in results if r.status_code == 201]
        for _, response in results:
            if response.status_code == 409:
                assert f"Idempotency-Key 'pay-{trial}'" in response.json()["detail"]
            elif response.status_code == 200:
                assert response.json()["id"] == winner.json()["id"]
        assert set(codes) <= {200, 201, 409}
    assert Run.objects.count() == TRIALS


def test_racing_signals_with_one_dedupe_key_store_one(operator):
    clients = [api_for(operator) for _ in range(THREADS)]
    for trial in range(TRIALS):
        run = durable.start("tests.signal", {})
        results = run_together(
            *(
                lambda c=c, n=n, run=run: c.post(
                    f"/runs/{run.id}/signals",
                    {"name": "go", "dedupe_key": "evt-1", "payload": {"amount": 10 + n % 2}},
                )
                for n, c in enumerate(clients)
            )
        )
        codes = statuses(results)
        assert set(codes) <= {200, 409}, (trial, codes)
        fresh = [r for _, r in results if r.status_code == 200 and not r.json()["duplicate"]]
        assert len(fresh) == 1, (trial, [r.content for _, r in results])
        (stored,) = Signal.objects.filter(run=run)
        assert stored.pk == fresh[0].json()["signal_id"]


def test_racing_forks_with_one_new_run_id_make_one_fork(operator):
    """Two threads fork one source, two another, all under one new_run_id: one 201, its
    twin a 200, the forks of the other source a 409 (their insert loses the id)."""
    clients = [api_for(operator) for _ in range(THREADS)]
    sources = [drive(durable.start("dash.fail", {}).id).id for _ in range(2)]
    for trial in range(TRIALS):
        new_id = f"race-fork-{trial}"
        results = run_together(
            *(
                lambda c=c, n=n, new_id=new_id: c.post(
                    f"/runs/{sources[n % 2]}/fork", {"from_step": "boom", "new_run_id": new_id}
                )
                for n, c in enumerate(clients)
            )
        )
        assert statuses(results) == [200, 201, 409, 409], (trial, results)
        fork = Run.objects.get(pk=new_id)
        for n, (_, response) in enumerate(results):
            assert (response.status_code == 409) is (sources[n % 2] != fork.forked_from_id)
    assert Run.objects.filter(forked_from__isnull=False).count() == TRIALS
