"""LangGraph's documentation examples (``tests.contrib.lg_workflows``) across real worker
processes, each run's worker SIGKILLed once inside the example.

One test starts every example's run at once against two workers armed with each run's
crash point (``LG_CRASH_AT=<example>.<node>:end``: the node has returned, its writes are
not saved yet; each fires once); whenever a worker dies, another starts, until every run
has finished. Approvals are answered as they reach the inbox. Then each run has the
outcome its docs page states, only the node killed ran again, and no approval was asked
twice. (Approve-or-reject and ``call_model`` in a node have their own crash tests in
``test_langgraph_processes.py``.) A LangChain chat model wrapped by
``durable_chat_model`` shares the workers: killed after its calls, it is not asked
again.
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("langgraph")

from django.contrib.auth.models import Permission, User

import durable
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from durable.contrib.langgraph import start_graph
from durable.contrib.langgraph.models import LangGraphStoreItem
from durable.models import Run, RunStatus, Step
from tests.contrib import lg_workflows as lg
from tests.harness import wait_for_run, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]

WORKER_ENV = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,tests.contrib.lg_workflows"}
CRASH_AT = ",".join(
    [
        "review.review:end",  # review and edit: after the edited content came back
        "age.collect_age:end",  # validating input: after the second (valid) answer
        "asked.confirm:end",  # ask(): after the approval came back
        "context.second:end",  # run-time context: in the second super-step
        "jokes.generate_joke[dogs]:end",  # Send: one branch, the others' writes saved
        "memory.call_model:end",  # memory store: after the node's store.put
        "chat-write",  # a LangChain chat model (durable_chat_model): after its two calls
    ]
)
FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
#: what the approver answers, per example, in the order the requests come
ANSWERS = {
    "review": [{"instruction": "Review and edit this content", "content": "improved"}],
    "age": [{"value": -3}, {"value": 30}],
    "asked": [None],
}


def test_each_langgraph_documentation_example_survives_a_sigkill(workers, proc_env):
    alice = User.objects.create_user("alice")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    runs = {
        "review": durable.start("lg.review", {"generated_text": "draft"}).id,
        "age": durable.start("lg.age", {"age": None}).id,
        "asked": durable.start("lg.asked", {"action_details": "deploy"}).id,
        "context": start_graph("lg.context", {"log": []}, context=lg.ContextSchema("anthropic")).id,
        "jokes": durable.start("lg.jokes", {"subjects": ["cats", "dogs", "birds"]}).id,
        "memory": start_graph("lg.memory", {"message": "likes tea"}, context={"user_id": "u1"}).id,
        # not a docs example: durable_chat_model's crash case, sharing these workers
        "chat": durable.start("lg.chat_writer", {"topic": "otters", "log": []}).id,
    }
    example = {run_id: name for name, run_id in runs.items()}
    answers = {name: list(a) for name, a in ANSWERS.items()}
    alive = [workers.start(LG_CRASH_AT=CRASH_AT, **WORKER_ENV) for _ in range(2)]

    def status(run_id: str) -> str:
        return Run.objects.filter(pk=run_id).values_list("status", flat=True).get()

    def pending():
        return ApprovalRequest.objects.filter(
            run_id__in=runs.values(), status=ApprovalStatus.PENDING
        )

    def needs_me() -> bool:
        return (
            not all(w.alive() for w in alive)
            or pending().exists()
            or all(status(r) in FINISHED for r in runs.values())
        )

    while True:
        wait_until(needs_me, 90, what="a dead worker, an approval or every run's end")
        for req in pending().order_by("id"):
            edited = answers[example[req.run_id]].pop(0)  # IndexError: asked once too often
            approval_decide(request_id=req.pk, user=alice, approve=True, edited=edited)
        for i, worker in enumerate(alive):
            if not worker.alive():
                worker.reap()
                alive[i] = workers.start(LG_CRASH_AT=CRASH_AT, **WORKER_ENV)
        if all(status(r) in FINISHED for r in runs.values()):
            break
    crashed = {p for p in CRASH_AT.split(",") if (proc_env.dir / f"lg-crashed-{p}").exists()}
    assert crashed == set(CRASH_AT.split(","))  # every run lost its worker once

    out = {name: Run.objects.get(pk=run_id) for name, run_id in runs.items()}
    for run in out.values():
        assert run.status == RunStatus.SUCCEEDED, (run.workflow_name, run.error)
    values = {name: run.output_value() for name, run in out.items()}
    assert values["review"] == {"generated_text": "improved"}
    assert values["age"] == {"age": 30}
    assert values["asked"]["status"] == "approved"
    assert values["context"]["log"] == ["first:anthropic", "second:anthropic"]
    assert sorted(values["jokes"]["jokes"]) == [
        "Joke about birds",
        "Joke about cats",
        "Joke about dogs",
    ]
    # not the docs' outcome ([] for a user's first message): the node's second run reads
    # the memory its killed run wrote -- a store write is not undone with the node's
    # unsaved writes (docs/langgraph.md, "What is and is not durable")
    assert values["memory"]["seen"] == ["likes tea"]
    # every answer was used, and no approval was asked again after the crash
    assert answers == {"review": [], "age": [], "asked": []}
    requests = Counter(
        example[r]
        for r in ApprovalRequest.objects.filter(run_id__in=runs.values()).values_list(
            "run_id", flat=True
        )
    )
    assert requests == Counter({"review": 1, "age": 2, "asked": 1})

    # node runs: an interrupted node runs again on each resume (LangGraph's rule); past
    # that, only the node killed ran a second time
    nodes = Counter((line["example"], line["node"]) for line in lg.hook_lines())
    assert nodes == Counter(
        {
            ("review", "review"): 1 + 1 + 1,  # asked; resumed (killed); again
            ("age", "collect_age"): 1 + 1 + 1 + 1,  # asked; asked again; valid (killed); again
            ("asked", "confirm"): 1 + 1 + 1,
            ("context", "first"): 1,
            ("context", "second"): 2,
            ("jokes", "generate_joke[cats]"): 1,
            ("jokes", "generate_joke[dogs]"): 2,
            ("jokes", "generate_joke[birds]"): 1,
            ("memory", "call_model"): 2,
        }
    )
    # the chat model was asked twice in all: the node killed after its calls ran again
    # around the recorded replies (LLM steps)
    assert lg.chat_calls() == ["outline otters", "draft from re: outline otters"]
    assert values["chat"]["draft"] == "re: draft from re: outline otters"
    chat_steps = Step.objects.filter(run_id=runs["chat"], kind="llm").order_by("position")
    assert [st.step_id for st in chat_steps] == ["write.llm", "write.llm#2"]
    assert out["chat"].tokens_used == 14

    # the memory is written once (the node computes its key again), and the next run of
    # the user sees it, as the docs' "Memory store" says
    assert LangGraphStoreItem.objects.filter(namespace="memories.u1").count() == 1
    second = start_graph("lg.memory", {"message": "hates rain"}, context={"user_id": "u1"})
    second = wait_for_run(second.id, timeout=30)
    assert second.status == RunStatus.SUCCEEDED, second.error
    assert second.output_value()["seen"] == ["likes tea"]
