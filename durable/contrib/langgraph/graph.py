"""Graphs as durable runs: :func:`graph_workflow`, :func:`call_tool` and the driver.

A graph workflow runs a compiled LangGraph graph with :class:`DurableSaver` and the run
id as ``thread_id``, one **super-step per Durable step** (``superstep-1``,
``superstep-2``...): the step runs the graph until the next super-step boundary
(``interrupt_after="*"``) and records what each node did (its input, its output or
error, its duration). A super-step that fails is retried as a step; LangGraph keeps the
writes of the nodes that finished, so only the failed node runs again. After a crash
the run is replayed: the recorded super-steps return their records without running and
the graph resumes from its last checkpoint in the database.

Interrupts. When a super-step stops on ``interrupt(value)`` calls, each interrupt is
handled on its own, in the order recorded, matched by its id:

- a human interrupt becomes ``ctx.wait_for_approval(key=<interrupt id>, ...)``, an
  approval in the inbox whose details are ``value``; the approver approves, rejects or
  answers with JSON (an edit of the value);
- a :func:`call_tool` interrupt becomes ``ctx.call_tool(name, params)``: the write goes
  through the operation ledger with its idempotency key and safety class (and its
  approval, if the tool requires one).

The graph then resumes with ``Command(resume={interrupt_id: answer, ...})``, only for
interrupts still pending (an answer cannot resume a later interrupt).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from langgraph.types import Command, interrupt

from durable.contrib.langgraph.saver import DurableSaver
from durable.exceptions import PermanentError
from durable.registry import workflow

__all__ = ["TOOL_MARKER", "call_tool", "graph_workflow"]

#: the key that marks an interrupt raised by :func:`call_tool`
TOOL_MARKER = "__durable_tool__"
#: node inputs and outputs recorded with a step are cut to a preview above this size
RECORD_LIMIT = 32_000

_graphs: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


def call_tool(name: str, params: dict[str, Any] | None = None) -> Any:
    """Call the registered Durable tool ``name`` from inside a node of a graph workflow.

    The node stops (a LangGraph interrupt), the run makes the call as a Durable tool
    step (``ctx.call_tool``: ledger, idempotency key ``"{run_id}:{step_id}"``, safety
    class, approval) and the node runs again from its start, getting the recorded
    result here. So code before ``call_tool`` in a node runs again: keep side effects
    in tools. Returns the tool's result, or ``{"error": message, "error_type": ...,
    "details": ...}`` when the call returned a ``ModelRecoverable`` (rejected, unknown
    tool, wrong arguments). Outside a graph workflow it raises LangGraph's
    ``RuntimeError`` (no runnable context) or leaves the graph interrupted.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("call_tool: name must be a non-empty tool name")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"call_tool({name!r}): params must be a dict, not {type(params).__name__}")
    return interrupt({TOOL_MARKER: name, "params": dict(params or {})})


def graph_workflow(
    name: str,
    version: str,
    build_graph: Callable[[], Any],
    *,
    approvers: str | None = None,
    max_steps: int | None = None,
    deadline_seconds: float | None = None,
) -> Callable[..., Any]:
    """Register a Durable workflow ``name``/``version`` that runs ``build_graph()``'s graph.

    ``build_graph``: returns a LangGraph ``StateGraph`` (compiled here with
    :class:`DurableSaver`) or a compiled graph (its checkpointer is replaced); called
    once per process. The run's input is the graph's input; the run's output is the
    graph's final state (as JSON). ``approvers``: the group that may answer the graph's
    interrupts. Raises :class:`~durable.DurableConfigurationError` like
    ``@durable.workflow`` for a bad name or version. Returns the workflow function.
    """

    def run_graph(ctx: Any, input: Any) -> Any:
        graph = _graph(name, str(version), build_graph)
        return _drive(ctx, graph, input, approvers=approvers)

    run_graph.__qualname__ = f"graph_workflow[{name}]"
    run_graph.__doc__ = f"The LangGraph graph of {getattr(build_graph, '__qualname__', name)}."
    return workflow(
        name=name, version=version, max_steps=max_steps, deadline_seconds=deadline_seconds
    )(run_graph)


def _graph(name: str, version: str, build_graph: Callable[[], Any]) -> Any:
    with _lock:
        graph = _graphs.get((name, version))
        if graph is None:
            built = build_graph()
            if hasattr(built, "compile"):
                graph = built.compile(checkpointer=DurableSaver())
            elif hasattr(built, "checkpointer") and hasattr(built, "stream"):
                graph = built.copy(update={"checkpointer": DurableSaver()})
            else:
                raise TypeError(
                    f"graph_workflow({name!r}): build_graph must return a StateGraph or a "
                    f"compiled graph, not {type(built).__name__}"
                )
            _graphs[(name, version)] = graph
    return graph


# --- the driver: runs in the workflow function, deterministic on replay ---------------


def _drive(ctx: Any, graph: Any, input: Any, *, approvers: str | None) -> Any:
    payload: dict[str, Any] = {"input": input}
    seen: dict[str, int] = {}
    n = 0
    while True:
        n += 1
        step = functools.partial(_superstep, graph, ctx.run_id)
        record = ctx.step(f"superstep-{n}", step, payload)
        after = record.get("checkpoint_id")
        if record["interrupts"]:
            answers = {}
            for pending in record["interrupts"]:
                # one node asking twice raises two interrupts with one id: each gets
                # its own wait (the id and how often it was asked)
                iid = pending["id"]
                seen[iid] = seen.get(iid, 0) + 1
                key = iid if seen[iid] == 1 else f"{iid}.{seen[iid]}"
                answers[iid] = _answer(ctx, pending, key, approvers)
            payload = {"resume": answers, "after": after}
        elif record["done"]:
            return record["values"]
        else:
            payload = {"after": after}


def _answer(ctx: Any, pending: dict[str, Any], key: str, approvers: str | None) -> Any:
    value = pending["value"]
    if isinstance(value, dict) and TOOL_MARKER in value:
        node = pending.get("node") or "node"
        result = ctx.call_tool(
            value[TOOL_MARKER], value.get("params") or {}, step_id=f"{node}.{value[TOOL_MARKER]}"
        )
        if getattr(result, "is_error", False) and hasattr(result, "to_dict"):
            return {"error": result.message, **result.to_dict()}
        return result
    wrapped = not isinstance(value, dict)
    details = {"value": value} if wrapped else value
    decision = ctx.wait_for_approval(
        key,
        title=_title(pending),
        payload=details,
        approvers=approvers,
        allow_edit=True,
    )
    answer = decision.edited
    if wrapped and isinstance(answer, dict) and set(answer) == {"value"}:
        answer = answer["value"]
    return {
        "approved": decision.approved,
        "answer": answer,
        "comment": decision.comment,
        "decided_by": list(decision.decided_by),
    }


def _title(pending: dict[str, Any]) -> str:
    value = pending["value"]
    text = None
    if isinstance(value, dict):
        text = value.get("title") or value.get("question")
    elif isinstance(value, str):
        text = value
    node = pending.get("node") or "graph"
    return f"{node}: {str(text or 'asks for a decision')[:180]}"


# --- one super-step: runs inside a Durable step ---------------------------------------


def _superstep(graph: Any, thread_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Run the graph to its next super-step boundary; return the step's record."""
    config: Any = {"configurable": {"thread_id": thread_id}}
    state = graph.get_state(config)
    started = state.created_at is not None
    if "input" not in payload and not started:
        raise PermanentError(
            f"the LangGraph state of run {thread_id} is not in the database (thread_id "
            f"{thread_id!r} has no checkpoint): a graph run resumes only from its own "
            "checkpoints (a fork of a graph run, or a pruned thread, cannot continue)"
        )
    after = payload.get("after")
    if after and _checkpoint_id(state) != after:
        # an earlier attempt of this step ran the super-step and crashed before the
        # step was recorded: record where the graph is, do not run the next one
        return _summary(graph, config, [], recovered=True)
    arg: Any = None
    if "input" in payload and not started:
        arg = payload["input"]
    elif "resume" in payload:
        still = {i.id for task in state.tasks for i in task.interrupts}
        answers = {k: v for k, v in payload["resume"].items() if k in still}
        arg = Command(resume=answers) if answers else None
    if started and not state.tasks:  # finished before this step was recorded
        # (not ``state.next``: a task whose writes were saved before its super-step's
        # checkpoint -- the worker killed in between -- is not "next", but the graph is
        # not done: resuming applies its writes and goes on)
        return _summary(graph, config, [])
    nodes: dict[str, dict[str, Any]] = {}
    for event in graph.stream(arg, config, stream_mode="tasks", interrupt_after="*"):
        task_id = event.get("id")
        entry = nodes.setdefault(task_id, {"node": event.get("name"), "started": time.time()})
        if "input" in event:
            entry["input"] = _record(event["input"])
        else:
            entry["seconds"] = round(time.time() - entry.pop("started"), 6)
            if event.get("error") is not None:
                entry["error"] = repr(event["error"])[:2000]
            elif event.get("interrupts"):
                entry["interrupted"] = True
            else:
                entry["output"] = _record(event.get("result"))
    records = []
    for entry in nodes.values():
        if "started" in entry:
            entry["seconds"] = round(time.time() - entry.pop("started"), 6)
        records.append(entry)
    return _summary(graph, config, records)


def _checkpoint_id(state: Any) -> str | None:
    return ((state.config or {}).get("configurable") or {}).get("checkpoint_id")


def _summary(
    graph: Any, config: Any, nodes: list[dict[str, Any]], *, recovered: bool = False
) -> dict[str, Any]:
    state = graph.get_state(config)
    interrupts = [
        {"id": i.id, "node": task.name, "value": _jsonable(i.value)}
        for task in state.tasks
        for i in task.interrupts
    ]
    done = not state.tasks and not interrupts
    summary = {
        "langgraph_step": (state.metadata or {}).get("step"),
        "checkpoint_id": _checkpoint_id(state),
        "nodes": nodes,
        "next": list(state.next),
        "interrupts": interrupts,
        "done": done,
        "values": _jsonable(state.values) if done else None,
    }
    if recovered:
        summary["recovered"] = True  # the nodes ran in an attempt that crashed
    return summary


def _record(value: Any) -> Any:
    """``value`` as JSON for the step's record; a preview when it is large."""
    data = _jsonable(value)
    text = json.dumps(data, default=repr)
    if len(text) > RECORD_LIMIT:
        return {"preview": text[:2000], "bytes": len(text)}
    return data


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-able copy: messages and models through ``model_dump``, others as ``repr``."""
    if depth > 40:
        return repr(value)[:200]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v, depth + 1) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return _jsonable(dump(mode="json"), depth + 1)
        except Exception:  # noqa: BLE001 - a model that cannot dump is shown as repr
            return repr(value)[:2000]
    return repr(value)[:2000]
