"""Five examples of PydanticAI's documentation run as DurableAgents, each asserting what
its page says (``tests/contrib/pydantic_ai_docs.py`` holds the examples; the crash
variants are in ``tests/processes/test_pydantic_ai_processes.py``).

Only the wrapper lines differ from the documentation: ``agent.run_sync(prompt, ...)``
becomes ``drive(durable_agent.start(prompt, ...).id)`` (a worker would run it; ``drive``
runs it here) and ``result.output`` comes from ``durable_agent.decode(run.output_value())``;
where the documentation decides approvals in code, a person decides them in the inbox.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from django.contrib.auth.models import Permission, User

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from durable.models import Run, RunStatus, Step
from durable.testing import drive
from durable.values import codec
from tests.contrib import pai_agents as pa
from tests.contrib import pydantic_ai_docs as docs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    pa.CALLS.clear()


def models_called() -> Counter:
    return Counter(c["name"] for c in pa.CALLS if c["kind"] == "model")


def test_roulette_wheel_agent_md():
    """ai.pydantic.dev/agent "roulette_wheel.py": with ``deps=18``, "Put my money on square
    eighteen" is ``True`` and "I bet five is the winner" is ``False``."""
    success_number = 18
    result = docs.durable_roulette.decode(
        drive(
            docs.durable_roulette.start("Put my money on square eighteen", deps=success_number).id
        ).output_value()
    )
    assert result.output is True
    result = docs.durable_roulette.decode(
        drive(
            docs.durable_roulette.start("I bet five is the winner", deps=success_number).id
        ).output_value()
    )
    assert result.output is False


def test_dice_game_tools_md():
    """ai.pydantic.dev/tools "dice_game.py": the agent rolls the die, gets the player's name from
    the deps (``deps='Anne'``) and answers with it: a winner exactly when the roll is the
    guess. Both tools of the turn are one parallel group."""
    run = drive(docs.durable_dice.start("My guess is 4", deps="Anne").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    output = docs.durable_dice.decode(run.output_value()).output
    roll = codec.decode(Step.objects.get(run=run, step_id="tool:roll_dice").output)["return"]
    assert "Anne" in output
    assert ("you guessed correctly" in output) == (roll == "4")
    names = [s for s in Step.objects.filter(run=run).order_by("position").values_list("step_id")]
    assert [n for (n,) in names] == ["model", "tool:roll_dice", "tool:get_player_name", "model#2"]


def test_usage_limits_request_limit_agent_md():
    """ai.pydantic.dev/agent "Usage Limits": an infinite retry loop stops after 3 requests with
    ``UsageLimitExceeded``: "The next request would exceed the request_limit of 3"."""
    from pydantic_ai import UsageLimits

    run = drive(
        docs.durable_limits.start(
            "Begin infinite retry loop!", usage_limits=UsageLimits(request_limit=3)
        ).id
    )
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "UsageLimitExceeded"
    assert "The next request would exceed the request_limit of 3" in run.error["message"]
    assert models_called() == Counter({"limits:1": 1, "limits:2": 1, "limits:3": 1})


def test_tool_requires_approval_deferred_tools_md():
    """ai.pydantic.dev/deferred-tools "tool_requires_approval.py": updating README.md runs at once;
    clearing the protected ``.env`` (``ApprovalRequired(metadata={'reason': 'protected'})``)
    and deleting ``__init__.py`` (``requires_approval=True``) wait for approval -- in the
    inbox together; the update is approved, the delete denied with "Deleting files is not
    allowed", which the model sees."""
    alice = User.objects.create_user("alice", password="x")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    run = drive(
        docs.durable_files.start(
            "Delete `__init__.py`, write `Hello, world!` to `README.md`, and clear `.env`"
        ).id
    )
    assert run.status == RunStatus.WAITING, run.error
    pending = ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING)
    assert sorted(r.key for r in pending) == [
        "delete_file:delete_file",
        "update_file:update_file_dotenv",
    ]
    dotenv = pending.get(key="update_file:update_file_dotenv")
    assert codec.decode(dotenv.payload)["payload"]["metadata"] == {"reason": "protected"}
    for req in pending:
        if req.key.startswith("update_file"):  # approve all updates
            approval_decide(request_id=req.pk, user=alice, approve=True)
        else:  # deny all deletes
            approval_decide(
                request_id=req.pk,
                user=alice,
                approve=False,
                comment="Deleting files is not allowed",
            )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    output = docs.durable_files.decode(run.output_value()).output
    done = json.loads(output.removeprefix("Here's what I've done: "))
    assert done["update_file_readme"] == ["success", "File 'README.md' updated: 'Hello, world!'"]
    assert done["update_file_dotenv"] == ["success", "File '.env' updated: ''"]
    assert done["delete_file"][0] == "denied"
    assert "Deleting files is not allowed" in done["delete_file"][1]
    assert models_called() == Counter({"files:1": 1, "files:2": 1})


def test_bank_support_index_md():
    """ai.pydantic.dev "bank_support.py": "What is my balance?" gets the balance including
    pending transactions, addressed to John (the customer name the instructions add from
    the deps' database), ``block_card=False, risk=1``; "I just lost my card!" blocks the
    card, ``risk=8``. The database connection is no stored value: ``deps_factory`` opens
    one per execution from the stored customer id."""
    deps = {"customer_id": 123}
    run = drive(docs.durable_support.start("What is my balance?", deps=deps).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    output = docs.durable_support.decode(run.output_value()).output
    assert output == docs.SupportOutput(
        support_advice="Hello John, your current account balance, including pending "
        "transactions, is $123.45.",
        block_card=False,
        risk=1,
    )
    run = drive(docs.durable_support.start("I just lost my card!", deps=deps).id)
    output = docs.durable_support.decode(run.output_value()).output
    assert output.block_card is True and output.risk == 8
    assert output.support_advice.startswith("I'm sorry to hear that, John.")
    assert Run.objects.filter(workflow_name="pai.docs.support").count() == 2
