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

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from langgraph.types import Command, interrupt

from durable.contrib.langgraph.chat import CHAT_MARKER, chat_step
from durable.contrib.langgraph.forks import continue_fork as _continue_fork
from durable.contrib.langgraph.forks import fork_graph
from durable.contrib.langgraph.forks import forked_at as _forked_at
from durable.contrib.langgraph.graphs import STREAM_MODES, _builders
from durable.contrib.langgraph.graphs import compiled as _graph
from durable.contrib.langgraph.interrupts import (
    BREAKPOINTS,
    RESUME_KEY,
    RESUME_KINDS,
    ask,
    breakpoint_message,
    human,
    resume_value,
    valid_kind,
)
from durable.contrib.langgraph.serde import jsonable as _jsonable
from durable.contrib.langgraph.serde import record_json as _record
from durable.contrib.langgraph.streaming import SuperstepStream, stream_modes
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
    name: str,
    input: Any = None,
    *,
    context: Any = None,
    run_id: str | None = None,
    stream_mode: str | list[str] | None = None,
    **options: Any,
) -> Any:
    """Start a run of the graph workflow ``name``: LangGraph's ``invoke(input, context=)``.

    ``context``: the run-time context of the graph (its ``context_schema``: a dict, a
    dataclass or a pydantic model), stored with the run's input as JSON and given to
    every super-step as ``context=`` (rebuilt as the schema's type). ``stream_mode``:
    the stream modes this run writes (with the workflow's ``stream_mode=``; read them with
    :func:`~durable.contrib.langgraph.reader.stream`). ``options``: the
    other keywords of :func:`durable.start`. Returns the :class:`~durable.models.Run`;
    raises what :func:`durable.start` raises (e.g. ``PayloadError`` for a context that
    cannot be stored), and :class:`~durable.DurableConfigurationError` for LangGraph's
    run-time ``interrupt_before=``/``interrupt_after=`` (static breakpoints: not
    supported; call ``interrupt()`` in the node); ``ValueError`` for an unknown or
    unsupported stream mode.
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
    envelope: dict[str, Any] = {ENVELOPE: {"input": input, "context": context}}
    if stream_mode is not None:
        modes = stream_modes(stream_mode, where=f"start_graph({name!r})")
        envelope[ENVELOPE]["stream_mode"] = list(modes)
    return durable.start(name, envelope, run_id=run_id, **options)


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
    stream_mode: str | list[str] | None = None,
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

    ``stream_mode``: LangGraph's stream modes (``"values"``, ``"updates"``, ``"custom"``,
    ``"messages"``, or a list) that every run writes to the run's stream (a run started
    with :func:`start_graph`'s ``stream_mode=`` writes those too); ``None``: none.

    Raises :class:`~durable.DurableConfigurationError` like ``@durable.workflow`` for a
    bad name or version, and for an unknown ``resume`` kind, ``durability`` or stream
    mode. Returns
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

    try:
        modes = stream_modes(stream_mode, where=f"graph_workflow({name!r})")
    except ValueError as exc:
        raise DurableConfigurationError(str(exc)) from None

    _builders[(name, str(version))] = (build_graph, store)
    STREAM_MODES[(name, str(version))] = modes

    def run_graph(ctx: Any, input: Any) -> Any:
        graph = _graph(name, str(version), build_graph, store)
        return _drive(
            ctx,
            graph,
            input,
            approvers=approvers,
            resume=resume,
            durability=durability,
            stream_mode=modes,
        )

    run_graph.__qualname__ = f"graph_workflow[{name}]"
    run_graph.__doc__ = f"The LangGraph graph of {getattr(build_graph, '__qualname__', name)}."
    return workflow(
        name=name,
        version=version,
        max_steps=max_steps,
        deadline_seconds=deadline_seconds,
        durability=DURABILITY[durability],
    )(run_graph)


# --- the driver: runs in the workflow function, deterministic on replay ---------------


def _drive(
    ctx: Any,
    graph: Any,
    input: Any,
    *,
    approvers: str | None,
    resume: str | dict[str, str] | None = None,
    durability: str = "sync",
    stream_mode: tuple[str, ...] = (),
) -> Any:
    context = None
    modes = stream_mode
    if isinstance(input, dict) and set(input) == {ENVELOPE}:
        context = _context(graph, input[ENVELOPE].get("context"))
        modes = (*modes, *(m for m in input[ENVELOPE].get("stream_mode") or () if m not in modes))
        input = input[ENVELOPE].get("input")
    chat_ids: set[str] = set()  # the chat steps' replies (streamed by their steps)
    lead = True
    payload: dict[str, Any] = {"input": input}
    seen: dict[str, int] = {}
    # LangGraph's sync mode keeps the step synchronous (None: "sync" for a plain step)
    mode = None if durability == "sync" else DURABILITY[durability]
    n = 0
    while True:
        n += 1
        out = SuperstepStream(ctx, f"superstep-{n}", modes, lead=lead, chat_ids=chat_ids)
        step = functools.partial(
            _superstep,
            graph,
            ctx.run_id,
            context=context,
            durability=durability,
            stream=out if modes else None,
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
                    answers[iid] = _tool_answer(ctx, pending, stream="messages" in modes)
                    if isinstance(answers[iid], dict) and "message" in answers[iid]:
                        chat_ids.add(str((answers[iid]["message"].get("data") or {}).get("id")))
                    continue
                # one node asking twice raises two interrupts with one id: each gets
                # its own wait (the id and how often it was asked)
                seen[iid] = seen.get(iid, 0) + 1
                key = iid if seen[iid] == 1 else f"{iid}.{seen[iid]}"
                humans.append((iid, human(pending, key, approvers, resume)))
            lead = bool(humans)  # LangGraph's resume emits the state again
            _ask_together(ctx, humans, answers)
            payload = {"resume": answers, "after": after}
        elif record["done"]:
            return record["values"]
        else:
            lead = False
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


def _tool_answer(ctx: Any, pending: dict[str, Any], *, stream: bool = False) -> Any:
    """A :func:`call_tool`, :func:`call_model` or chat model interrupt (``durable_chat_model``):
    the Durable step's result. ``stream``: the run streams ``messages`` (a chat model's
    reply streams through its step)."""
    value = pending["value"]
    node = pending.get("node") or "node"
    if CHAT_MARKER in value:
        return chat_step(ctx, f"{node}.llm", value[CHAT_MARKER], stream=stream)
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
    stream: SuperstepStream | None = None,
) -> dict[str, Any]:
    """Run the graph to its next super-step boundary; return the step's record.
    ``stream``: the run's stream modes, written as the super-step runs."""
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
    with stream or contextlib.nullcontext():
        _run(graph, arg, config, context, durability, stream, nodes)
    records = []
    for entry in nodes.values():
        if "started" in entry:
            entry["seconds"] = round(time.time() - entry.pop("started"), 6)
        records.append(entry)
    return _summary(graph, config, records)


def _run(
    graph: Any,
    arg: Any,
    config: Any,
    context: Any,
    durability: str,
    stream: SuperstepStream | None,
    nodes: dict[str, dict[str, Any]],
) -> None:
    """``graph.stream`` to the super-step's end: its tasks in ``nodes``, its chunks of the
    run's stream modes in the run's stream."""
    events = graph.stream(
        arg,
        config,
        context=context,
        stream_mode=stream.stream_mode() if stream else "tasks",
        interrupt_after="*",
        durability=durability,
        subgraphs=stream is not None,
    )
    for event in stream.tasks(events) if stream else events:
        task_id: Any = event.get("id")
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
