"""Following a durable PydanticAI run from outside the worker, in PydanticAI's shapes.

Invariant: what a follower yields is read from the run's stream (``durable.stream``),
never from the model: any process may follow a run, a run already over is followed from
its history, and a run that is taken over by another worker after a crash is followed
through it. The run's own record stays the result: :meth:`StreamedRun.get_output` is
the run's output (``DurableAgent.result``), whatever was streamed before it.

The text is the text of the model request streaming now: each model request (and each
new try of one, after an ``interrupted`` event) starts over, so the last text yielded
is the final answer's, as PydanticAI's ``stream_text()`` ends with the output.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from django.db import close_old_connections, connection
from pydantic import TypeAdapter, ValidationError
from pydantic_ai.exceptions import UserError

import durable
from durable.observability import logcontext
from durable.vocabulary import TERMINAL, RunStatus, StreamKind

#: the names PydanticAI gives its output tools (``final_result``, ``final_result_<Type>``)
OUTPUT_TOOL_PREFIX = "final_result"

_END = object()

#: seconds of one read of the run's stream: a reader that went away is seen within it
WINDOW = 2.0


class _Reader:
    """One reader's view of the run's stream: the current request's text and the
    arguments of its output tool call. :meth:`feed` returns what an event makes:
    ``("delta", str)``, ``("text", str)``, ``("output", value)``."""

    def __init__(self, output_types: list[Any]) -> None:
        #: the output is text: its partial outputs are the text
        self.textual = output_types == [str]
        #: a single structured output type: its partial outputs are validated from the
        #: output tool's arguments (several types: only the run's output is yielded)
        self.adapter = (
            TypeAdapter(output_types[0])
            if len(output_types) == 1 and output_types[0] is not str
            else None
        )
        self.text: list[str] = []
        self.args: list[str] = []
        self.output_index: int | None = None
        #: ``interrupted`` events seen: tries cut off and asked again
        self.restarts = 0

    def _reset(self) -> None:
        self.text, self.args, self.output_index = [], [], None

    def feed(self, event: dict[str, Any]) -> list[tuple[str, Any]]:
        kind, data = event["kind"], event.get("data") or {}
        if kind in (StreamKind.STEP_STARTED, StreamKind.INTERRUPTED):
            if kind == StreamKind.INTERRUPTED:
                self.restarts += 1
            self._reset()
        elif kind == StreamKind.TOKEN:
            self.text.append(data["delta"])
            text = "".join(self.text)
            out: list[tuple[str, Any]] = [("delta", data["delta"]), ("text", text)]
            return out + ([("output", text)] if self.textual else [])
        elif kind == StreamKind.TOOL_CALL_STARTED:
            if str(data.get("name", "")).startswith(OUTPUT_TOOL_PREFIX):
                self.output_index, self.args = data.get("index"), []
        elif kind == StreamKind.TOOL_CALL_DELTA and data.get("index") == self.output_index:
            self.args.append(data["delta"])
            if self.adapter is not None:
                try:
                    partial = self.adapter.validate_json(
                        "".join(self.args), experimental_allow_partial="trailing-strings"
                    )
                except (ValidationError, ValueError):
                    return []
                return [("output", partial)]
        return []


class _Follower:
    """What the sync and async followers share: the run, the reader, the end."""

    def __init__(
        self,
        agent: Any,
        run_id: str,
        *,
        after: int = 0,
        poll: float = 0.25,
        timeout: float | None = None,
    ) -> None:
        self.agent = agent
        self.run_id = str(run_id)
        #: the ``seq`` of the last event read (pass it as ``after`` to follow on)
        self.last_seq = after
        self.poll = poll
        self.timeout = timeout
        self._reader = _Reader(agent.output_types)

    @property
    def restarts(self) -> int:
        """How many tries were cut off and asked again (``interrupted`` events read)."""
        return self._reader.restarts

    def _stream(self, stop: threading.Event | None = None) -> Iterator[dict[str, Any]]:
        """``durable.stream`` from the last event read, in windows of ``WINDOW`` seconds
        so that ``stop`` (set: a reader that went away) is seen while the run is quiet;
        ``TimeoutError`` past the follower's ``timeout``."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            left = WINDOW if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                for event in durable.stream(
                    self.run_id, self.last_seq, poll=self.poll, timeout=min(WINDOW, left)
                ):
                    self.last_seq = event["seq"]
                    yield event
                    if stop is not None and stop.is_set():
                        return
                return
            except TimeoutError:
                if stop is not None and stop.is_set():
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"run {self.run_id} still streams after {self.timeout} s (the last "
                        f"event read: seq {self.last_seq}; follow on with after={self.last_seq})"
                    ) from None

    def _final(self) -> list[Any]:
        """The run's output once its stream ended: ``[output]`` when it succeeded,
        ``[]`` when it waits; raises :class:`durable.RunFailed` when it ended otherwise."""
        from durable.client import RunFailed

        run = durable.get_run(self.run_id)
        if run.status == RunStatus.SUCCEEDED:
            return [self.agent.decode(run.output_value()).output]
        if run.status in TERMINAL:
            raise RunFailed(run)
        return []


class StreamedRun(_Follower):
    """A durable run of a :class:`DurableAgent` followed as it streams (synchronous),
    in the shapes of PydanticAI's ``StreamedRunResultSync``.

    ``stream_text(delta=False)`` yields the text of the model request streaming now,
    whole at each new token (``delta=True``: each new piece); ``stream_output()`` the
    output as it arrives (text; or a structured output validated from the partial
    arguments of its output tool), then the run's output; ``stream_events()`` the run's
    stream events as ``durable.stream`` gives them. Each reads the stream on from the
    last event read and ends when the run ended or waits (an approval). At an
    ``interrupted`` event (a worker lost mid-stream, a failed try) the text starts over
    with the new try; with ``delta=True`` the cut-off try's pieces have been yielded
    already: check :attr:`restarts`, or use ``delta=False``. :meth:`get_output` waits
    for the run's output. ``debounce_by`` is taken for PydanticAI's signature and not
    used: the run's stream is already batched by its writer (50 ms). Raises
    :class:`durable.RunNotFound`, ``TimeoutError`` (past ``timeout`` seconds),
    :class:`durable.RunFailed` (``stream_output``, ``get_output``).
    """

    def stream_events(self) -> Iterator[dict[str, Any]]:
        for event in self._stream():
            self._reader.feed(event)
            yield event

    def stream_text(
        self, *, delta: bool = False, debounce_by: float | None = None
    ) -> Iterator[str]:
        wanted = "delta" if delta else "text"
        for event in self._stream():
            for kind, value in self._reader.feed(event):
                if kind == wanted:
                    yield value

    def stream_output(self, *, debounce_by: float | None = None) -> Iterator[Any]:
        last: Any = _END
        for event in self._stream():
            for kind, value in self._reader.feed(event):
                if kind == "output" and value != last:
                    last = value
                    yield value
        for value in self._final():
            if value != last:
                yield value

    def get_output(self, timeout: float | None = 60.0) -> Any:
        """The run's output, waiting up to ``timeout`` seconds (``DurableAgent.result``)."""
        return self.agent.result(self.run_id, timeout).output


def _in_thread(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` for a worker thread: its database connection closed after."""
    try:
        return fn(*args)
    finally:
        connection.close()


class AsyncStreamedRun(_Follower):
    """:class:`StreamedRun` for ``async`` code, in the shapes of PydanticAI's
    ``StreamedRunResult``: ``async for`` over ``stream_text()``, ``stream_output()``,
    ``stream_events()``; ``await get_output()``. The run's stream is read by a thread
    of its own (the database is not read on the event loop)."""

    async def _astream(self) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()

        def pump() -> None:
            close_old_connections()
            try:
                for event in self._stream(stop):
                    loop.call_soon_threadsafe(queue.put_nowait, event)
                loop.call_soon_threadsafe(queue.put_nowait, _END)
            except BaseException as exc:  # handed to the reader, raised there
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                connection.close()

        thread = threading.Thread(target=pump, name="durable-pai-follow", daemon=True)
        thread.start()
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()

    async def stream_events(self) -> AsyncIterator[dict[str, Any]]:
        async for event in self._astream():
            self._reader.feed(event)
            yield event

    async def stream_text(
        self, *, delta: bool = False, debounce_by: float | None = None
    ) -> AsyncIterator[str]:
        wanted = "delta" if delta else "text"
        async for event in self._astream():
            for kind, value in self._reader.feed(event):
                if kind == wanted:
                    yield value

    async def stream_output(self, *, debounce_by: float | None = None) -> AsyncIterator[Any]:
        last: Any = _END
        async for event in self._astream():
            for kind, value in self._reader.feed(event):
                if kind == "output" and value != last:
                    last = value
                    yield value
        for value in await asyncio.to_thread(_in_thread, self._final):
            if value != last:
                yield value

    async def get_output(self, timeout: float | None = 60.0) -> Any:
        """The run's output, waiting up to ``timeout`` seconds (``DurableAgent.result``)."""
        result = await asyncio.to_thread(_in_thread, self.agent.result, self.run_id, timeout)
        return result.output


def refuse_inside_a_run(what: str) -> None:
    """PydanticAI's durable integrations refuse ``run_stream`` inside a workflow; so
    does this: a run's code streams through an ``event_stream_handler``."""
    run_id = logcontext.current().get("run_id")
    if run_id:
        raise UserError(
            f"DurableAgent.{what}() cannot be used inside a durable workflow (run {run_id}): "
            "it starts a run and follows its stream from outside. Inside a run, set an "
            "event_stream_handler (Agent(..., event_stream_handler=...) or "
            "DurableAgent(..., event_stream_handler=...)): it gets PydanticAI's events as "
            "they arrive."
        )


def run_stream_sync(agent: Any, prompt: str | None, options: dict[str, Any]) -> StreamedRun:
    """``agent.start(prompt, stream=True, **options)``, followed: a :class:`StreamedRun`."""
    refuse_inside_a_run("run_stream_sync")
    follow = _follow_options(options)
    run = agent.start(prompt, stream=True, **options)
    return StreamedRun(agent, run.id, **follow)


@asynccontextmanager
async def run_stream(
    agent: Any, prompt: str | None, options: dict[str, Any]
) -> AsyncIterator[AsyncStreamedRun]:
    """``async with``: the run started (in a thread) and an :class:`AsyncStreamedRun`."""
    refuse_inside_a_run("run_stream")
    follow = _follow_options(options)
    run = await asyncio.to_thread(_in_thread, lambda: agent.start(prompt, stream=True, **options))
    yield AsyncStreamedRun(agent, run.id, **follow)


def _follow_options(options: dict[str, Any]) -> dict[str, Any]:
    """The follower's own options (``poll``, ``timeout``), taken out of ``start``'s."""
    return {k: options.pop(k) for k in ("poll", "timeout") if k in options}
