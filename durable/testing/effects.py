"""Every tool body a test's runs entered, with its idempotency key; tools stubbed out.

:class:`ToolRecorder` wraps the function of every registered tool (the registry's
specs are swapped for the test, and put back after it) so each time a body is entered
a :class:`ToolCall` is recorded: the tool, the parameters, the idempotency key the
engine gave it, the run and step, and how the body ended. That is what an external
system would have seen: a crash after the effect shows the call that happened, and a
recovery that repeated it shows it twice (with the same key, which the system must
deduplicate), or not at all when the ledger settled it by ``reconcile``.

:meth:`ToolRecorder.stub` replaces a tool's body (and optionally its ``reconcile``)
with a fake, keeping everything else of the tool: its name, safety, retry policy,
approval policy and signature (edits and arguments are checked against the real one).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from durable import registry
from durable.testing.crash import current_call

__all__ = ["ToolCall", "ToolRecorder"]


@dataclass(frozen=True)
class ToolCall:
    """One entry into a tool's body.

    ``outcome``: ``"returned"`` (``result`` is what it returned), ``"raised"``
    (``error`` is the exception) or ``"running"`` (it never ended: a crash inside it).
    ``idempotency_key``: the engine's ``"{run_id}:{step_id}"`` for the call, whether or
    not the tool takes it; ``""`` when the body ran outside a run."""

    tool: str
    params: dict[str, Any]
    idempotency_key: str
    run_id: str
    step_id: str
    outcome: str = "running"
    result: Any = None
    error: BaseException | None = None

    @property
    def returned(self) -> bool:
        """Whether the body returned: the effect happened, as far as the tool knows."""
        return self.outcome == "returned"


class ToolRecorder:
    """The tool calls of a test (see the module). ``calls``: every entry, in order."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self._lock = threading.Lock()
        self._saved: dict[str, registry.ToolSpec] | None = None

    def install(self) -> ToolRecorder:
        """Wrap every tool registered now (and :meth:`stub` those registered later)."""
        if self._saved is not None:
            raise RuntimeError("this ToolRecorder is already installed")
        registry.tools()  # discovery, and the lazy_module()s: their tools are wrapped too
        self._saved = dict(registry._tools)
        for name, spec in self._saved.items():
            registry._tools[name] = replace(spec, fn=self._recording(name, spec.fn, spec.fn))
        return self

    def uninstall(self) -> None:
        """Put the registry's specs back as they were (stubs removed)."""
        if self._saved is None:
            return
        for name in list(registry._tools):
            if name in self._saved:
                registry._tools[name] = self._saved[name]
        self._saved = None

    def stub(
        self,
        tool: str,
        fn: Callable[..., Any],
        *,
        reconcile: Callable[..., Any] | None = None,
    ) -> None:
        """Run ``fn`` instead of the body of the registered tool ``tool``, called as the
        tool would be (its parameters, and ``idempotency_key=`` when the tool takes
        it). ``reconcile``: the lookup of an unknown outcome, in place of the tool's own
        (``fn(params, *, idempotency_key)`` returning the result or
        ``durable.NOT_FOUND``). Raises :class:`~durable.ToolNotFound`."""
        if self._saved is None:
            raise RuntimeError("install the ToolRecorder before stubbing a tool")
        spec = self._saved.get(tool) or registry.get_tool(tool)
        self._saved.setdefault(tool, spec)
        registry._tools[tool] = replace(
            spec,
            fn=self._recording(tool, fn, spec.fn),
            reconcile=reconcile if reconcile is not None else spec.reconcile,
        )

    def _recording(
        self, tool: str, body: Callable[..., Any], signature_of: Callable[..., Any]
    ) -> Callable[..., Any]:
        recorder = self

        @functools.wraps(signature_of)  # the tool's own signature (inspect follows it)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            info = current_call.get()
            params = {k: v for k, v in kwargs.items() if k != "idempotency_key"}
            index = recorder._add(
                ToolCall(
                    tool=tool,
                    params=params,
                    idempotency_key=info.idempotency_key if info else "",
                    run_id=info.run_id if info else "",
                    step_id=info.step_id if info else "",
                )
            )
            try:
                result = body(*args, **kwargs)
            except Exception as exc:
                recorder._end(index, outcome="raised", error=exc)
                raise
            recorder._end(index, outcome="returned", result=result)
            return result

        return recorded

    def _add(self, call: ToolCall) -> int:
        with self._lock:
            self.calls.append(call)
            return len(self.calls) - 1

    def _end(self, index: int, **outcome: Any) -> None:
        with self._lock:
            self.calls[index] = replace(self.calls[index], **outcome)

    def of(self, tool: str | None = None, run_id: str | None = None) -> list[ToolCall]:
        """The calls of ``tool`` (all tools: ``None``) in runs ``run_id`` (all: ``None``)."""
        with self._lock:
            return [
                c
                for c in self.calls
                if (tool is None or c.tool == tool) and (run_id is None or c.run_id == run_id)
            ]
