"""Capability 1: a key reused with other content is a conflict (Stripe's idempotency
rule, docs/requesters-and-signals.md#a-key-names-one-request), for the parts of the
content the existing tests do not vary: the *workflow* under a reused run id or
Idempotency-Key, the child *workflow* under a reused child_id, and forks racing for
one new_run_id from two different sources."""

from __future__ import annotations

import pytest

import durable
from durable.exceptions import KeyConflict, RunInputConflict
from durable.models import Run, RunStatus
from durable.testing import drive
from tests.api.conftest import api_for
from tests.approvals.test_races import run_together
from tests.dashboard.conftest import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_run_id_reused_for_another_workflow_with_the_same_input_is_a_conflict():
    """Stripe bootcamp crash "Keys for idempotent requests can only be used with the same
    parameters" (https://github.com/fjordllc/bootcamp/issues/4268) and the wrong-endpoint
    variant (https://github.com/stripe/stripe-ruby/issues/598: a key reused for another
    endpoint is refused). Here the "endpoint" is the workflow: the same run id and the
    same input, but another workflow, must be refused naming the workflow, never
    answered with the first run as if it were a duplicate."""
    first = durable.start("acceptance.echo", {"n": 1}, run_id="order-42")
    with pytest.raises(RunInputConflict) as caught:
        durable.start("acceptance.other", {"n": 1}, run_id="order-42")
    assert caught.value.key == "order-42" and caught.value.differs == "workflow"
    assert Run.objects.get(pk="order-42").workflow_name == "acceptance.echo"
    assert durable.start("acceptance.echo", {"n": 1}, run_id="order-42").pk == first.pk


def test_the_api_idempotency_key_reused_for_another_workflow_is_a_409_and_is_per_user():
    """Same report (https://github.com/stripe/stripe-ruby/issues/598): one
    Idempotency-Key, the same input, another workflow -> 409 naming the key; the same
    key sent by another user is that user's own request (keys are scoped per user, as
    Stripe scopes them per account), so it creates a run of its own (201)."""
    alice, bob = make_user("acc-alice", "operator"), make_user("acc-bob", "operator")
    a, b = api_for(alice), api_for(bob)
    key = {"Idempotency-Key": "checkout-7"}
    first = a.post("/runs", {"workflow": "acceptance.echo", "input": {"n": 1}}, headers=key)
    assert first.status_code == 201, first.content
    other = a.post("/runs", {"workflow": "acceptance.other", "input": {"n": 1}}, headers=key)
    assert other.status_code == 409, other.content
    detail = other.json()["detail"]
    assert "Idempotency-Key 'checkout-7'" in detail and "workflow" in detail, detail
    again = a.post("/runs", {"workflow": "acceptance.echo", "input": {"n": 1}}, headers=key)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    bobs = b.post("/runs", {"workflow": "acceptance.other", "input": {"n": 1}}, headers=key)
    assert bobs.status_code == 201, bobs.content
    assert bobs.json()["id"] != first.json()["id"]
    assert Run.objects.count() == 2


def test_a_child_id_reused_in_one_execution_for_another_child_workflow_fails_the_parent():
    """DBOS "Duplicate WorkflowID breaks durability of existing workflow"
    (https://github.com/dbos-inc/dbos-transact-ts/issues/725): two different workflows
    started under one id. Here a parent starts child 'a' of acceptance.echo and then child
    'a' of acceptance.other with the same input: the second is another request under the
    key (its workflow differs) and must be refused naming the child id, not handed
    the first child's handle."""

    run = drive(durable.start("acceptance.two_children_one_id", {}).id)
    assert run.status == RunStatus.FAILED, (run.status, run.output_value())
    # refused naming the key (the engine's words: "child_id 'a' is used twice in run ...")
    assert "child_id 'a'" in run.error["message"], run.error
    assert Run.objects.filter(parent_run=run).count() == 1
    assert Run.objects.get(pk=f"{run.id}.a").workflow_name == "acceptance.echo"


def test_forks_of_two_sources_racing_for_one_new_run_id_make_one_fork():
    """DBOS "SetWorkflowID does not prevent concurrent execution of workflows with the
    same ID" (https://github.com/dbos-inc/dbos-transact-py/issues/544): races of one key.
    Two finished runs are forked at once under the same new_run_id: exactly one fork is
    made; the other request is a KeyConflict naming the id (its source differs), never
    an IntegrityError and never the other source's fork handed back as its own."""
    sources = [drive(durable.start("acceptance.echo", {"n": i}).id) for i in range(2)]
    assert all(s.status == RunStatus.SUCCEEDED for s in sources)
    for trial in range(3):
        fork_id = f"race-fork-{trial}"
        results = run_together(
            *(
                lambda s=s, f=fork_id: durable.fork(s.id, from_step="echo", by="ops", new_run_id=f)
                for s in sources
            )
        )
        oks = [value for kind, value in results if kind == "ok"]
        errors = [value for kind, value in results if kind == "error"]
        assert len(oks) == 1, results
        assert len(errors) == 1 and isinstance(errors[0], KeyConflict), results
        assert f"fork run id '{fork_id}'" in str(errors[0])
        fork = Run.objects.get(pk=fork_id)
        assert fork.forked_from_id == oks[0].forked_from_id
