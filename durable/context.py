"""The workflow context: every durable call a workflow makes goes through ``ctx``.

On each execution the workflow function runs from the top. A durable call whose result
is recorded returns it without executing (replay); the first unrecorded call executes,
and its result is committed as a checkpoint before the workflow goes on. Every write
checks the lease token, so a worker that lost its lease records nothing.
:class:`WorkflowContext` is the SDK face only; the engine's state and writes live in one
private :class:`~durable.runtime.execution.Execution`, composed of parts held as fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from durable.exceptions import DurableError, InvalidDuration
from durable.limits import llm_limits
from durable.models import StepKind, WaitKind
from durable.retry import RetryPolicy
from durable.runtime import failures
from durable.runtime import steps as tool_calls
from durable.runtime.attempts import LLM_HELD_REQUEST_SECONDS, LLM_POLICY, call_with_timeout
from durable.runtime.batching import resolve
from durable.runtime.failures import db_faults_stop_the_execution
from durable.types import ChildHandle, Decision, ModelRecoverable
from durable.values.redaction import redact_text

if TYPE_CHECKING:
    from durable.calls import Call
    from durable.runtime.execution import Execution
    from durable.runtime.llm_stream import StepStream
    from durable.runtime.stream_writer import StreamWriter


class WorkflowContext:
    """Passed to every workflow function as ``ctx``. Create nothing yourself: the engine does.

    Attributes: ``run_id`` (str), ``workflow_name``, ``workflow_version``.
    """

    def __init__(self, execution: Execution) -> None:
        self._execution = execution
        self.run_id: str = execution.cursor.run_id
        self.workflow_name = execution.cursor.run.workflow_name
        self.workflow_version = execution.cursor.run.workflow_version

    @property
    def is_replaying(self) -> bool:
        """True while the workflow is re-running through recorded calls."""
        return self._execution.cursor.is_replaying

    @db_faults_stop_the_execution
    def step(
        self,
        step_id: str | None,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        durability: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once and memoize its result.

        ``step_id`` names the step (``None``: derived from ``fn``'s name); a name used
        again in the same run gets an occurrence suffix (``fetch``, ``fetch#2``, ...).
        ``fn`` receives ``idempotency_key="{run_id}:{step_id}"`` when it accepts that
        keyword; the key is the same on every attempt. ``retry`` is the step's
        :class:`RetryPolicy`; ``timeout`` (seconds) bounds each attempt.
        ``durability="batched"``: the step's checkpoint may be group-committed, so a
        crash can make it run again -- say so only when that is harmless (a plain step
        is arbitrary code: ``None`` means ``"sync"``, whatever the workflow's default;
        docs/architecture.md#batched-checkpoints). Another value raises
        :class:`~durable.DurableConfigurationError`.

        Returns the result, or a :class:`~durable.ModelRecoverable` when ``fn`` raised
        :class:`~durable.ModelRecoverableError`. Raises :class:`~durable.StepFailed` when
        the step fails for good (the run is then FAILED).
        """
        ex = self._execution
        base = tool_calls.step_base(step_id, fn)
        mode = resolve(durability, None, where=f"ctx.step({base!r}, durability=...)")
        timeout, invalid = _checked(timeout, call=f"ctx.step({base!r}, timeout=...)", positive=True)
        call = ex.cursor.next_call(base, kind=StepKind.STEP)
        if call.succeeded:
            assert call.recorded is not None
            return ex.cursor.replay(call.recorded)
        runnable = tool_calls.build_step(
            ex, call, fn, args, kwargs, retry=retry, timeout=timeout, mode=mode, invalid=invalid
        )
        return tool_calls.run(ex, runnable)

    @db_faults_stop_the_execution
    def call_tool(
        self, name: str, params: dict[str, Any] | None = None, *, step_id: str | None = None
    ) -> Any:
        """Call the registered tool ``name`` with ``params`` (keyword arguments), durably.

        Writes (``idempotent_write``, ``unsafe_write``) go through the operation ledger
        with the idempotency key ``"{run_id}:{step_id}"``, always with a synchronous
        checkpoint; a ``read_only`` tool's checkpoint follows the tool's ``durability``,
        else the workflow's (docs/architecture.md#batched-checkpoints). A tool that
        requires approval first waits for a decision; a rejection returns a
        :class:`~durable.ModelRecoverable` carrying the approver's message (the model
        can take it into account), and approved edits replace ``params``. An unknown
        tool name or arguments that do not fit the tool's signature also return a
        :class:`~durable.ModelRecoverable` (an LLM chose them), not an exception.
        A tool's ``rate_limit`` / ``concurrency`` is waited for before each try: over a
        limit, the run parks until the limit admits the call (docs/limits.md).
        """
        ex = self._execution
        params = dict(params or {})
        base = step_id or name
        spec = tool_calls.lookup(ex, name)
        if tool_calls.needs_approval(ex, spec, base, params):
            approved = tool_calls.ask_approval(ex, name, spec, base, params)
            if isinstance(approved, ModelRecoverable):
                return approved
            params = approved
        call = tool_calls.tool_position(ex, base, name)
        if call.succeeded:
            assert call.recorded is not None
            return ex.cursor.replay(call.recorded)
        return tool_calls.run(ex, tool_calls.build_tool(ex, call, name, spec, params))

    @db_faults_stop_the_execution
    def parallel(self, calls: list[Call], max_concurrency: int | None = None) -> list[Any]:
        """Run ``calls`` (built with :func:`durable.call` / :func:`durable.tool_call`)
        concurrently; returns their results in the list's order.

        Each call gets the step id it names, else ``"<group>[<index>]"`` where the group
        is ``parallel``, ``parallel#2``, ... (one per ``ctx.parallel`` of the run). All
        positions are taken, in list order, before anything runs: a replay returns the
        recorded results and runs only the calls without a checkpoint. Plain steps and
        read-only tools run on a thread pool of at most ``max_concurrency`` threads
        (``None``: one per call); writes and calls that need an approval run one by one,
        in list order, on the workflow's thread. Each call retries under its own policy;
        a :class:`~durable.ModelRecoverable` is a result. When calls fail for good, the
        group lets the others settle (no further write starts), records their successes,
        then raises the first failure in list order (:class:`~durable.StepFailed`, the
        run is FAILED). A ``max_concurrency`` that is not an int >= 1, or a list item
        that is not a call, raises :class:`~durable.DurableConfigurationError`. See
        docs/parallel.md.
        """
        from durable.runtime.parallel import run_group

        return run_group(self._execution, calls, max_concurrency, group="parallel")

    @db_faults_stop_the_execution
    def run_tool_calls(
        self,
        tool_calls: list[dict[str, Any]],
        *,
        names: dict[str, str] | None = None,
        max_concurrency: int | None = None,
    ) -> list[dict[str, Any]]:
        """Run the tool calls of one model turn; returns the tool messages to append.

        ``tool_calls``: an OpenAI assistant message's (``{"id", "type": "function",
        "function": {"name", "arguments": "<json>"}}``) or ``ctx.llm``'s (``{"id",
        "name", "arguments"}``). Returns one ``{"role": "tool", "tool_call_id": id,
        "content": text}`` per call, in the given order: ``content`` is the result's JSON
        (``{"result": ...}``), or ``{"error": {"type", "message"}}`` for a
        :class:`~durable.ModelRecoverable`. Read-only tools run in parallel, writes in
        the given order (as :meth:`parallel`; the group is ``tool_calls``,
        ``tool_calls#2``, ...). Once a person rejects a write, the turn's later writes
        do not run: each is recorded as skipped (``"SkippedAfterRejection"``). Malformed
        argument JSON or an unknown tool is an error message to the model, not an
        exception. ``names``: the model's tool names -> registered tools (OpenAI function
        names cannot hold dots); with it, any other name is an error result, so the
        model reaches only the tools it was given. See docs/parallel.md.
        """
        from durable.runtime.turns import run_turn

        return run_turn(self._execution, tool_calls, max_concurrency, names)

    @db_faults_stop_the_execution
    def llm(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        model: str | None = None,
        step_id: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 60.0,
        durability: str | None = None,
        stream: bool = False,
        **options: Any,
    ) -> Any:
        """One LLM chat completion as a durable step (see :mod:`durable.runtime.llm`).

        ``stream=True``: the reply is streamed (``stream_options.include_usage`` asked)
        and its tokens, tool-call starts and ends go to the run's stream as they arrive
        (:func:`durable.stream`, docs/streaming.md); the step records the assembled
        reply, the same dict as without streaming. A replay streams nothing.

        ``durability``: ``"sync"`` or ``"batched"`` for this call; ``None``: the
        workflow's default (docs/architecture.md#batched-checkpoints).
        A model with limits in ``DURABLE['LLM_LIMITS']`` waits for them: over a
        limit, the run parks until the limit admits the call (docs/limits.md).

        The request (redacted) and the response, token usage and cost are recorded; a
        replay returns the recorded response, so no call is paid twice. Tokens count
        against the run's ``max_tokens`` budget (:class:`~durable.BudgetExceeded` when
        spent). Returns ``{"content", "refusal", "tool_calls": [{"id", "name", "arguments"}],
        "usage", "model", "finish_reason", "cost_usd", "scripted"}``, or a
        :class:`~durable.ModelRecoverable` for malformed tool-call JSON or a 400/422.
        """
        from durable.runtime import llm as llm_module

        _, invalid = _checked(timeout, call="ctx.llm(timeout=...)", positive=True)
        request: dict[str, Any] = {
            "model": model or llm_module.default_model(),
            "messages": messages,
        }
        if tools:
            request["tools"] = tools
        kwargs = {"model": model, "tools": tools, "timeout": timeout, **options}

        def make_fn(call: Any, limits: Any) -> Callable[[], Any]:
            chat: Callable[..., Any] = llm_module.chat
            args: tuple[Any, ...] = (messages,)
            if stream:
                from durable.runtime.llm_stream import streamed_chat

                chat, args = streamed_chat, (self._execution.cursor, call.step_id, messages)
            if limits is not None and limits.concurrency:
                # under a concurrency limit the request is not cut at ``timeout``: the
                # provider would go on computing it, so its slot is held until the answer
                # arrives (docs/limits.md#a-timed-out-call-keeps-what-it-holds)
                held = {**kwargs, "timeout": max(timeout, LLM_HELD_REQUEST_SECONDS)}
                return lambda: call_with_timeout(chat, args, held, timeout, call.step_id)
            return lambda: chat(*args, **kwargs)

        return self._llm_step(
            step_id or "llm",
            request,
            make_fn,
            durability=durability,
            where=f"ctx.llm({step_id or 'llm'!r}, durability=...)",
            retry=retry,
            invalid=invalid,
        )

    def _step_stream(
        self, step_id: str, *, model: str, started: dict[str, Any] | None = None
    ) -> StepStream:
        """The run's stream for one try of the model step ``step_id`` (call it in the
        step's body, on a live try: a replay never reaches the body): a
        :class:`~durable.runtime.llm_stream.StepStream`, for an integration whose
        framework streams its model requests (docs/streaming.md). ``started``: more keys
        for its ``step_started`` event."""
        from durable.runtime.llm_stream import StepStream

        return StepStream(self._execution.cursor, step_id, model=model, started=started)

    def _stream_writer(self, step_id: str) -> StreamWriter:
        """A writer of the run's stream for the events of step ``step_id`` that are not
        a model call's (e.g. a LangGraph super-step's stream modes): call it in the step's
        body, on a live try; it writes nothing once the worker lost the run's lease."""
        from durable.runtime.stream_writer import StreamWriter

        heartbeat = self._execution.cursor.heartbeat
        return StreamWriter(
            self.run_id, step_id, live=lambda: heartbeat is None or not heartbeat.lost
        )

    def _llm_step(
        self,
        step_id: str,
        request: dict[str, Any],
        make_fn: Callable[[Any, Any], Callable[[], Any]],
        *,
        durability: str | None,
        where: str,
        retry: RetryPolicy | None = None,
        invalid: DurableError | None = None,
    ) -> Any:
        """One LLM step, for :meth:`llm` and an integration's chat model
        (``durable.contrib.langgraph.chat``): on a replay the recorded reply; else, the
        token budget checked and ``request`` (``{"model", ...}``) recorded as the step's
        input, ``make_fn(call, limits)()`` under the step's attempts, ``retry`` (default
        ``LLM_POLICY``) and the model's limits (``DURABLE['LLM_LIMITS']``). ``invalid``:
        an argument error that fails the call at once, recorded."""
        ex = self._execution
        mode = resolve(durability, ex.workflow_durability(), where=where)
        call = ex.cursor.next_call(step_id, kind=StepKind.LLM)
        if call.succeeded:
            assert call.recorded is not None
            return ex.cursor.replay(call.recorded)
        if invalid is not None:
            failures.fail_call_now(ex.checkpoints, call, invalid)
        ex.cursor.check_token_budget(call.step_id)
        call = replace(call, tool_name=request["model"])
        call = replace(
            call, input_text=tool_calls.encode_input(ex, call, (), request), durability=mode
        )
        limits = llm_limits(request["model"])
        return ex.attempts.execute(
            call,
            fn=make_fn(call, limits),
            policy=retry or LLM_POLICY,
            safety=None,
            limits=limits,
        )

    def idempotency_key(self, step_id: str) -> str:
        """The key of a step: ``"{run_id}:{step_id}"``, the same on every attempt."""
        return f"{self.run_id}:{step_id}"

    # -------------------------------------------------------------------- waits

    @db_faults_stop_the_execution
    def sleep(self, duration: float | timedelta, *, step_id: str | None = None) -> None:
        """A durable timer: suspend the run for ``duration`` (seconds or a timedelta).

        The wake time is stored when the timer is first reached; the worker is freed and
        the sweeper wakes the run when it is due -- never early, and once even if no
        worker was up at the time.

        ``duration`` must be finite, >= 0 and at most 10 years
        (:mod:`durable.durations`); otherwise the timer step fails at once, for good
        (:class:`~durable.StepFailed`, the error names the call and the value).
        """
        seconds, invalid = _checked(duration, call="ctx.sleep")
        if duration is None:
            invalid = InvalidDuration(
                call="ctx.sleep",
                value=None,
                reason="give seconds as an int or a float, or a timedelta",
            )
        self._execution.parking.wait(
            step_id or "sleep", kind=WaitKind.TIMER, wake_in=seconds or 0.0, invalid=invalid
        )

    @db_faults_stop_the_execution
    def sleep_until(self, when: datetime, *, step_id: str | None = None) -> None:
        """A durable timer until the aware datetime ``when`` (a past time returns at once).

        A time more than 10 years ahead fails the timer step at once, as ``ctx.sleep``.
        """
        if not isinstance(when, datetime) or timezone.is_naive(when):
            raise ValueError("ctx.sleep_until needs an aware datetime (with a time zone)")
        invalid = None
        ahead = (when - timezone.now()).total_seconds()
        if ahead > 0:
            _, invalid = _checked(ahead, call="ctx.sleep_until")
            if invalid is not None:
                invalid = InvalidDuration(call="ctx.sleep_until", value=when, reason=invalid.reason)
        self._execution.parking.wait(
            step_id or "sleep", kind=WaitKind.TIMER, wake_at=when, invalid=invalid
        )

    @db_faults_stop_the_execution
    def wait_for_signal(
        self,
        name: str,
        *,
        timeout: float | timedelta | None = None,
        default: Any = None,
        step_id: str | None = None,
    ) -> Any:
        """Wait for ``durable.signal(run_id, name, payload)`` and return its payload.

        Signals are kept in the run's mailbox, so one sent before the wait is reached is
        delivered when it is. ``timeout`` (seconds): return ``default`` if no signal came.
        """
        if not name or len(name) > 200:
            raise ValueError("ctx.wait_for_signal: name must be 1-200 characters")
        wake_in, invalid = _checked(timeout, call="ctx.wait_for_signal(timeout=...)", positive=True)
        return self._execution.parking.wait(
            step_id or f"signal:{name}",
            kind=WaitKind.SIGNAL,
            key=name,
            wake_in=wake_in,
            spec={"default": default},
            invalid=invalid,
        )

    @db_faults_stop_the_execution
    def wait_for_approval(
        self,
        key: str,
        *,
        title: str,
        payload: Any = None,
        approvers: str | None = None,
        timeout: float | timedelta | None = None,
        on_timeout: str = "reject",
        escalate_to: str | None = None,
        required: int = 1,
        allow_edit: bool = False,
        four_eyes: bool = False,
        requesters: list[str] | tuple[str, ...] = (),
    ) -> Decision:
        """Suspend until people decide; returns a :class:`~durable.Decision`.

        ``approvers``: the name of a group whose members may decide (besides holding the
        ``approvals.decide_approval`` permission); ``required``: approvals needed (N of
        M); ``timeout`` (seconds) with ``on_timeout`` = ``"reject"`` or ``"escalate"``
        (to the group ``escalate_to``); ``allow_edit``: approvers may edit ``payload``;
        ``four_eyes``: nobody who asked may approve -- the run's starter, for a fork the
        forker and the source run's requesters, and the dashboard usernames listed in
        ``requesters`` (e.g. the person a purchase is for, named in the input). When the
        starter is unknown, a four-eyes request needs two different approvers.
        """
        base, key, title, spec, invalid = _approval(
            key,
            title=title,
            payload=payload,
            approvers=approvers,
            timeout=timeout,
            on_timeout=on_timeout,
            escalate_to=escalate_to,
            required=required,
            allow_edit=allow_edit,
            four_eyes=four_eyes,
            requesters=requesters,
        )
        return self._execution.parking.approval(base, key, title, spec, invalid=invalid)

    @db_faults_stop_the_execution
    def wait_for_approvals(self, requests: list[dict[str, Any]]) -> list[Decision]:
        """Several approvals asked together; returns their decisions in ``requests``' order.

        Each request is a dict of :meth:`wait_for_approval`'s arguments (``key``,
        ``title``, and any of its keywords). Every one not yet answered is in the inbox
        before the run suspends, so approvers see them side by side and may decide them
        in any order; the run continues once all are decided. Each takes its own
        position (``approval:<key>``), as consecutive ``wait_for_approval`` calls would,
        so a replay answers each from its record. Raises ``ValueError`` as
        :meth:`wait_for_approval`, and for two requests with one key.
        """
        items = [_approval(**dict(request)) for request in requests]
        keys = [item[1] for item in items]
        if len(set(keys)) != len(keys):
            raise ValueError("ctx.wait_for_approvals: two requests have the same key")
        return self._execution.parking.approvals(items)

    # ------------------------------------------------------------------- children

    @db_faults_stop_the_execution
    def start_child(
        self,
        workflow_name: str,
        input: Any = None,
        child_id: str | None = None,
        *,
        parent_close_policy: str = "cancel",
    ) -> ChildHandle:
        """Start a child run of ``workflow_name`` with ``input``; returns its
        :class:`~durable.ChildHandle` at once (the child runs on its own worker).

        The child's run id is ``"{run_id}.{child_id}"`` (``child_id``: 1-100 letters,
        digits, ``_``, ``-``, unique in this run), or ``"{run_id}.{workflow_name}.{n}"``
        for the n-th child of that workflow started without one; at most 128
        characters. Recorded as a step: a replay returns the same handle and never
        starts a second child. Compensating this run compensates the children that wrote
        (docs/children.md).

        ``parent_close_policy`` (stored on the child) says what this run's end does to the
        child while it is unfinished, after Temporal's ParentClosePolicy: ``"cancel"``
        (the default) cancels it when this run succeeds, fails or is cancelled;
        ``"abandon"`` lets it run on; ``"wait"`` makes this run's return wait for the
        child's end before it succeeds (a failure or a cancel cancels it).

        Raises ``ValueError`` (a bad or repeated ``child_id``, a run id too long, an
        unknown ``parent_close_policy``),
        :class:`~durable.WorkflowNotFound`, :class:`~durable.PayloadError` (input not
        storable) -- before anything is written.
        """
        handle = self._execution.children.start_child(
            workflow_name, input, child_id, parent_close_policy
        )
        return replace(handle, _context=self)  # handle.result() waits through this ctx

    @db_faults_stop_the_execution
    def wait_child(self, handle: ChildHandle) -> Any:
        """Wait durably for the child's end and return its output (the same as
        ``handle.result()``). The run frees its worker while the child runs; a child
        that has ended already answers at once.

        Raises :class:`~durable.ChildFailed` (``run_id``, ``status``, ``error``) when the
        child failed, was cancelled or compensated; uncaught, it fails this run.
        """
        return self._execution.children.wait_child(handle)


_checked = tool_calls.checked


def _approval(
    key: str,
    *,
    title: str,
    payload: Any = None,
    approvers: str | None = None,
    timeout: float | timedelta | None = None,
    on_timeout: str = "reject",
    escalate_to: str | None = None,
    required: int = 1,
    allow_edit: bool = False,
    four_eyes: bool = False,
    requesters: list[str] | tuple[str, ...] = (),
) -> tuple[str, str, str, dict[str, Any], Any]:
    """An approval's ``(wait base, key, title, spec, invalid timeout)``, checked."""
    if on_timeout not in ("reject", "escalate"):
        raise ValueError("ctx.wait_for_approval: on_timeout must be 'reject' or 'escalate'")
    if on_timeout == "escalate" and not escalate_to:
        raise ValueError("ctx.wait_for_approval: on_timeout='escalate' needs escalate_to")
    if int(required) < 1:
        raise ValueError("ctx.wait_for_approval: required must be >= 1")
    wake_in, invalid = _checked(timeout, call="ctx.wait_for_approval(timeout=...)", positive=True)
    title = redact_text(str(title))  # free text shown to approvers: redacted, not refused
    spec = {
        "title": title,
        "payload": payload,
        "approvers": approvers,
        "on_timeout": on_timeout,
        "escalate_to": escalate_to,
        "required": int(required),
        "allow_edit": bool(allow_edit),
        "four_eyes": bool(four_eyes),
        "timeout": wake_in,
    }
    if requesters:
        if isinstance(requesters, str) or not all(isinstance(r, str) for r in requesters):
            raise ValueError("ctx.wait_for_approval: requesters must be a list of names")
        spec["requesters"] = [r[:200] for r in requesters]
    return f"approval:{key}", key, title, spec, invalid
