"""Registration of workflows and tools, and discovery of the modules that declare them."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import re
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from durable.durations import check_duration
from durable.exceptions import DurableConfigurationError, ToolNotFound, WorkflowNotFound
from durable.limits import Limits, Rate, check_concurrency, limits_for, parse_rate
from durable.retry import RetryPolicy
from durable.vocabulary import Durability, Safety

logger = logging.getLogger("durable.registry")

F = TypeVar("F", bound=Callable[..., Any])

SAFETY_CLASSES = tuple(Safety.values)
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,199}$")


@dataclass(frozen=True)
class WorkflowSpec:
    """A registered workflow: ``fn(ctx, input) -> output``."""

    name: str
    version: str
    fn: Callable[..., Any]
    max_steps: int | None = None
    deadline_seconds: float | None = None
    module: str = ""
    #: the default durability of its read-only tool calls and LLM calls
    durability: str = Durability.SYNC
    #: at most this many runs of the workflow execute (hold a lease) at once
    max_concurrent_runs: int | None = None

    @property
    def limits(self) -> Limits | None:
        """The ``workflow:<name>`` key's limits (``max_concurrent_runs``), if any."""
        return limits_for(f"workflow:{self.name}", None, self.max_concurrent_runs)


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool. The effective spec merges the database's Tool row over this."""

    name: str
    fn: Callable[..., Any]
    safety: str
    retry: RetryPolicy | None = None
    timeout: float | None = None
    requires_approval: bool = False
    allow_edit: bool = False
    reconcile: Callable[..., Any] | None = None
    compensate: Callable[..., Any] | None = None
    external_id: Callable[[Any], Any] | None = None
    description: str = ""
    approver_group: str | None = None
    #: None: the workflow's default (read-only tools only; writes are always sync)
    durability: str | None = None
    #: calls admitted per period across every run and worker (docs/limits.md)
    rate_limit: Rate | None = None
    #: calls running at once across every run and worker
    concurrency: int | None = None
    #: the approval of a call: seconds before ``approval_on_timeout`` applies (None:
    #: none), approvals needed, and ``"reject"`` or ``"escalate"`` (to ``escalate_to``)
    approval_timeout: float | None = None
    approvals_required: int = 1
    approval_on_timeout: str = "reject"
    escalate_to: str | None = None

    @property
    def limits(self) -> Limits | None:
        """The ``tool:<name>`` key's limits, if any."""
        return limits_for(f"tool:{self.name}", self.rate_limit, self.concurrency)


_workflows: dict[str, dict[str, WorkflowSpec]] = {}
_tools: dict[str, ToolSpec] = {}
#: modules that failed to import: module name -> traceback text
load_errors: dict[str, str] = {}


def workflow(
    *,
    name: str | None = None,
    version: str = "1",
    max_steps: int | None = None,
    deadline_seconds: float | None = None,
    durability: str = Durability.SYNC,
    max_concurrent_runs: int | None = None,
) -> Callable[[F], F]:
    """Register ``fn(ctx, input)`` as a workflow.

    ``name`` defaults to the function's qualified name; ``version`` (a string) is stored
    with every run, and a worker resumes only versions it has registered. Several
    versions of one name may be registered side by side; new runs use the last one.
    ``max_steps`` and ``deadline_seconds`` are the run's default budgets.
    ``durability``: ``"sync"`` (the default) or ``"batched"``, the default of the
    workflow's read-only tool calls and LLM calls (docs/architecture.md#batched-checkpoints);
    anything else raises :class:`DurableConfigurationError`.
    ``max_concurrent_runs``: at most this many runs of the workflow (all its versions)
    execute at once, across every worker; a run executes while it holds a lease, so a
    run waiting on a timer, a signal or an approval does not count, and a run over the
    limit waits (docs/limits.md). An int from 1; anything else raises
    :class:`DurableConfigurationError`.
    """

    check_concurrency(
        max_concurrent_runs,
        where=f"durable.workflow(name={name!r})",
        name="max_concurrent_runs",
    )
    if deadline_seconds is not None:
        check_duration(
            deadline_seconds, call="durable.workflow(deadline_seconds=...)", positive=True
        )

    def decorator(fn: F) -> F:
        wf_name = name or f"{fn.__module__}.{fn.__qualname__}"
        if not _NAME_RE.match(wf_name):
            raise DurableConfigurationError(f"workflow name {wf_name!r} is not valid")
        ver = str(version)
        if not ver or len(ver) > 64:
            raise DurableConfigurationError(f"workflow {wf_name!r}: version must be 1-64 chars")
        versions = _workflows.setdefault(wf_name, {})
        existing = versions.get(ver)
        if existing is not None and (existing.fn.__module__, existing.fn.__qualname__) != (
            fn.__module__,
            fn.__qualname__,
        ):
            raise DurableConfigurationError(
                f"workflow {wf_name!r} version {ver!r} is registered twice: by "
                f"{existing.fn.__module__}.{existing.fn.__qualname__} and "
                f"{fn.__module__}.{fn.__qualname__}"
            )
        versions.pop(ver, None)  # re-registration (module reload) moves it to the end
        mode = check_durability(durability, where=f"durable.workflow(name={wf_name!r})")
        versions[ver] = WorkflowSpec(
            wf_name,
            ver,
            fn,
            max_steps,
            deadline_seconds,
            fn.__module__,
            mode or Durability.SYNC,
            max_concurrent_runs,
        )
        fn.workflow_name = wf_name  # type: ignore[attr-defined]
        return fn

    return decorator


def tool(
    *,
    name: str | None = None,
    safety: str,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    requires_approval: bool = False,
    allow_edit: bool = False,
    reconcile: Callable[..., Any] | None = None,
    compensate: Callable[..., Any] | None = None,
    external_id: Callable[[Any], Any] | None = None,
    approver_group: str | None = None,
    durability: str | None = None,
    rate_limit: str | None = None,
    concurrency: int | None = None,
    approval_timeout: float | None = None,
    approvals_required: int = 1,
    approval_on_timeout: str = "reject",
    escalate_to: str | None = None,
) -> Callable[[F], F]:
    """Register ``fn(**params[, idempotency_key=...])`` as a tool with a safety class.

    - ``safety``: ``"read_only"``, ``"idempotent_write"`` (repeating with the same
      idempotency key is safe) or ``"unsafe_write"``.
    - ``retry``: the tool's :class:`RetryPolicy`; ``timeout``: seconds per attempt.
    - ``reconcile(params, *, idempotency_key)``: asked after an unknown outcome; returns
      the result if the write happened, or :data:`durable.NOT_FOUND` if it did not.
    - ``compensate(params, result, *, idempotency_key)``: undoes a completed write.
    - ``external_id(result)``: the id the external system gave the write (for the ledger).
    - ``durability``: ``None`` (the workflow's default), ``"sync"`` or ``"batched"``
      (docs/architecture.md#batched-checkpoints). Only a ``read_only`` tool may be
      batched: ``"batched"`` on a write raises :class:`DurableConfigurationError`
      naming the tool, as does any other value.
    - ``rate_limit``: ``"<calls>/s"``, ``"/m"`` or ``"/h"`` (e.g. ``"60/m"``): at most
      that many calls in any window of the period; ``concurrency``: at most that many
      calls at once. Both hold across every run and worker; a call over the limit parks
      its run until the limit admits it (docs/limits.md). A bad value raises
      :class:`DurableConfigurationError` naming the tool.
    - The approval of a call (``requires_approval``, or a Tool row's override) asks
      ``approver_group`` (or anyone with the permission) for ``approvals_required``
      approvals (N of M, each by a different person); after ``approval_timeout``
      seconds (``None``: never) ``approval_on_timeout`` applies: ``"reject"`` (the model
      gets the rejection) or ``"escalate"`` to the group ``escalate_to``, as
      ``ctx.wait_for_approval`` does. A bad value raises
      :class:`DurableConfigurationError` naming the tool.

    A Tool row in the database (edited in the admin) overrides retry, timeout,
    requires_approval, allow_edit, safety, rate_limit and concurrency.
    """
    if safety not in SAFETY_CLASSES:
        raise DurableConfigurationError(
            f"tool safety must be one of {', '.join(SAFETY_CLASSES)}, got {safety!r}"
        )
    if timeout is not None:
        check_duration(timeout, call=f"durable.tool(name={name!r}, timeout=...)", positive=True)
    if approval_timeout is not None:
        check_duration(
            approval_timeout,
            call=f"durable.tool(name={name!r}, approval_timeout=...)",
            positive=True,
        )
    _check_approval_policy(name, approvals_required, approval_on_timeout, escalate_to)

    def decorator(fn: F) -> F:
        tool_name = name or fn.__name__
        where = f"durable.tool(name={tool_name!r})"
        rate = parse_rate(rate_limit, where=where)
        slots = check_concurrency(concurrency, where=where)
        if not _NAME_RE.match(tool_name):
            raise DurableConfigurationError(f"tool name {tool_name!r} is not valid")
        existing = _tools.get(tool_name)
        if existing is not None and (existing.fn.__module__, existing.fn.__qualname__) != (
            fn.__module__,
            fn.__qualname__,
        ):
            raise DurableConfigurationError(f"tool {tool_name!r} is registered twice")
        mode = check_durability(durability, where=f"durable.tool(name={tool_name!r})")
        if mode == Durability.BATCHED and safety != Safety.READ_ONLY:
            raise DurableConfigurationError(
                f"tool {tool_name!r} is an {safety}: its checkpoint cannot be batched, since "
                "a lost checkpoint would repeat the write; writes are always "
                'durability="sync" (leave durability unset)'
            )
        _tools[tool_name] = ToolSpec(
            name=tool_name,
            fn=fn,
            safety=safety,
            retry=retry,
            timeout=timeout,
            requires_approval=requires_approval,
            allow_edit=allow_edit,
            reconcile=reconcile,
            compensate=compensate,
            external_id=external_id,
            description=(inspect.getdoc(fn) or "").split("\n\n")[0],
            approver_group=approver_group,
            durability=mode,
            rate_limit=rate,
            concurrency=slots,
            approval_timeout=approval_timeout,
            approvals_required=approvals_required,
            approval_on_timeout=approval_on_timeout,
            escalate_to=escalate_to,
        )
        fn.tool_name = tool_name  # type: ignore[attr-defined]
        return fn

    return decorator


def _check_approval_policy(
    name: str | None, required: Any, on_timeout: Any, escalate_to: Any
) -> None:
    """The approval options of ``durable.tool``; raises :class:`DurableConfigurationError`."""
    where = f"durable.tool(name={name!r})"
    if isinstance(required, bool) or not isinstance(required, int) or required < 1:
        raise DurableConfigurationError(
            f"{where}: approvals_required must be an int >= 1, got {required!r}"
        )
    if on_timeout not in ("reject", "escalate"):
        raise DurableConfigurationError(
            f"{where}: approval_on_timeout must be 'reject' or 'escalate', got {on_timeout!r}"
        )
    if on_timeout == "escalate" and not escalate_to:
        raise DurableConfigurationError(
            f"{where}: approval_on_timeout='escalate' needs escalate_to (a group name)"
        )


_DURABILITIES = frozenset(Durability.values)


def check_durability(value: Any, *, where: str) -> str | None:
    """``value`` as a :class:`Durability` (``None`` stays ``None``).

    Raises :class:`DurableConfigurationError` naming ``where`` (the declaration or the
    call the value came from) for anything but ``None``, ``"sync"`` or ``"batched"``.
    """
    if value is None:
        return None
    if isinstance(value, str) and value in _DURABILITIES:
        return Durability(value)
    raise DurableConfigurationError(
        f"{where}: durability must be one of {', '.join(map(repr, Durability.values))}, "
        f"got {value!r}"
    )


def get_workflow(name: str, version: str | None = None) -> WorkflowSpec:
    """The spec for ``name`` (and ``version``; default: the last registered).

    Raises :class:`WorkflowNotFound`.
    """
    ensure_discovered()
    _load_named(_lazy_workflows, name)
    versions = _workflows.get(name)
    if not versions or (version is not None and str(version) not in versions):
        _load_all_lazy()  # registered by a declared module without being declared
        versions = _workflows.get(name)
    if not versions:
        raise WorkflowNotFound(name, version, list(_workflows))
    if version is None:
        return next(reversed(versions.values()))
    try:
        return versions[str(version)]
    except KeyError:
        raise WorkflowNotFound(name, version, [f"{name}@{v}" for v in versions]) from None


def workflows() -> list[WorkflowSpec]:
    """Every registered workflow (each version), the :func:`lazy_module` ones imported."""
    ensure_discovered()
    _load_all_lazy()
    return [spec for versions in _workflows.values() for spec in versions.values()]


def get_tool(name: str) -> ToolSpec:
    """The code spec of tool ``name``. Raises :class:`ToolNotFound`."""
    ensure_discovered()
    _load_named(_lazy_tools, name)
    if name not in _tools:
        _load_all_lazy()  # registered by a declared module without being declared
    try:
        return _tools[name]
    except KeyError:
        raise ToolNotFound(name) from None


def tools() -> list[ToolSpec]:
    """Every registered tool, the :func:`lazy_module` ones imported."""
    ensure_discovered()
    _load_all_lazy()
    return list(_tools.values())


def effective_tool(spec: ToolSpec, row: Any | None) -> ToolSpec:
    """Merge a :class:`durable.models.Tool` row (admin settings) over the code spec."""
    if row is None:
        return spec
    retry = spec.retry
    if row.retry_policy:
        retry = RetryPolicy.from_dict(row.retry_policy, base=spec.retry)
    return replace(
        spec,
        safety=row.safety or spec.safety,
        retry=retry,
        timeout=row.timeout_seconds if row.timeout_seconds is not None else spec.timeout,
        requires_approval=row.requires_approval,
        allow_edit=row.allow_edit,
        approver_group=row.approver_group.name if row.approver_group_id else spec.approver_group,
        rate_limit=parse_rate(row.rate_limit, where=f"the admin's tool {spec.name!r}")
        if row.rate_limit
        else spec.rate_limit,
        concurrency=row.concurrency if row.concurrency is not None else spec.concurrency,
    )


def _import(module: str) -> None:
    """Import ``module``; on failure record it in :data:`load_errors` and take back what
    it registered before it failed (a workflow of a half-imported module is not served)."""
    workflows_before = {name: set(versions) for name, versions in _workflows.items()}
    tools_before = set(_tools)
    try:
        importlib.import_module(module)
        load_errors.pop(module, None)
    except Exception:  # noqa: BLE001 - any failure of user code is reported, not fatal
        for name in list(_workflows):
            versions = _workflows[name]
            for version in set(versions) - workflows_before.get(name, set()):
                del versions[version]
            if not versions:
                del _workflows[name]
        for name in set(_tools) - tools_before:
            del _tools[name]
        load_errors[module] = traceback.format_exc()
        logger.error(
            "durable: workflow module %s failed to import; its workflows are "
            "unavailable on this process:\n%s",
            module,
            load_errors[module],
        )


def app_workflow_modules() -> list[str]:
    """The ``workflows`` modules of the installed apps, in app order (those that exist)."""
    from django.apps import apps

    found = []
    for app_config in apps.get_app_configs():
        module = f"{app_config.name}.workflows"
        try:
            if importlib.util.find_spec(module) is not None:
                found.append(module)
        except (ImportError, ValueError):
            pass
    return found


def autodiscover() -> None:
    """Import ``workflows.py`` of every installed app and ``DURABLE['WORKFLOW_MODULES']``.

    With ``DURABLE['AUTODISCOVER']`` False only ``WORKFLOW_MODULES`` are imported: a
    worker that serves some workflows does not pay for importing the others (and their
    frameworks); a run of a workflow it lacks is released for another worker. A module
    that fails to import is recorded in :data:`load_errors` (shown by ``manage.py
    durable workflows`` and the system checks); the others still load.
    """
    from durable import conf

    for module in app_workflow_modules() if conf.get("AUTODISCOVER") else ():
        _import(module)
    for module in conf.get("WORKFLOW_MODULES") or []:
        _import(module)


# --- discovery when first needed ---------------------------------------------------------
#
# Importing the workflow modules costs seconds where they import agent frameworks
# (LangGraph, PydanticAI, the OpenAI Agents SDK): a CLI command that reads runs, a web
# process before its first page that needs the registry, pay nothing for them. The app's
# ready() only asks for discovery (:func:`discover_later`); the first lookup of the
# registry (:func:`get_workflow`, :func:`workflows`, :func:`get_tool`, :func:`tools`,
# :func:`import_errors`) runs it, once, under a lock: another thread waits until it is
# done, and a module that looks the registry up while it is imported (the importing
# thread itself) sees what is registered so far. A Celery worker discovers in its main
# process before it forks its children (``durable.worker.tasks``), so they share it.

_discovery_lock = threading.RLock()
_discovery_pending = False
_discovering = False


def discover_later() -> None:
    """Ask for :func:`autodiscover` at the first lookup of the registry."""
    global _discovery_pending
    _discovery_pending = True


def ensure_discovered() -> None:
    """Run the discovery :func:`discover_later` asked for, if it has not run yet."""
    global _discovery_pending, _discovering
    if not _discovery_pending:
        return
    with _discovery_lock:
        if not _discovery_pending or _discovering:
            return  # done by another thread meanwhile, or this thread is importing
        _discovering = True
        try:
            autodiscover()
        finally:
            _discovery_pending = False
            _discovering = False


def import_errors() -> dict[str, str]:
    """The workflow modules that failed to import: module -> traceback text (the
    :func:`lazy_module` ones imported first)."""
    ensure_discovered()
    _load_all_lazy()
    return dict(load_errors)


# --- modules imported when one of their names is first looked up -----------------------
#
# A workflow module that imports an agent framework costs seconds: declared with
# lazy_module(), it is imported by the first lookup of one of its names (a worker's
# first run of one of its workflows), by a lookup that finds nothing (a name it registers
# without declaring it is still found), or by the first listing of the registry, not at
# discovery, so a worker on the demo's configuration is ready without the frameworks.
# _lazy_lock guards the tables only and is never held while importing: lazy_module() runs
# while its caller is being imported, perhaps by another thread than the one that holds
# _discovery_lock for an import that waits for it.

_lazy_lock = threading.Lock()
#: declared, not yet imported: workflow or tool name -> the modules that declare it
_lazy_workflows: dict[str, dict[str, None]] = {}
_lazy_tools: dict[str, dict[str, None]] = {}
#: module -> (workflow names, tool names), in declaration order
_lazy_declared: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
#: modules being imported by _load_lazy
_importing: set[str] = set()


def lazy_module(module: str, *, workflows: Iterable[str] = (), tools: Iterable[str] = ()) -> None:
    """Declare that importing ``module`` registers ``workflows`` and ``tools`` (lists of
    names), without importing it now.

    The module is imported, once, at the first :func:`get_workflow` or :func:`get_tool`
    of one of its names or of a name nothing registers, or at the first
    :func:`workflows`, :func:`tools` or :func:`import_errors`. Several modules may
    declare one name (versions of a workflow): a lookup imports each. Declaring a module
    again replaces its names. A module that fails to import, or does not register a name
    it declared, is reported as a failed import (:func:`import_errors`, ``manage.py
    durable workflows``, check ``durable.W001``). Call it from a workflow module, e.g.
    ``lazy_module("myapp.graphs", workflows=["myapp.refund_graph"])``. Raises
    :class:`DurableConfigurationError` for a name that is not a name, or a string where a
    list is expected.
    """
    if not isinstance(module, str) or not module:
        raise DurableConfigurationError(f"lazy_module: {module!r} is not a module name")
    for kind, given in (("workflows", workflows), ("tools", tools)):
        if isinstance(given, (str, bytes)):
            raise DurableConfigurationError(
                f"lazy_module({module!r}, {kind}={given!r}): a list of names, not one string"
            )
    names = (tuple(workflows), tuple(tools))
    for name in (*names[0], *names[1]):
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise DurableConfigurationError(
                f"lazy_module({module!r}): {name!r} is not a workflow or tool name"
            )
    with _lazy_lock:
        _forget(module)
        _lazy_declared[module] = names
        for table, declared in ((_lazy_workflows, names[0]), (_lazy_tools, names[1])):
            for name in declared:
                table.setdefault(name, {})[module] = None


def _forget(module: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Take ``module``'s declaration out of the tables (under ``_lazy_lock``)."""
    declared = _lazy_declared.pop(module, None)
    for table, names in zip((_lazy_workflows, _lazy_tools), declared or ((), ()), strict=True):
        for name in names:
            table.get(name, {}).pop(module, None)
            if not table.get(name, True):
                del table[name]
    return declared


def _load_named(table: dict[str, dict[str, None]], name: str) -> None:
    """Import the modules that declare ``name`` (a workflow's or a tool's)."""
    with _lazy_lock:
        modules = list(table.get(name, ()))
    for module in modules:
        _load_lazy(module)


def _load_lazy(module: str) -> None:
    # _discovery_lock orders the imports: a thread that looks a name up while another
    # imports its module waits here (the names stay declared until the import is done)
    with _discovery_lock:
        with _lazy_lock:
            declared = _lazy_declared.get(module)
            if declared is None or module in _importing:
                return  # imported meanwhile, or being imported by this very thread
            _importing.add(module)
        try:
            _import(module)
        finally:
            with _lazy_lock:
                _importing.discard(module)
                if _lazy_declared.get(module) is declared:  # not declared anew meanwhile
                    _forget(module)
        missing = [n for n in declared[0] if n not in _workflows]
        missing += [n for n in declared[1] if n not in _tools]
        if missing and module not in load_errors:
            load_errors[module] = (
                f"DurableConfigurationError: lazy_module({module!r}) declared "
                f"{', '.join(map(repr, missing))}, which importing it did not register"
            )
            logger.error("durable: %s", load_errors[module])


def _load_all_lazy() -> None:
    """Import every declared module, those declared by these imports included."""
    while True:
        with _lazy_lock:
            module = next((m for m in _lazy_declared if m not in _importing), None)
        if module is None:
            return
        _load_lazy(module)
