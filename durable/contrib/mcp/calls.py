"""MCP tool calls as Durable runs: the listing, the start of a call, its state.

Plain Django: no ``mcp`` SDK here (:mod:`.server` turns these into MCP messages).

A call is a run of :data:`CALL_WORKFLOW` whose id is the call's id (``mcp.<32 hex>``):
random per call, or derived from the client's idempotency key and the caller, so the
same key from the same caller names the same run (the same arguments return its
outcome; other arguments are refused). The tool's own idempotency key is the step's,
``"<call id>:call"``, on every attempt and after a crash. The MCP server executes
the run in its own process (a read-only tool answers at once) and reads its state;
a write that needs approval parks the run until an approver decides in the inbox, and
a worker runs it after the decision.
"""

from __future__ import annotations

import fnmatch
import hashlib
import inspect
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from pydantic_core import to_jsonable_python

from durable import conf, registry
from durable.models import TERMINAL, Run, RunStatus
from durable.models import Tool as ToolRow
from durable.values.arguments import ArgumentError, arguments_schema, validate_arguments
from durable.vocabulary import Safety, WaitKind, WaitStatus

from .workflows import CALL_STEP, CALL_WORKFLOW

__all__ = [
    "CALL_STEP",
    "CALL_WORKFLOW",
    "STATUS_TOOL",
    "BadArguments",
    "CallState",
    "ListedTool",
    "UnknownCall",
    "UnknownTool",
    "call_state",
    "listed_tools",
    "served",
    "settle",
    "start_call",
]

#: the tool a client without MCP Tasks polls: ``{"call_id": str, "wait_seconds": float}``
STATUS_TOOL = "durable_call_status"
#: longest wait one ``settle`` (a ``tools/call`` or a status poll) may be asked for, s
MAX_WAIT_SECONDS = 60.0
_KEY_RE = re.compile(r"^[\x21-\x7e]{1,200}$")
CALL_ID_RE = re.compile(r"^mcp\.[0-9a-f]{32}$")


class UnknownTool(LookupError):
    """No registered tool of that name (an MCP protocol error, not a tool result)."""


class UnknownCall(LookupError):
    """No MCP call of that id (or not the caller's)."""


class BadArguments(ValueError):
    """The arguments do not fit the tool's signature; ``errors`` name the fields."""

    def __init__(self, tool: str, errors: list[ArgumentError]):
        self.tool = tool
        self.errors = errors
        super().__init__(f"invalid arguments for {tool}: " + "; ".join(map(str, errors)))


@dataclass(frozen=True)
class ListedTool:
    """A registered tool as MCP lists it: the effective spec (a Tool row over the code)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    safety: str
    requires_approval: bool

    @property
    def annotations(self) -> dict[str, bool]:
        """The MCP tool annotations of the safety class (``readOnlyHint``,
        ``destructiveHint``, ``idempotentHint``)."""
        read_only = self.safety == Safety.READ_ONLY
        return {
            "readOnlyHint": read_only,
            "destructiveHint": not read_only,
            "idempotentHint": self.safety != Safety.UNSAFE_WRITE,
        }


#: the packages whose tools are Durable's own machinery (the webhook delivery that signs
#: with a subscription's secret, the tools McpTools and the framework adapters register
#: for another MCP server): never served over MCP, whatever ``DURABLE["MCP_TOOLS"]`` says
INTERNAL_PACKAGES = ("durable", "api", "approvals", "dashboard")


def served(spec: registry.ToolSpec) -> bool:
    """Whether tool ``spec`` is served over MCP: its name matches a pattern of
    ``DURABLE["MCP_TOOLS"]`` (:mod:`fnmatch`, case-sensitive; default ``["*"]``) and its
    function is not Durable's own (:data:`INTERNAL_PACKAGES`)."""
    package = (getattr(spec.fn, "__module__", "") or "").split(".", 1)[0]
    if package in INTERNAL_PACKAGES:
        return False
    patterns = conf.get("MCP_TOOLS")
    if isinstance(patterns, str):
        patterns = [patterns]
    return any(fnmatch.fnmatchcase(spec.name, str(p)) for p in patterns or ())


def _effective(name: str) -> registry.ToolSpec:
    try:
        spec = registry.get_tool(name)
    except Exception as exc:  # ToolNotFound
        raise UnknownTool(name) from exc
    if not served(spec):
        raise UnknownTool(name)
    row = ToolRow.objects.select_related("approver_group").filter(name=name).first()
    return registry.effective_tool(spec, row)


def listed_tools() -> list[ListedTool]:
    """Every tool served (:func:`served`), by name, with its effective safety class and
    approval."""
    out = []
    specs = [spec for spec in registry.tools() if served(spec)]
    rows = {
        row.name: row
        for row in ToolRow.objects.select_related("approver_group").filter(
            name__in=[spec.name for spec in specs]
        )
    }
    for code in sorted(specs, key=lambda s: s.name):
        spec = registry.effective_tool(code, rows.get(code.name))
        description = inspect.getdoc(spec.fn) or spec.description or spec.name
        if spec.requires_approval:
            description += (
                "\n\nA person approves each call in Durable's inbox before it runs; "
                f"until then the call waits (poll {STATUS_TOOL})."
            )
        out.append(
            ListedTool(
                name=spec.name,
                description=description,
                input_schema=arguments_schema(spec.fn),
                safety=spec.safety,
                requires_approval=spec.requires_approval,
            )
        )
    return out


def call_id_for(caller: str, key: str | None) -> str:
    """The run id of a call: from the caller's idempotency key, else random.

    Raises ``ValueError`` for a key that is not 1-200 printable ASCII characters.
    """
    if key is None:
        return f"mcp.{uuid.uuid4().hex}"
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError("the idempotency key must be 1-200 printable ASCII characters")
    return "mcp." + hashlib.sha256(f"{caller}\x00{key}".encode()).hexdigest()[:32]


def start_call(
    tool: str, arguments: dict[str, Any] | None, *, started_by: Any, caller: str, key: str | None
) -> Run:
    """Start (or find, for a repeated idempotency key) the run of one call.

    Raises :class:`UnknownTool`, :class:`BadArguments` (nothing is started),
    ``ValueError`` for a bad key, :class:`~durable.RunInputConflict` when the key was
    used with other arguments, :class:`~durable.PayloadError` for unstorable arguments.
    """
    from durable.client import start

    spec = _effective(tool)
    arguments = dict(arguments or {})
    errors = validate_arguments(spec.fn, arguments)
    if errors:
        raise BadArguments(tool, errors)
    return start(
        CALL_WORKFLOW,
        {"tool": tool, "arguments": arguments},
        run_id=call_id_for(caller, key),
        started_by=started_by,
        tags=["mcp"],
    )


@dataclass(frozen=True)
class CallState:
    """Where a call is. ``state`` uses MCP Tasks' words: ``working``, ``input_required``
    (an approval is pending), ``completed``, ``failed``, ``cancelled``."""

    call_id: str
    state: str
    message: str = ""
    result: Any = None
    approval_id: int | None = None
    created_at: str = ""
    updated_at: str = ""

    @property
    def final(self) -> bool:
        return self.state in ("completed", "failed", "cancelled")

    def as_dict(self) -> dict[str, Any]:
        """The state as JSON values (what ``structuredContent`` carries): a result's
        dates and times as ISO 8601 text, ``Decimal`` as text, sets and tuples as
        lists, bytes as base64, other objects as their ``str``."""
        data: dict[str, Any] = {"call_id": self.call_id, "state": self.state}
        if self.message:
            data["message"] = self.message
        if self.state == "completed":
            data["result"] = to_jsonable_python(self.result, fallback=str, bytes_mode="base64")
        if self.approval_id is not None:
            data["approval_id"] = self.approval_id
        return data

    def text(self) -> str:
        """:meth:`as_dict` as one JSON text: the same values as the structured content."""
        return json.dumps(self.as_dict(), ensure_ascii=False)


def call_state(run: Run) -> CallState:
    """The :class:`CallState` of a call's run."""
    times: dict[str, Any] = {
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
    }
    if run.status == RunStatus.SUCCEEDED:
        output = run.output_value() or {}
        if isinstance(output, dict) and "error" in output:
            error = output["error"] or {}
            return CallState(
                run.id, "failed", f"{error.get('type')}: {error.get('message')}", **times
            )
        return CallState(run.id, "completed", result=output.get("result"), **times)
    if run.status == RunStatus.CANCELLED:
        return CallState(run.id, "cancelled", "the call's run was cancelled", **times)
    if run.status in TERMINAL:
        error = run.error or {}
        what = f"{error['type']}: {error.get('message', '')}" if error.get("type") else ""
        why = "; ".join(part for part in (what, error.get("reason") or "") if part)
        return CallState(
            run.id,
            "failed",
            f"the call's run ended {run.status}: {why or 'no error recorded'}",
            **times,
        )
    pending = run.waits.filter(status=WaitStatus.PENDING)
    approval = pending.filter(kind=WaitKind.APPROVAL).first()
    if approval is not None:
        from approvals.models import ApprovalRequest

        req = ApprovalRequest.objects.filter(wait=approval).only("pk").first()
        return CallState(
            run.id,
            "input_required",
            "waits for a person's approval in Durable's inbox; the tool runs after the "
            f"decision (poll {STATUS_TOOL} with this call_id)",
            approval_id=req.pk if req is not None else None,
            **times,
        )
    limit = pending.filter(kind=WaitKind.LIMIT).first()
    if limit is not None:
        until = f" (next try {limit.wake_at.isoformat()})" if limit.wake_at else ""
        return CallState(
            run.id,
            "working",
            f"waits for the tool's rate or concurrency limit to admit it{until}",
            **times,
        )
    if pending.filter(kind=WaitKind.RECONCILE).exists():
        return CallState(
            run.id,
            "working",
            "the write's outcome is unknown: an operator settles it in Durable's reconcile queue",
            **times,
        )
    return CallState(run.id, "working", f"the call's run is {run.status}", **times)


def get_call(call_id: str, *, caller: str | None = None) -> Run:
    """The run of call ``call_id``; with ``caller``, only a call that caller started.

    Raises :class:`UnknownCall`.
    """
    if not isinstance(call_id, str) or not CALL_ID_RE.match(call_id):
        raise UnknownCall(call_id)
    run = Run.objects.filter(pk=call_id, workflow_name=CALL_WORKFLOW).first()
    if run is None or (caller is not None and run.starter_label != caller):
        raise UnknownCall(call_id)
    return run


def _runnable(run: Run) -> bool:
    """Pending and free, or waiting on a wait that is due (a limit's next try, a timer):
    what a worker would be sent now. A run held by another process is not."""
    if run.lease_token:
        return False
    if run.status == RunStatus.PENDING:
        return True
    if run.status != RunStatus.WAITING:
        return False
    due = run.waits.filter(status=WaitStatus.PENDING, wake_at__lte=timezone.now())
    return due.exclude(kind=WaitKind.APPROVAL).exists()


#: the engine's ``execute(run_id, *, worker_id)`` (:func:`durable.worker.engine.execute`),
#: given by whoever serves the calls, so this module's import chain stays short
Execute = Callable[..., Any]


def settle(call_id: str, wait: float, *, execute: Execute, worker_id: str = "mcp") -> CallState:
    """Execute the call's run here (``execute``: the engine's) while it is runnable, and
    wait up to ``wait`` seconds (at most :data:`MAX_WAIT_SECONDS`) for it to end or ask
    for an approval; returns its state then. A run another process holds (a worker) is
    waited for, not taken."""
    deadline = time.monotonic() + max(0.0, min(float(wait), MAX_WAIT_SECONDS))
    delay = 0.02
    while True:
        run = Run.objects.get(pk=call_id)
        if _runnable(run):
            execute(call_id, worker_id=worker_id)
            run = Run.objects.get(pk=call_id)
        state = call_state(run)
        if state.state != "working" or time.monotonic() >= deadline:
            return state
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, 0.5)
