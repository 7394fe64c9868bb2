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

What ``interrupt()`` returns. The inbox decision maps to the value the graph expects, as
declared by the interrupt (its value's ``"durable_resume"`` key, or :func:`ask`) or by
the workflow (``graph_workflow(..., resume=...)``): ``"approve"`` gives ``True`` or
``False``, ``"edit"`` the edited value, ``"answer"`` the approver's answer, and
``"decision"`` Durable's decision dict ``{"approved", "answer", "comment",
"decided_by"}`` -- which is also what a workflow registered without ``resume=`` gets,
so existing workflow versions and the runs waiting in them resume as they were started.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from langgraph.types import Command, interrupt

from durable.contrib.langgraph.chat import CHAT_MARKER, chat_step
from durable.contrib.langgraph.interrupts import (
    BREAKPOINTS,
    RESUME_KEY,
    RESUME_KINDS,
    ask,
    breakpoint_message,
    human,
    refuse_breakpoints,
    resume_value,
    valid_kind,
)
from durable.contrib.langgraph.saver import DurableSaver
from durable.exceptions import PermanentError
from durable.registry import workflow

__all__ = [
    "RESUME_KEY",
    "RESUME_KINDS",
    "TOOL_MARKER",
    "ask",
    "call_model",
    "call_tool",
    "fork_graph",
    "graph_workflow",
    "start_graph",
]

#: the key that marks an interrupt raised by :func:`call_tool`
TOOL_MARKER = "__durable_tool__"
#: the key that marks an interrupt raised by :func:`call_model`
MODEL_MARKER = "__durable_llm__"
#: the keys of interrupts that are Durable steps, not questions for a human
STEP_MARKERS = {TOOL_MARKER, MODEL_MARKER, CHAT_MARKER}
#: the key of a run input made by :func:`start_graph` (the graph's input and context)
ENVELOPE = "__durable_graph__"
#: LangGraph's ``durability=`` modes -> the checkpoint mode of the super-step steps
DURABILITY = {"sync": "sync", "async": "batched", "exit": "batched"}
#: node inputs and outputs recorded with a step are cut to a preview above this size
RECORD_LIMIT = 32_000

_graphs: dict[tuple[str, str], Any] = {}
#: (name, version) -> (build_graph, store) of every graph workflow, for fork_graph
_builders: dict[tuple[str, str], tuple[Callable[[], Any], Any]] = {}
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


def call_model(
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    model: str | None = None,
    **options: Any,
) -> Any:
    """A chat completion from inside a node of a graph workflow, recorded as an LLM step.

    ``messages`` (OpenAI chat format, JSON), ``tools``, ``model`` and ``options`` are
    :meth:`ctx.llm <durable.context.WorkflowContext.llm>`'s. The node stops (a LangGraph
    interrupt), the run makes the call as a Durable LLM step (``<node>.llm``,
    ``<node>.llm#2``...: request, response, tokens and cost recorded; tokens count
    against the run's ``max_tokens``) and the node runs again from its start, getting
    the recorded response here: a crash or a retry never asks the model again. Returns
    ``ctx.llm``'s dict (``{"content", "tool_calls", "usage", ...}``), or ``{"error":
    message, "error_type": ..., "details": ...}`` for a ``ModelRecoverable``. Raises
    ``ValueError`` for messages that are not a list of dicts.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("call_model: messages must be a list of chat messages (dicts)")
    request = {"messages": messages, "tools": tools, "model": model, "options": options}
    return interrupt({MODEL_MARKER: request})


def start_graph(
    name: str, input: Any = None, *, context: Any = None, run_id: str | None = None, **options: Any
) -> Any:
    """Start a run of the graph workflow ``name``: LangGraph's ``invoke(input, context=)``.

    ``context``: the run-time context of the graph (its ``context_schema``: a dict, a
    dataclass or a pydantic model), stored with the run's input as JSON and given to
    every super-step as ``context=`` (rebuilt as the schema's type). ``options``: the
    other keywords of :func:`durable.start`. Returns the :class:`~durable.models.Run`;
    raises what :func:`durable.start` raises (e.g. ``PayloadError`` for a context that
    cannot be stored), and :class:`~durable.DurableConfigurationError` for LangGraph's
    run-time ``interrupt_before=``/``interrupt_after=`` (static breakpoints: not
    supported; call ``interrupt()`` in the node).
    """
    import durable
    from durable.exceptions import DurableConfigurationError

    for option in BREAKPOINTS:
        if option in options:
            raise DurableConfigurationError(
                breakpoint_message(f"start_graph({name!r})", option, options[option])
            )
    if context is not None and not isinstance(context, dict):
        dump = getattr(context, "model_dump", None)
        if callable(dump):
            context = dump(mode="json")
        elif dataclasses.is_dataclass(context) and not isinstance(context, type):
            context = dataclasses.asdict(context)
    envelope = {ENVELOPE: {"input": input, "context": context}}
    return durable.start(name, envelope, run_id=run_id, **options)


def fork_graph(
    run_id: str,
    *,
    from_step: str,
    values: Any = None,
    as_node: str | None = None,
    by: Any = None,
    reason: str = "",
    new_run_id: str | None = None,
) -> Any:
    """Fork the graph run ``run_id`` at ``from_step`` with LangGraph's ``update_state``.

    The new run (:func:`durable.fork`: the steps before ``from_step`` are reused) gets a
    copy of the run's thread, and ``graph.update_state(<the checkpoint before
    from_step>, values, as_node=as_node)`` is applied to it, as LangGraph's time travel
    does; the graph then continues from that state. ``values=None`` with ``as_node=None``
    continues from the checkpoint unchanged (as a plain :func:`durable.fork` does).
    ``from_step``: a ``superstep-N`` with N >= 2 (``superstep-1`` has no state before
    it: start a new run instead). All in one transaction: a worker never sees the fork
    without its state. Returns the new :class:`~durable.models.Run`; raises ``ValueError``
    for a run that is not a graph run or a ``from_step`` that is not a later super-step,
    LangGraph's ``InvalidUpdateError`` for an update it refuses, and what
    :func:`durable.fork` raises.
    """
    import uuid

    from django.db import transaction

    import durable
    from durable.models import Run, Step

    source = Run.objects.get(pk=run_id)
    built = _builders.get((source.workflow_name, source.workflow_version))
    if built is None:
        raise ValueError(
            f"fork_graph: run {run_id} is not a run of a graph workflow registered here "
            f"({source.workflow_name} version {source.workflow_version})"
        )
    steps = list(Step.objects.filter(run_id=run_id).order_by("position"))
    ids = [st.step_id for st in steps]
    if not from_step.startswith("superstep-") or from_step not in ids:
        raise ValueError(f"fork_graph: {from_step!r} is not a super-step of run {run_id}")
    before = [st for st in steps[: ids.index(from_step)] if st.step_id.startswith("superstep-")]
    if not before:
        raise ValueError("fork_graph: superstep-1 has no state before it: start a new run")
    after = before[-1].output_value().get("checkpoint_id")
    graph = _graph(source.workflow_name, source.workflow_version, *built)
    new_id = new_run_id or f"{run_id}-fork-{uuid.uuid4().hex[:8]}"
    with transaction.atomic():
        run = durable.fork(run_id, from_step=from_step, by=by, reason=reason, new_run_id=new_id)
        DurableSaver().copy_thread(run_id, run.id)
        at = {"configurable": {"thread_id": run.id, "checkpoint_ns": "", "checkpoint_id": after}}
        graph.update_state(at, values, as_node=as_node or ("__copy__" if values is None else None))
    return run


def graph_workflow(
    name: str,
    version: str,
    build_graph: Callable[[], Any],
    *,
    approvers: str | None = None,
    max_steps: int | None = None,
    deadline_seconds: float | None = None,
    resume: str | dict[str, str] | None = None,
    durability: str = "sync",
    store: Any = None,
    interrupt_before: Any = None,
    interrupt_after: Any = None,
) -> Callable[..., Any]:
    """Register a Durable workflow ``name``/``version`` that runs ``build_graph()``'s graph.

    ``build_graph``: returns a LangGraph ``StateGraph`` (compiled here with
    :class:`DurableSaver`) or a compiled graph (its checkpointer is replaced); called
    once per process. The run's input is the graph's input (or :func:`start_graph`'s
    input and context); the run's output is the graph's final state (as JSON).
    ``approvers``: the group that may answer the graph's interrupts.

    ``resume``: what ``interrupt()`` returns -- one of :data:`RESUME_KINDS` for every
    interrupt, or ``{node name: kind}``; an interrupt's own ``"durable_resume"`` key
    (:func:`ask`) says it for that interrupt. ``None`` (the default, and the behaviour of
    versions registered before ``resume=`` existed): Durable's decision dict, unless the
    interrupt says otherwise. With ``resume`` given, an interrupt that no declaration
    covers, or whose own key contradicts it, fails the run at the interrupt with a
    :class:`~durable.PermanentError` naming the node.

    ``durability``: LangGraph's mode: ``"sync"`` (the default) records each super-step
    synchronously; ``"async"`` and ``"exit"`` let it be group-committed (Durable's
    ``batched``: a crash may run a super-step again, never a recorded model call).

    ``store``: a LangGraph ``BaseStore`` for the graph's long-term memory (nodes'
    ``store`` argument, ``runtime.store``), e.g. :class:`~durable.contrib.langgraph.store.
    DurableStore`; its writes are a node's side effects: a node that runs again writes
    again (put under a key the node can compute again, not a random one).

    Raises :class:`~durable.DurableConfigurationError` like ``@durable.workflow`` for a
    bad name or version, and for an unknown ``resume`` kind or ``durability``. Returns
    the workflow function. A graph compiled with ``interrupt_before=`` or
    ``interrupt_after=`` (static breakpoints) is refused when it is built, at its first
    run in a process: the run fails with a ``DurableConfigurationError`` naming the
    option (use ``interrupt()`` in the node); ``interrupt_before=``/``interrupt_after=``
    given here are refused at once, before anything is registered.
    """
    from durable.exceptions import DurableConfigurationError

    breakpoints = (("interrupt_before", interrupt_before), ("interrupt_after", interrupt_after))
    for option, nodes in breakpoints:
        if nodes is not None:  # refused here, before anything is registered
            raise DurableConfigurationError(
                breakpoint_message(f"graph_workflow({name!r})", option, nodes)
            )
    kinds: list[Any] = list(resume.values()) if isinstance(resume, dict) else [resume]
    bad = [k for k in kinds if k is not None and not valid_kind(k)]
    if bad or (resume is not None and not isinstance(resume, str | dict)):
        raise DurableConfigurationError(
            f"graph_workflow({name!r}, resume={resume!r}): a resume kind is one of "
            f"{RESUME_KINDS}, for every interrupt or as {{node name: kind}}"
        )
    if durability not in DURABILITY:
        raise DurableConfigurationError(
            f"graph_workflow({name!r}, durability={durability!r}): LangGraph's durability "
            f"is one of {tuple(DURABILITY)}"
        )

    _builders[(name, str(version))] = (build_graph, store)

    def run_graph(ctx: Any, input: Any) -> Any:
        graph = _graph(name, str(version), build_graph, store)
        return _drive(ctx, graph, input, approvers=approvers, resume=resume, durability=durability)

    run_graph.__qualname__ = f"graph_workflow[{name}]"
    run_graph.__doc__ = f"The LangGraph graph of {getattr(build_graph, '__qualname__', name)}."
    return workflow(
        name=name,
        version=version,
        max_steps=max_steps,
        deadline_seconds=deadline_seconds,
        durability=DURABILITY[durability],
    )(run_graph)


def _graph(name: str, version: str, build_graph: Callable[[], Any], store: Any = None) -> Any:
    with _lock:
        graph = _graphs.get((name, version))
        if graph is None:
            built = build_graph()
            if hasattr(built, "compile"):
                graph = built.compile(checkpointer=DurableSaver(), store=store)
            elif hasattr(built, "checkpointer") and hasattr(built, "stream"):
                update = {"checkpointer": DurableSaver()}
                if store is not None:
                    update["store"] = store
                graph = built.copy(update=update)
            else:
                raise TypeError(
                    f"graph_workflow({name!r}): build_graph must return a StateGraph or a "
                    f"compiled graph, not {type(built).__name__}"
                )
            refuse_breakpoints(f"graph_workflow({name!r})", graph)
            _graphs[(name, version)] = graph
    return graph


# --- the driver: runs in the workflow function, deterministic on replay ---------------


def _drive(
    ctx: Any,
    graph: Any,
    input: Any,
    *,
    approvers: str | None,
    resume: str | dict[str, str] | None = None,
    durability: str = "sync",
) -> Any:
    context = None
    if isinstance(input, dict) and set(input) == {ENVELOPE}:
        context = _context(graph, input[ENVELOPE].get("context"))
        input = input[ENVELOPE].get("input")
    payload: dict[str, Any] = {"input": input}
    seen: dict[str, int] = {}
    # LangGraph's sync mode keeps the step synchronous (None: "sync" for a plain step)
    mode = None if durability == "sync" else DURABILITY[durability]
    n = 0
    while True:
        n += 1
        step = functools.partial(
            _superstep, graph, ctx.run_id, context=context, durability=durability
        )
        record = ctx.step(f"superstep-{n}", step, payload, durability=mode)
        after = record.get("checkpoint_id")
        if record["interrupts"]:
            answers: dict[str, Any] = {}
            humans: list[tuple[str, Any]] = []  # (interrupt id, human(...)) to ask together
            for pending in record["interrupts"]:
                iid = pending["id"]
                value = pending["value"]
                if isinstance(value, dict) and (
                    {TOOL_MARKER, MODEL_MARKER, CHAT_MARKER} & set(value)
                ):
                    _ask_together(ctx, humans, answers)  # positions stay in recorded order
                    answers[iid] = _tool_answer(ctx, pending)
                    continue
                # one node asking twice raises two interrupts with one id: each gets
                # its own wait (the id and how often it was asked)
                seen[iid] = seen.get(iid, 0) + 1
                key = iid if seen[iid] == 1 else f"{iid}.{seen[iid]}"
                humans.append((iid, human(pending, key, approvers, resume)))
            _ask_together(ctx, humans, answers)
            payload = {"resume": answers, "after": after}
        elif record["done"]:
            return record["values"]
        else:
            payload = {"after": after}


def _ask_together(ctx: Any, humans: list[tuple[str, Any]], answers: dict[str, Any]) -> None:
    """Put ``humans``' approvals in the inbox together; wait for all; map the decisions."""
    if not humans:
        return
    decisions = ctx.wait_for_approvals([request for _, (request, *_) in humans])
    for (iid, (_, kind, details, wrapped)), decision in zip(humans, decisions, strict=True):
        answers[iid] = resume_value(decision, kind, details, wrapped)
    humans.clear()


def _context(graph: Any, data: Any) -> Any:
    """The run-time context, rebuilt as the graph's ``context_schema`` from its JSON."""
    schema = getattr(graph, "context_schema", None)
    if data is None or schema is None:
        return data
    from pydantic import TypeAdapter

    return TypeAdapter(schema).validate_python(data)


def _tool_answer(ctx: Any, pending: dict[str, Any]) -> Any:
    """A :func:`call_tool`, :func:`call_model` or chat model interrupt (``durable_chat_model``):
    the Durable step's result."""
    value = pending["value"]
    node = pending.get("node") or "node"
    if CHAT_MARKER in value:
        return chat_step(ctx, f"{node}.llm", value[CHAT_MARKER])
    if MODEL_MARKER in value:
        request = value[MODEL_MARKER]
        result = ctx.llm(
            request["messages"],
            tools=request.get("tools"),
            model=request.get("model"),
            step_id=f"{node}.llm",
            **(request.get("options") or {}),
        )
    else:
        result = ctx.call_tool(
            value[TOOL_MARKER], value.get("params") or {}, step_id=f"{node}.{value[TOOL_MARKER]}"
        )
    if getattr(result, "is_error", False) and hasattr(result, "to_dict"):
        return {"error": result.message, **result.to_dict()}
    return result


# --- one super-step: runs inside a Durable step ---------------------------------------


def _superstep(
    graph: Any,
    thread_id: str,
    payload: dict[str, Any],
    *,
    context: Any = None,
    durability: str = "sync",
) -> dict[str, Any]:
    """Run the graph to its next super-step boundary; return the step's record."""
    config: Any = {"configurable": {"thread_id": thread_id}}
    state = graph.get_state(config)
    started = state.created_at is not None
    after = payload.get("after")
    if "input" not in payload and not started:
        state = _continue_fork(graph, thread_id, after)
        after = _checkpoint_id(state)
        started = True
    if after and _checkpoint_id(state) != after and not _forked_at(state, after):
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
    stream = graph.stream(
        arg,
        config,
        context=context,
        stream_mode="tasks",
        interrupt_after="*",
        durability=durability,
    )
    for event in stream:
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


def _continue_fork(graph: Any, thread_id: str, after: str | None) -> Any:
    """A fork's first live super-step: its thread copied from the run it forks, at a
    copy of ``after`` (the checkpoint the fork continues from); returns that state."""
    from django.db import transaction

    from durable.models import Run

    source = Run.objects.filter(pk=thread_id).values_list("forked_from_id", flat=True).first()
    if not source or not after:
        raise PermanentError(
            f"the LangGraph state of run {thread_id} is not in the database (thread_id "
            f"{thread_id!r} has no checkpoint): a graph run resumes only from its own "
            "checkpoints or, forked, from those of the run it forks (a pruned thread "
            "cannot continue)"
        )
    at = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": after}}
    with transaction.atomic():
        DurableSaver().copy_thread(source, thread_id)
        if graph.get_state(at).created_at is None:
            raise PermanentError(
                f"run {thread_id} forks run {source}, whose thread has no checkpoint {after} "
                "(pruned?): the fork cannot continue"
            )
        graph.update_state(at, None, as_node="__copy__")
    return graph.get_state({"configurable": {"thread_id": thread_id}})


def _forked_at(state: Any, after: str) -> bool:
    """The graph stands on fork_graph's ``update_state`` of ``after``: go on from it."""
    source = (state.metadata or {}).get("source")
    parent = ((state.parent_config or {}).get("configurable") or {}).get("checkpoint_id")
    return source == "update" and parent == after


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
