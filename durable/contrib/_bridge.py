"""Run an async agent framework inside a synchronous workflow, ctx staying on its thread.

Invariant: every ``ctx`` call happens on the workflow thread, in the order the agent
asks for it. The agent's coroutine runs on the process's agent event loop, in a helper
thread;
when it needs a durable call it hands a callable to the workflow thread and awaits the
answer, so the engine's state, its database connection and its lease checks never leave
the thread that owns them. A step whose body is async (a model request, an async tool)
runs that body back on the agent's loop (``run_on_loop``), which is idle meanwhile: the
loop's clients (an ``httpx.AsyncClient``) are only ever used from that one loop.
Engine control flow raised by ``ctx`` (a suspension for a wait, a lost lease) cancels
the agent's coroutine and is raised again on the workflow thread, unchanged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: the idempotency key of the tool step running in this context (``None`` outside one)
_tool_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "durable_tool_idempotency_key", default=None
)


def current_idempotency_key() -> str | None:
    """Inside a framework tool's body run as a durable step: the step's idempotency key
    ``"{run_id}:{step_id}"``, the same on every attempt and after a crash (pass it to a
    service that deduplicates writes, as Stripe's ``Idempotency-Key``); else ``None``."""
    return _tool_key.get()


async def with_key(key: str, make: Callable[[], Awaitable[T]]) -> T:
    """Await ``make()`` with :func:`current_idempotency_key` answering ``key``."""
    token = _tool_key.set(key)
    try:
        return await make()
    finally:
        _tool_key.reset(token)


class _Aborted(BaseException):
    """Raised into the agent's coroutine when the engine stopped the execution."""


class LoopBridge:
    """One agent run's event loop thread and the workflow thread serving its ctx calls.

    ``run(factory)`` (workflow thread) starts ``factory()`` on a new loop and serves
    ``await call(fn)`` requests until it finishes; returns its result or raises its
    exception. Engine control flow (``BaseException`` that is not an ``Exception``)
    raised by a served call stops the agent and is re-raised by ``run``.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None
        ] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: BaseException | None = None

    def run(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        loop = _agent_loop()
        self._loop = loop
        main: list[asyncio.Task[Any]] = []

        async def wrapper() -> T:
            task = asyncio.current_task()
            if task is not None:
                main.append(task)
            return await factory()

        done = asyncio.run_coroutine_threadsafe(wrapper(), loop)
        done.add_done_callback(lambda _: self._requests.put(None))
        while (item := self._requests.get()) is not None:
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue  # its task was cancelled meanwhile (a tripped guardrail): not run
            if self._stopped is not None:
                fut.set_exception(_Aborted())
                continue
            try:
                fut.set_result(fn())
            except Exception as exc:
                fut.set_exception(exc)
            except BaseException as exc:  # engine control flow: stop the agent, keep it
                self._stopped = exc
                fut.set_exception(_Aborted())
                if main:
                    loop.call_soon_threadsafe(main[0].cancel)
        if self._stopped is not None:
            raise self._stopped
        try:
            return done.result()
        except BaseExceptionGroup as group:  # a task group around a single failure
            single = _single(group)
            if single is not None:
                raise single from None
            raise

    async def call(self, fn: Callable[[], T]) -> T:
        """From the agent's loop: run ``fn()`` on the workflow thread, return its result."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((fn, fut))
        return await asyncio.wrap_future(fut)

    def run_on_loop(self, make: Callable[[], Awaitable[T]]) -> T:
        """From the workflow thread (inside a step): run ``make()`` on the agent's loop."""
        assert self._loop is not None

        async def runner() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(runner(), self._loop).result()


_shared: tuple[int, asyncio.AbstractEventLoop] | None = None
_shared_lock = threading.Lock()


def _agent_loop() -> asyncio.AbstractEventLoop:
    """The process's agent loop, running forever in a daemon thread (a new one after a
    fork). One loop for every execution, because SDKs keep clients bound to the loop
    they were first used on (the OpenAI Agents SDK shares one ``httpx.AsyncClient``)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid() or _shared[1].is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="durable-agent-loop", daemon=True
            ).start()
            _shared = (os.getpid(), loop)
        return _shared[1]


def _single(group: BaseExceptionGroup[Any]) -> BaseException | None:
    """The one exception at the leaves of nested groups, or ``None`` when several."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else None
