"""A graph run's stream read as LangGraph's ``graph.stream`` yields it: :func:`stream`.

The caller's side of :mod:`durable.contrib.langgraph.streaming`: the run's stream
(:func:`durable.stream`: what was written, then live) turned back into LangGraph's v1
shapes -- a chunk for one mode, ``(mode, chunk)`` for a list of modes, ``(ns, ...)``
first with ``subgraphs=True`` -- where a ``messages`` chunk is ``(AIMessageChunk,
metadata)``, rebuilt from a chat step's ``token`` and ``tool_call_*`` events, or a
message LangGraph streamed from a model or a node in the super-step.

At an ``interrupted`` event (a lost worker, a failed try) nothing is yielded: what
follows is the step run again. A chat step's new try streams a new message (another
``id``), whose metadata says ``"durable_interrupted": {"reason", "message"}``; the nodes
of a super-step that runs again stream what they do again (their ``custom`` writes,
their models' messages), except the ``updates`` of the nodes whose writes were saved.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from durable.contrib.langgraph.streaming import decode, stream_modes
from durable.vocabulary import StreamKind

#: the kind of a graph run's stream event -> its stream mode
MODE_OF = {
    StreamKind.GRAPH_VALUES: "values",
    StreamKind.GRAPH_UPDATES: "updates",
    StreamKind.GRAPH_CUSTOM: "custom",
    StreamKind.GRAPH_MESSAGES: "messages",
}
_MISSING: Any = object()


class GraphStream:
    """The chunks of graph run ``run_id`` in LangGraph's shapes (iterate it once).

    ``last_seq``: the ``seq`` of the last stream event read (pass it as ``after=`` to go
    on after a ``TimeoutError``)."""

    def __init__(
        self,
        run_id: str,
        modes: tuple[str, ...],
        *,
        single: bool,
        subgraphs: bool,
        after: int,
        poll: float,
        timeout: float | None,
    ) -> None:
        self.run_id = run_id
        self.modes = modes
        self.single = single
        self.subgraphs = subgraphs
        self.last_seq = after
        self.poll = poll
        self.timeout = timeout
        self.tries: dict[str, dict[str, Any]] = {}  # chat step -> its try being streamed
        self.cut: dict[str, dict[str, Any]] = {}  # chat step -> why its last try was cut

    def __iter__(self) -> Iterator[Any]:
        import durable

        events = durable.stream(
            self.run_id, after=self.last_seq, poll=self.poll, timeout=self.timeout
        )
        for event in events:
            self.last_seq = event["seq"]
            for ns, mode, chunk in self.chunks(event):
                if ns and not self.subgraphs:
                    continue
                shaped = chunk if self.single else (mode, chunk)
                if self.subgraphs:
                    shaped = (ns, shaped) if self.single else (ns, mode, chunk)
                yield shaped

    def chunks(self, event: dict[str, Any]) -> list[tuple[tuple[str, ...], str, Any]]:
        """``(ns, mode, chunk)`` of the run's stream event ``event`` (none, one)."""
        kind, data, step = event["kind"], event["data"] or {}, event["step_id"]
        mode = MODE_OF.get(kind)
        if mode is not None:
            if mode not in self.modes:
                return []
            chunk = decode(data.get("chunk"))
            if mode == "messages":
                chunk = (chunk[0], _metadata(chunk[1]))
            return [(tuple(data.get("ns") or ()), mode, chunk)]
        if "messages" not in self.modes:
            return []
        return self.chat(kind, data, step, event["seq"])

    def chat(
        self, kind: str, data: dict[str, Any], step: str, seq: int
    ) -> list[tuple[tuple[str, ...], str, Any]]:
        """A chat step's event as a ``messages`` chunk (``AIMessageChunk``)."""
        from langchain_core.messages import AIMessageChunk
        from langchain_core.messages.tool import tool_call_chunk

        if kind == StreamKind.INTERRUPTED:
            self.tries.pop(step, None)
            self.cut[step] = data
            return []
        if kind == StreamKind.STEP_STARTED:
            if "metadata" in data:
                self._start(step, data, seq)
            return []
        now = self.tries.get(step) or self._find(step, seq)
        if now is None:
            return []
        fields: dict[str, Any] = {"content": "", "id": now["id"]}
        if kind == StreamKind.TOKEN:
            fields["content"] = data.get("delta") or ""
        elif kind == StreamKind.TOOL_CALL_STARTED:
            call = tool_call_chunk(name=data.get("name"), args="", id=data.get("id"))
            fields["tool_call_chunks"] = [{**call, "index": data.get("index")}]
        elif kind == StreamKind.TOOL_CALL_DELTA:
            call = tool_call_chunk(args=data.get("delta") or "", index=data.get("index"))
            fields["tool_call_chunks"] = [call]
        elif kind == StreamKind.STEP_ENDED:
            self.tries.pop(step, None)
            if "error" in data:
                return []  # the try failed: the call is asked again (``interrupted``)
            fields["chunk_position"] = "last"
            fields["response_metadata"] = {
                "finish_reason": data.get("finish_reason"),
                "model_name": now["model"],
            }
            usage = data.get("usage") or {}
            if usage:
                fields["usage_metadata"] = {
                    "input_tokens": usage.get("prompt_tokens") or 0,
                    "output_tokens": usage.get("completion_tokens") or 0,
                    "total_tokens": usage.get("total_tokens") or 0,
                }
        else:
            return []  # tool_call_ended: LangChain has no such chunk
        return [(now["ns"], "messages", (AIMessageChunk(**fields), dict(now["metadata"])))]

    def _start(self, step: str, data: dict[str, Any], seq: int) -> dict[str, Any]:
        metadata = _metadata(data.get("metadata") or {})
        if step in self.cut:
            metadata["durable_interrupted"] = self.cut.pop(step)
        ns: tuple[str, ...] = ()
        if metadata.get("langgraph_checkpoint_ns"):
            from langgraph.pregel._messages import graph_namespace

            ns = graph_namespace(metadata)
        now = {
            "id": f"lc_run--durable-{self.run_id}-{seq}",
            "metadata": metadata,
            "ns": ns,
            "model": data.get("model"),
        }
        self.tries[step] = now
        return now

    def _find(self, step: str, seq: int) -> dict[str, Any] | None:
        """The try of chat step ``step`` whose start came before this reader's ``after``."""
        from durable.models.streams import StreamEvent

        started = (
            StreamEvent.objects.filter(
                run_id=self.run_id, step_id=step, seq__lt=seq, kind=StreamKind.STEP_STARTED
            )
            .order_by("-seq")
            .values_list("seq", "data")
            .first()
        )
        if started is None or "metadata" not in (started[1] or {}):
            return None
        return self._start(step, started[1], started[0])


def _metadata(data: Any) -> dict[str, Any]:
    """A message's metadata as LangGraph gives it (its tuples were lists in JSON)."""
    metadata = dict(decode(data) or {})
    for key in ("langgraph_triggers", "langgraph_path"):
        if isinstance(metadata.get(key), list):
            metadata[key] = _tuple(metadata[key])
    return metadata


def _tuple(value: Any) -> Any:
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def run_modes(run: Any) -> tuple[str, ...] | None:
    """The stream modes graph run ``run`` writes; ``None`` when its workflow is not
    registered in this process (its modes are not known here)."""
    from durable.contrib.langgraph.graph import ENVELOPE
    from durable.contrib.langgraph.graphs import STREAM_MODES

    declared = STREAM_MODES.get((run.workflow_name, run.workflow_version))
    if declared is None:
        return None
    data = run.input_value()
    extra: list[str] = []
    if isinstance(data, dict) and set(data) == {ENVELOPE}:
        extra = data[ENVELOPE].get("stream_mode") or []
    return (*declared, *(m for m in extra if m not in declared))


def _default_mode(name: Any, version: str | None) -> str:
    """The compiled graph's ``stream_mode`` (a ``StateGraph``'s: ``"updates"``), when the
    workflow is registered here (the latest version for a name); else ``"updates"``."""
    from durable.contrib.langgraph.graphs import _builders
    from durable.contrib.langgraph.graphs import compiled as _graph
    from durable.registry import get_workflow

    if version is None:
        try:
            version = get_workflow(name).version
        except Exception:  # noqa: BLE001 - durable.start says what is wrong with the name
            return "updates"
    built = _builders.get((name, version))
    if built is None:
        return "updates"
    mode = getattr(_graph(name, version, *built), "stream_mode", "updates")
    return mode if isinstance(mode, str) else "updates"


def _registered(name: Any) -> bool:
    """Whether ``name`` is a workflow registered in this process."""
    from durable.registry import get_workflow

    try:
        get_workflow(name)
    except Exception:  # noqa: BLE001 - not here (durable.start says what is wrong)
        return False
    return True


def stream(
    target: Any,
    input: Any = _MISSING,
    *,
    stream_mode: str | list[str] | None = None,
    subgraphs: bool = False,
    version: str = "v1",
    context: Any = None,
    run_id: str | None = None,
    after: int = 0,
    poll: float = 0.25,
    timeout: float | None = None,
    **options: Any,
) -> GraphStream:
    """LangGraph's ``graph.stream`` for a graph run: its chunks, live, from the run's stream.

    ``stream(name, input, stream_mode=...)`` starts a run of the graph workflow ``name``
    (:func:`~durable.contrib.langgraph.graph.start_graph` with ``context=``,
    ``run_id=`` and ``options``; it writes ``stream_mode``) and follows it;
    ``stream(run_id)`` (or a ``Run``) follows a run that is there: what it streamed
    since ``after`` (its ``seq``), then live. ``stream_mode``: ``"values"``,
    ``"updates"``, ``"custom"``, ``"messages"``, or a list of them; by default the
    compiled graph's own, as ``graph.stream``'s (a ``StateGraph``'s: ``"updates"``).
    Yields a mode's chunks, or ``(mode, chunk)`` for a list, with ``ns`` first when
    ``subgraphs=True`` (v1 shapes; ``messages``: ``(AIMessageChunk | message,
    metadata)``). Ends when the run ends or waits (an ``interrupt()`` in the inbox), as
    :func:`durable.stream` does; ``poll`` and ``timeout`` are its own (``TimeoutError``).

    Returns a :class:`GraphStream` (its ``run_id``; iterate it). Raises ``ValueError``
    for an unknown or unsupported mode (``debug``, ``checkpoints``, ``tasks``), a mode
    the run does not write, a ``version`` other than ``"v1"``, a graph workflow's name
    without ``input`` or another workflow's with it; :class:`~durable.RunNotFound` for an
    unknown run.
    """
    from durable.contrib.langgraph.graph import start_graph
    from durable.contrib.langgraph.graphs import STREAM_MODES
    from durable.exceptions import RunNotFound
    from durable.models import Run

    where = f"stream({getattr(target, 'id', target)!r})"
    run = None
    if input is _MISSING:
        run = target if isinstance(target, Run) else Run.objects.filter(pk=target).first()
    if stream_mode is None:  # the graph's own, as graph.stream's default
        workflow = (run.workflow_name, run.workflow_version) if run else (target, None)
        stream_mode = _default_mode(*workflow)
        single = True
    else:
        single = isinstance(stream_mode, str)
    modes = stream_modes(stream_mode, where=where)
    if not modes:
        raise ValueError(f"{where}: stream_mode names no mode")
    if version != "v1":
        raise ValueError(f"{where}: version={version!r}: a graph run streams LangGraph's v1 shapes")
    follow: dict[str, Any] = {
        "single": single,
        "subgraphs": subgraphs,
        "poll": poll,
        "timeout": timeout,
    }
    if input is not _MISSING:
        if not any(name == target for name, _ in STREAM_MODES) and _registered(target):
            raise ValueError(f"{where}: workflow {target!r} is not a graph workflow")
        run = start_graph(
            target, input, context=context, run_id=run_id, stream_mode=list(modes), **options
        )
        return GraphStream(run.id, modes, after=0, **follow)
    if context is not None or run_id is not None or options:
        raise ValueError(f"{where}: context=, run_id= and options start a run: pass input")
    if run is None:
        if any(name == target for name, _ in STREAM_MODES):
            raise ValueError(f"{where}: {target!r} is a graph workflow: pass input to start a run")
        raise RunNotFound(str(target))
    written = run_modes(run)
    missing = [m for m in modes if written is not None and m not in written]
    if missing:
        raise ValueError(
            f"{where}: run {run.id} does not write stream_mode {missing[0]!r} (it writes "
            f"{list(written or ()) or 'none'}): start it with stream_mode=, or declare "
            "graph_workflow(..., stream_mode=)"
        )
    return GraphStream(run.id, modes, after=after, **follow)
