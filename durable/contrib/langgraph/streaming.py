"""A graph run's stream modes, written to the run's stream as the graph runs.

A graph workflow's run writes LangGraph's stream modes ``values``, ``updates``,
``custom`` and ``messages`` into the run's stream (docs/streaming.md) while each
super-step runs in the worker, as events ``graph_values``, ``graph_updates``,
``graph_custom`` and ``graph_messages`` with ``{"ns", "chunk"}`` (``ns``: the subgraph's
namespace, ``[]`` for the graph itself; ``chunk``: what LangGraph's ``graph.stream``
yields, as JSON, LangChain messages as ``{"__lc__": {"type", "data"}}``). The replies of
``durable_chat_model`` are not among them: the model step streams them (``step_started``
with the ``metadata`` LangGraph gives a message, ``token``, ``tool_call_*``), and
:mod:`durable.contrib.langgraph.reader` turns both back into LangGraph's shapes.

Invariant: the stream reads as one ``graph.stream`` of the whole run, although the run
calls ``graph.stream`` once per super-step: the state each call emits before it runs
anything (the last ``values`` again) is dropped, except the input's and a human resume's
(as LangGraph's own resume emits it); the interrupts that are Durable steps
(``call_tool``, ``call_model``, ``durable_chat_model``) and the super-step breakpoint
(``{"__interrupt__": ()}``) are dropped; a chat step's reply that a node returns is not
sent again as a whole message. A super-step that runs again (a lost worker, a failed
try) says so first (``interrupted``, step ``superstep-N``) and does not repeat the
``updates`` of the nodes whose writes were saved. A replayed super-step writes nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from durable.vocabulary import StreamKind

#: the stream modes a graph run writes (LangGraph's names)
MODES = ("values", "updates", "custom", "messages")
#: LangGraph's stream modes a graph run does not write, and why
UNSUPPORTED = {
    "debug": "a graph run's debug events are its steps' records (the dashboard)",
    "checkpoints": "a graph run's checkpoints are in DurableSaver (get_state_history)",
    "tasks": "a graph run's tasks are its super-steps' records",
}
#: mode -> the kind of its events
KINDS = {
    "values": StreamKind.GRAPH_VALUES,
    "updates": StreamKind.GRAPH_UPDATES,
    "custom": StreamKind.GRAPH_CUSTOM,
    "messages": StreamKind.GRAPH_MESSAGES,
}
#: the keys of an ``interrupt()`` value that is a Durable step, not a question
STEP_MARKERS = ("__durable_tool__", "__durable_llm__", "__durable_chat__")
LC = "__lc__"
INTERRUPT = "__interrupt__"


def stream_modes(value: Any, *, where: str) -> tuple[str, ...]:
    """``value`` (a mode, a list of modes or ``None``) as a tuple of modes, in order,
    without repeats. Raises ``ValueError`` naming ``where`` and the mode for a mode that
    is unknown or not written by a graph run (``debug``, ``checkpoints``, ``tasks``)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(m, str) for m in items):
        raise ValueError(f"{where}: stream_mode is a mode or a list of modes, not {value!r}")
    modes: list[str] = []
    for mode in items:
        if mode in UNSUPPORTED:
            raise ValueError(
                f"{where}: stream_mode {mode!r} is not supported by a graph run "
                f"({UNSUPPORTED[mode]}); the modes are {', '.join(MODES)}"
            )
        if mode not in MODES:
            raise ValueError(
                f"{where}: unknown stream_mode {mode!r}; the modes are {', '.join(MODES)}"
            )
        if mode not in modes:
            modes.append(mode)
    return tuple(modes)


# --- the chunks as JSON and back ----------------------------------------------------------


def encode(value: Any, depth: int = 0) -> Any:
    """A chunk as JSON: LangChain messages as ``{"__lc__": message_to_dict(...)}``,
    LangGraph's ``Interrupt`` as ``{"__interrupt__": {"value", "id"}}``, pydantic models
    dumped, tuples as lists, anything else not JSON as its ``repr``."""
    if depth > 40:
        return repr(value)[:200]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): encode(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [encode(v, depth + 1) for v in value]
    from langchain_core.messages import BaseMessage, message_to_dict
    from langgraph.types import Interrupt

    if isinstance(value, BaseMessage):
        return {LC: json.loads(json.dumps(message_to_dict(value), default=repr))}
    if isinstance(value, Interrupt):
        return {INTERRUPT: {"value": encode(value.value, depth + 1), "id": value.id}}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        with contextlib.suppress(Exception):
            return encode(dump(mode="json"), depth + 1)
    return repr(value)[:2000]


def decode(value: Any) -> Any:
    """What :func:`encode` made, with the messages and interrupts rebuilt."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {LC}:
        from langchain_core.messages import messages_from_dict

        return messages_from_dict([value[LC]])[0]
    if set(value) == {INTERRUPT} and isinstance(value[INTERRUPT], dict):
        from langgraph.types import Interrupt

        found = value[INTERRUPT]
        return Interrupt(value=decode(found.get("value")), id=found.get("id") or "")
    return {k: decode(v) for k, v in value.items()}


def is_step_interrupt(value: Any) -> bool:
    """An ``interrupt()`` value that is a Durable step (a tool, model or chat call)."""
    return isinstance(value, dict) and any(marker in value for marker in STEP_MARKERS)


def chat_metadata(model: Any) -> dict[str, Any]:
    """What LangGraph's ``messages`` mode gives with a message of ``model`` called in the
    node running now: the node's run metadata (``langgraph_node``, ``langgraph_step``,
    ``langgraph_path``, ...) and the model's ``ls_*`` parameters, as JSON."""
    metadata: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # outside a graph: the interrupt says so
        from langgraph.config import get_config

        metadata.update(get_config().get("metadata") or {})
    params = getattr(model, "_get_ls_params", None)
    if callable(params):
        with contextlib.suppress(Exception):
            metadata.update(params())
    return encode({k: v for k, v in metadata.items() if not k.startswith("__")})


# --- one super-step's stream --------------------------------------------------------------


class SuperstepStream:
    """The stream modes of one super-step of a graph run (a context manager around its
    ``graph.stream``, in the step's body). ``lead``: the super-step applies the run's
    input or a human's answer (its first ``values`` is new); ``chat_ids``: the ids of
    the chat steps' replies (streamed by their steps)."""

    def __init__(
        self, ctx: Any, step_id: str, modes: tuple[str, ...], *, lead: bool, chat_ids: set[str]
    ) -> None:
        self.ctx = ctx
        self.step_id = step_id
        self.modes = modes
        self.lead = lead
        self.chat_ids = chat_ids
        self.writer: Any = None
        self.streamed: Counter[str] = Counter()  # node -> updates written by earlier tries
        self.values_before = False
        self.started = False  # a task of this call started

    def stream_mode(self) -> list[str]:
        """``graph.stream``'s ``stream_mode``: the super-step's ``tasks`` (its record)
        and this run's modes."""
        return ["tasks", *self.modes]

    def __enter__(self) -> SuperstepStream:
        from durable.models.streams import StreamEvent

        earlier = StreamEvent.objects.filter(run_id=self.ctx.run_id, step_id=self.step_id)
        for kind, data in earlier.values_list("kind", "data"):
            if kind == StreamKind.GRAPH_VALUES and not (data or {}).get("ns"):
                self.values_before = True
            elif kind == StreamKind.GRAPH_UPDATES and not (data or {}).get("ns"):
                self.streamed.update(k for k in (data or {}).get("chunk") or {} if k[:2] != "__")
        self.writer = self.ctx._stream_writer(self.step_id)
        try:
            self.writer.interrupted_before()
        except BaseException:
            self.writer.close()
            raise
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        from durable.runtime.failures import safe_str

        if exc is None:
            self.writer.close()
            return
        if isinstance(exc, Exception):  # so the next try says "failed", not "worker_lost"
            self.writer.emit(StreamKind.STEP_ENDED, {"error": safe_str(exc)[:500]})
        with contextlib.suppress(BaseException):  # the step's own failure is reported
            self.writer.close()

    def tasks(self, events: Iterable[Any]) -> Iterator[dict[str, Any]]:
        """The graph's own ``tasks`` events of ``graph.stream(..., subgraphs=True)``'s
        ``(ns, mode, chunk)``; the chunks of the run's modes go to the stream."""
        for ns, mode, chunk in events:
            if mode == "tasks":
                if not ns:
                    self.started = True
                    yield chunk
                continue
            self.write(tuple(ns), mode, chunk)

    def write(self, ns: tuple[str, ...], mode: str, chunk: Any) -> None:
        """Write one chunk of ``mode`` (what LangGraph yields), unless it is dropped."""
        if mode == "values":
            if not ns and not self.started and (not self.lead or self.values_before):
                return  # the state again, at the start of a call that continues the run
            if isinstance(chunk, dict) and INTERRUPT in chunk:
                kept = self.human(chunk[INTERRUPT])
                if not kept:
                    return  # a Durable step's interrupt: the node runs again with its answer
                chunk = {**chunk, INTERRUPT: kept}
        elif mode == "updates":
            if not isinstance(chunk, dict):
                return
            if INTERRUPT in chunk:
                kept = self.human(chunk[INTERRUPT])
                if not kept:
                    return
                chunk = {**chunk, INTERRUPT: kept}
            cached = (chunk.get("__metadata__") or {}).get("cached")
            if cached and not ns:
                nodes = [k for k in chunk if k[:2] != "__"]
                if nodes and all(self.streamed[n] > 0 for n in nodes):
                    self.streamed.subtract(nodes)  # an earlier try wrote it
                    return
        elif mode == "messages":
            message, metadata = chunk
            if getattr(message, "id", None) in self.chat_ids:
                return  # a chat step's reply, returned by its node: its step streamed it
            chunk = (message, {k: v for k, v in (metadata or {}).items() if k[:2] != "__"})
        self.writer.emit(KINDS[mode], {"ns": list(ns), "chunk": encode(chunk)})

    @staticmethod
    def human(interrupts: Any) -> tuple[Any, ...]:
        """The interrupts that are questions (not a Durable step's)."""
        return tuple(i for i in interrupts or () if not is_step_interrupt(getattr(i, "value", i)))


# --- a chat step's reply, streamed --------------------------------------------------------


def streamed_reply(model: Any, messages: list[Any], kwargs: dict[str, Any], emit: Any) -> Any:
    """``model.stream(messages, **kwargs)``, each chunk's text and tool-call fragments
    given to ``emit(kind, data)`` as the run's stream events (``token``,
    ``tool_call_started``, ``tool_call_delta``, ``tool_call_ended``); returns the
    chunks added up, as the ``AIMessage`` ``invoke`` returns."""
    from langchain_core.messages import message_chunk_to_message

    from durable.runtime.llm_stream import Assembly

    assembly = Assembly()
    total = None
    for chunk in model.stream(messages, **kwargs):
        total = chunk if total is None else total + chunk
        for kind, data in assembly.add(openai_delta(chunk)):
            emit(kind, data)
    for kind, data in assembly.end_tool_calls():
        emit(kind, data)
    if total is None:
        raise RuntimeError(f"chat model {model!r} streamed no reply")
    return message_chunk_to_message(total)


def openai_delta(chunk: Any) -> dict[str, Any]:
    """A LangChain ``AIMessageChunk`` as the ``chat.completion.chunk`` dict that
    :class:`~durable.runtime.llm_stream.Assembly` reads."""
    text = chunk.text if isinstance(chunk.text, str) else chunk.text()
    calls = [
        {
            "index": c.get("index"),
            "id": c.get("id"),
            "function": {"name": c.get("name"), "arguments": c.get("args")},
        }
        for c in getattr(chunk, "tool_call_chunks", None) or []
    ]
    finish = (getattr(chunk, "response_metadata", None) or {}).get("finish_reason")
    delta = {"content": text, "tool_calls": calls}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
