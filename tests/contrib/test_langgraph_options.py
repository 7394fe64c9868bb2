"""LangGraph's run options on a graph workflow: ``durability=``, ``context=``, ``Send``."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest

import durable
from durable.contrib.langgraph import start_graph
from durable.contrib.langgraph.saver import DurableSaver
from durable.exceptions import DurableConfigurationError
from durable.models import Run, RunStatus, Step
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)


def nodes_run_of(lg) -> Counter:
    return Counter(line["node"] for line in lg.NODE_LOG)


def test_durability_async_makes_the_super_steps_batched(lg_workflows):
    run = drive(durable.start("lg.chain_async", {"log": []}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["log"] == ["a", "b", "c", "d"]
    modes = set(Step.objects.filter(run=run).values_list("durability", flat=True))
    assert modes == {"batched"}
    sync = drive(durable.start("lg.chain", {"log": []}).id)
    assert set(Step.objects.filter(run=sync).values_list("durability", flat=True)) == {"sync"}


def test_the_run_time_context_reaches_every_super_step(lg_workflows):
    """Graph API page, "Runtime context": ``graph.invoke(input, context=...)``; here
    ``start_graph(name, input, context=...)``. The context is not graph state: it is
    stored with the run's input and rebuilt as the ``context_schema`` for each
    super-step, also after a replay."""
    run = start_graph("lg.context", {"log": []}, context=lg_workflows.ContextSchema("anthropic"))
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["log"] == ["first:anthropic", "second:anthropic"]
    default = drive(start_graph("lg.context", {"log": []}, context={}).id)
    assert default.output_value()["log"] == ["first:openai", "second:openai"]


def test_send_fans_out_and_a_failed_branch_is_the_only_one_run_again(lg_workflows, monkeypatch):
    """Graph API page, "Send": one ``generate_joke`` per subject, in one super-step; the
    jokes reduce into the state. A branch that fails is retried alone: the others'
    writes are kept.

    The failing branch raises once the others' writes are saved: LangGraph ends a
    super-step at its first failure, and a branch that returns after that (on a loaded
    machine it can) has its writes dropped and runs again, as under LangGraph's own
    savers."""
    saved = threading.Condition()
    jokes_saved: list[str] = []
    put_writes = DurableSaver.put_writes

    def counting(self, config, writes, task_id, task_path=""):
        put_writes(self, config, writes, task_id, task_path)
        with saved:
            jokes_saved.extend(task_id for channel, _ in writes if channel == "jokes")
            saved.notify_all()

    monkeypatch.setattr(DurableSaver, "put_writes", counting)
    lg_workflows.BEFORE_FAIL.append(
        lambda: _wait_for(saved, lambda: len(jokes_saved) >= 2, "the other branches' writes")
    )
    lg_workflows.FAIL_SUBJECTS.add("dogs")
    run = drive(durable.start("lg.jokes", {"subjects": ["cats", "dogs", "birds"]}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sorted(run.output_value()["jokes"]) == [
        "Joke about birds",
        "Joke about cats",
        "Joke about dogs",
    ]
    runs = Counter(line["subject"] for line in lg_workflows.NODE_LOG)
    assert runs == Counter({"cats": 1, "dogs": 2, "birds": 1})
    step = Step.objects.get(run=run, step_id="superstep-1")
    assert step.attempts == 2


def test_model_calls_in_a_node_are_llm_steps_asked_once(lg_workflows, scripted_llm):
    """``call_model`` inside a node: each call is an LLM step (``write.llm``,
    ``write.llm#2``) with its tokens; the node re-runs around them, the later node fails
    once and is retried, and the model is asked exactly twice."""
    lg_workflows.FAIL_ONCE.add("check")
    run = drive(durable.start("lg.writer", {"topic": "otters", "log": []}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    llm_steps = Step.objects.filter(run=run, kind="llm").order_by("position")
    assert [s.step_id for s in llm_steps] == ["write.llm", "write.llm#2"]
    assert all(s.output_value()["usage"]["total_tokens"] > 0 for s in llm_steps)
    assert len(scripted_llm.log) == 2  # never asked again by the re-runs or the retry
    assert run.output_value()["draft"] == llm_steps[1].output_value()["content"]
    assert nodes_run_of(lg_workflows)["write-done"] == 1
    assert nodes_run_of(lg_workflows)["check"] == 2


@pytest.mark.parametrize("option", ["interrupt_before", "interrupt_after"])
def test_static_breakpoints_are_refused_not_run_past(lg_workflows, option):
    """LangGraph's static breakpoints stop a graph until ``invoke(None)``; the driver
    continues every super-step that way, so a breakpoint would be run past unnoticed.
    A graph compiled with one fails its run before any node runs, naming the option and
    ``interrupt()``; ``start_graph`` refuses the run-time option before making a run."""
    run = drive(durable.start(f"lg.breakpoint_{option.split('_')[1]}", {"log": []}).id)
    assert run.status == RunStatus.FAILED
    assert f"{option}=['b']" in run.error["message"]
    assert "interrupt() inside the node" in run.error["message"]
    assert nodes_run_of(lg_workflows) == Counter()
    before = Run.objects.count()
    with pytest.raises(DurableConfigurationError, match=f"{option}=.*interrupt\\(\\) inside"):
        start_graph("lg.chain", {"log": []}, **{option: ["b"]})
    assert Run.objects.count() == before


@pytest.mark.parametrize("option", ["interrupt_before", "interrupt_after"])
def test_graph_workflow_refuses_static_breakpoints_before_registering(option):
    """Given to ``graph_workflow`` itself, a breakpoint is refused with the advice, and
    no workflow is registered (not Python's bare TypeError for an unknown keyword)."""
    from durable import registry
    from durable.contrib.langgraph import graph_workflow

    with pytest.raises(DurableConfigurationError, match=f"{option}=.*interrupt\\(\\) inside"):
        graph_workflow("lg.refused_breakpoint", "1", lambda: None, **{option: ["b"]})
    assert all(spec.name != "lg.refused_breakpoint" for spec in registry.workflows())


def test_a_langchain_chat_model_in_a_node_is_an_llm_step_asked_once(lg_workflows):
    """``durable_chat_model(model).invoke(...)`` in a node: each call is an LLM step
    (tokens counted); the node re-runs around the recorded replies and once more after
    failing, and the model is asked exactly twice."""
    lg_workflows.FAIL_ONCE.add("chat-write")
    run = drive(durable.start("lg.chat_writer", {"topic": "otters", "log": []}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert lg_workflows.CHAT_CALLS == ["outline otters", "draft from re: outline otters"]
    assert run.output_value()["draft"] == "re: draft from re: outline otters"
    steps = Step.objects.filter(run=run, kind="llm").order_by("position")
    assert [s.step_id for s in steps] == ["write.llm", "write.llm#2"]
    assert steps[0].output_value()["usage"]["total_tokens"] == 7
    assert steps[1].tool_name == "counting-chat"
    run.refresh_from_db()
    assert run.tokens_used == 14
    assert nodes_run_of(lg_workflows)["chat-write-done"] == 2  # failed once, then again


def test_a_chat_model_call_counts_against_the_runs_token_budget(lg_workflows):
    """``max_tokens=5``: the first call is made (the budget is checked before a call),
    its 7 tokens spend the budget, the second call is refused."""
    run = drive(durable.start("lg.chat_writer", {"topic": "otters", "log": []}, max_tokens=5).id)
    assert run.status == RunStatus.FAILED
    assert lg_workflows.CHAT_CALLS == ["outline otters"]
    assert "budget max_tokens=5 exceeded (used 7)" in run.error["message"]


def test_durable_chat_model_refuses_two_models_under_one_name():
    from durable.contrib.langgraph import durable_chat_model
    from tests.contrib.lg_workflows import _counting_chat

    durable_chat_model(_counting_chat(), name="twice")
    with pytest.raises(ValueError, match="pass name="):
        durable_chat_model(_counting_chat(), name="twice")


def _wait_for(condition: threading.Condition, done: Callable[[], bool], what: str) -> None:
    with condition:
        if not condition.wait_for(done, timeout=120):
            raise AssertionError(f"waited 120 s for {what}")
