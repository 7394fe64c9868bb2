"""Starting a run from the dashboard: ``GET /runs/new/`` and its ``POST``.

The operator picks a registered workflow and gives its input. When the workflow's
``input`` parameter has a type hint that pydantic can validate (a pydantic model, a
``TypedDict``, a dataclass), the form has one field per top-level property of its JSON
schema (a text, number or checkbox field, a choice for an enum, a JSON box for anything
nested), and the input is validated against the hint before anything starts: each error
is shown by its field. Without a hint the input is one JSON box, prefilled with the input
of the workflow's last run. Nothing is started on an error (422); on success the run is
started by the operator (as ``durable.start`` with ``started_by``) and the page goes to
it. The system's own workflows (``durable.*``, ``api.*``, ``approvals.*``) are not offered.

With ``?from=<run id>`` the form is the source run's workflow, prefilled with its input
(redacted values shown as ``[REDACTED]``, which must be typed again), and a choice of
step: *none* starts a new run with the edited input; a step forks the run from there
with it (:func:`durable.services.forks.run_fork` with ``input``): the steps before it
keep their results, made with the old input.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import typing
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods
from pydantic import TypeAdapter, ValidationError

import durable
from approvals.access import require_perm
from approvals.roles import OPERATE_RUN
from durable import registry
from durable.exceptions import DurableError
from durable.models import Run, Step, transitions
from durable.services.forks import fork_points, run_fork
from durable.values import codec, redaction

#: the first segment of the system's own workflows' names: not started by hand
SYSTEM_NAMESPACES = frozenset({"durable", "api", "approvals", "dashboard"})
#: at most this many characters of JSON in one box (the input's own limits apply too)
MAX_JSON = 100_000
_SIMPLE = {"string": "text", "integer": "number", "number": "number", "boolean": "checkbox"}


@dataclass
class Field:
    """One input of the form: ``kind`` is ``text``, ``number``, ``checkbox``, ``choice``
    or ``json`` (anything nested); ``value`` what the box shows."""

    name: str
    kind: str
    required: bool
    value: str = ""
    choices: list[str] = field(default_factory=list)
    description: str = ""
    error: str = ""
    #: ``X | None``: left empty, a required one is None
    nullable: bool = False


def startable() -> list[registry.WorkflowSpec]:
    """The registered workflows an operator may start, by name (the last version each)."""
    # the workflow that sends approval emails is the system's too, whatever its name
    emails = getattr(settings, "DURABLE_APPROVAL_EMAIL_WORKFLOW", "")
    specs: dict[str, registry.WorkflowSpec] = {}
    for spec in registry.workflows():
        if spec.name.split(".", 1)[0] not in SYSTEM_NAMESPACES and spec.name != emails:
            specs[spec.name] = spec
    return [specs[name] for name in sorted(specs)]


def input_hint(spec: registry.WorkflowSpec) -> Any:
    """The type hint of the workflow's input parameter (its second), or ``None`` when it
    has none pydantic can build a schema for (``Any``, none, or an unresolvable one)."""
    params = list(inspect.signature(spec.fn).parameters.values())
    if len(params) < 2:
        return None
    try:
        hint = typing.get_type_hints(spec.fn).get(params[1].name)
    except Exception:  # noqa: BLE001 - a forward reference that does not resolve
        return None
    if hint is None or hint is Any:
        return None
    try:
        schema = TypeAdapter(hint).json_schema()
    except Exception:  # noqa: BLE001 - pydantic cannot describe it: the JSON box
        return None
    return hint if schema.get("type") == "object" and schema.get("properties") else None


def _fields(hint: Any) -> list[Field]:
    schema = TypeAdapter(hint).json_schema()
    defs = schema.get("$defs", {})
    required = set(schema.get("required", ()))
    fields = []
    for name, prop in schema["properties"].items():
        prop, nullable = _unwrap_optional(prop)
        if "$ref" in prop:  # an enum or a nested model, described in $defs
            prop = {**defs.get(prop["$ref"].rsplit("/", 1)[-1], {}), **prop}
        default = prop.get("default")
        if "enum" in prop:
            kind, choices = "choice", [str(v) for v in prop["enum"]]
        else:
            kind, choices = _SIMPLE.get(prop.get("type", ""), "json"), []
        value = ""
        if default is not None:
            value = json.dumps(default, ensure_ascii=False) if kind == "json" else str(default)
        fields.append(
            Field(
                name=name,
                kind=kind,
                required=name in required,
                value=value,
                choices=choices,
                description=prop.get("description", ""),
                nullable=nullable,
            )
        )
    return fields


def _unwrap_optional(prop: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``(schema, nullable)`` of a property: ``X | None`` (pydantic's ``anyOf`` of X and
    ``null``) is a field of X that may be left empty, not a JSON box whose text must be
    JSON (a plain note would need its quotes typed)."""
    options = prop.get("anyOf")
    if not isinstance(options, list):
        return prop, False
    kept = [o for o in options if o != {"type": "null"}]
    if len(kept) != 1 or len(kept) == len(options):
        return prop, False
    rest = {k: v for k, v in prop.items() if k != "anyOf"}
    return {**kept[0], **rest}, True


def _read_fields(fields: list[Field], data: Any) -> dict[str, Any]:
    """The input the posted fields make (raw: pydantic converts and checks them); a box
    whose JSON does not parse gets its error."""
    value: dict[str, Any] = {}
    for f in fields:
        if f.kind == "checkbox":
            f.value = "true" if data.get(f.name) else ""
            value[f.name] = bool(data.get(f.name))
            continue
        f.value = str(data.get(f.name, ""))[:MAX_JSON]
        if f.value == "" and not f.required:
            continue  # left empty: the default
        if f.value == "" and f.nullable:
            value[f.name] = None
            continue
        if f.kind == "json":
            try:
                value[f.name] = json.loads(f.value)
            except ValueError as exc:
                f.error = f"not JSON: {exc}"
        else:
            value[f.name] = f.value
    return value


def _validate(hint: Any, fields: list[Field], value: dict[str, Any]) -> Any:
    """``value`` checked against ``hint`` (pydantic's lax mode: "3" is an int); errors go
    to their fields. Returns the input as JSON data, or ``None`` on an error."""
    try:
        checked = TypeAdapter(hint).validate_python(value)
    except ValidationError as exc:
        by_name = {f.name: f for f in fields}
        for error in exc.errors(include_input=False, include_url=False):
            loc = [str(part) for part in error["loc"]]
            target = by_name.get(loc[0]) if loc else None
            where = ".".join(loc[1:])
            text = f"{where}: {error['msg']}" if where else error["msg"]
            if target is not None and not target.error:
                target.error = text
        return None
    return TypeAdapter(hint).dump_python(checked, mode="json")


def _prefill(fields: list[Field], value: Any) -> None:
    """Fill ``fields`` with the top-level values of an input (a source run's)."""
    if not isinstance(value, dict):
        return
    for f in fields:
        if f.name not in value:
            continue
        v = value[f.name]
        if v is None and f.nullable:
            f.value = ""
        elif f.kind == "checkbox":
            f.value = "true" if v else ""
        elif f.kind == "json" or not isinstance(v, str | int | float):
            f.value = json.dumps(v, ensure_ascii=False)
        else:
            f.value = str(v)


def _redacted_left(value: Any) -> bool:
    """Whether a redacted placeholder of a prefilled input was left in ``value``."""
    if isinstance(value, str):
        return value == redaction.REDACTED
    if isinstance(value, dict):
        return any(_redacted_left(v) for v in value.values())
    if isinstance(value, list):
        return any(_redacted_left(v) for v in value)
    return False


@dataclass
class Source:
    """The run a form starts from (``?from=``): its display input and fork points."""

    run: Run
    value: Any
    points: list[str]


def _source(run_id: str) -> Source | None:
    run = Run.objects.filter(pk=run_id[:128]).first()
    if run is None:
        return None
    try:
        value = codec.decode_for_display(run.input) if run.input else None
    except (ValueError, TypeError):
        value = None
    points: list[str] = []
    if transitions.can("fork", run):
        steps = Step.objects.filter(run=run).order_by("position").only("step_id", "kind", "status")
        points = fork_points(steps)
    return Source(run=run, value=value, points=points)


def _last_input(name: str) -> str:
    run = Run.objects.filter(workflow_name=name).order_by("-created_at").only("input").first()
    if run is None or not run.input:
        return "{}"
    try:
        return json.dumps(codec.decode_for_display(run.input), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return "{}"


@require_http_methods(["GET", "HEAD", "POST"])
@require_perm(OPERATE_RUN)
def start_run(request: HttpRequest) -> HttpResponse:
    """The start form (GET, ``?workflow=name`` to choose), and the start (POST)."""
    data = request.POST if request.method == "POST" else request.GET
    specs = {spec.name: spec for spec in startable()}
    source: Source | None = None
    if data.get("from"):
        source = _source(str(data["from"]))
        if source is None:
            context = {"nav": "runs", "workflows": list(specs), "chosen": ""}
            context["error"] = f"There is no run {str(data['from'])[:128]!r} to start from."
            return render(request, "dashboard/start_run.html", context, status=422)
    chosen = source.run.workflow_name if source else str(data.get("workflow", ""))
    spec = specs.get(chosen)
    context: dict[str, Any] = {"nav": "runs", "workflows": list(specs), "chosen": chosen}
    if source is not None:
        from_step = str(data.get("from_step", ""))
        context.update(source=source, from_step=from_step)
        if spec is not None:  # the source's own version, when this process has it
            with contextlib.suppress(DurableError):
                spec = registry.get_workflow(source.run.workflow_name, source.run.workflow_version)
        if from_step and from_step not in source.points:
            context["error"] = (
                f"Run {source.run.id} cannot be forked from step {from_step[:200]!r}: "
                + (
                    "choose one of the steps offered"
                    if source.points
                    else "it has not finished (or has no step to reuse)"
                )
                + "."
            )
            return render(request, "dashboard/start_run.html", context, status=422)
    status = 200
    if chosen and spec is None:
        context["error"] = f"There is no workflow {chosen[:200]!r} to start here."
        return render(request, "dashboard/start_run.html", context, status=422)
    if spec is None:
        return render(request, "dashboard/start_run.html", context)
    hint = input_hint(spec)
    fields = _fields(hint) if hint is not None else []
    context.update(spec=spec, fields=fields, typed=hint is not None)
    if request.method != "POST":
        if source is not None:
            _prefill(fields, source.value)
            context["json"] = (
                json.dumps(source.value, indent=2, ensure_ascii=False) if hint is None else ""
            )
        else:
            context["json"] = _last_input(spec.name) if hint is None else ""
        return render(request, "dashboard/start_run.html", context)

    value: Any = None
    if hint is not None:
        raw = _read_fields(fields, data)
        value = _validate(hint, fields, raw)  # a box that is not JSON keeps its own error
        ok = value is not None and not any(f.error for f in fields)
    else:
        text = str(data.get("input", ""))
        context["json"] = text[:MAX_JSON]
        ok = len(text) <= MAX_JSON
        try:
            value = json.loads(text) if ok else None
        except ValueError as exc:
            ok = False
            context["error"] = f"The input is not JSON: {exc}."
        if len(text) > MAX_JSON:
            context["error"] = f"The input is over {MAX_JSON:,} characters."
    if ok and source is not None and _redacted_left(value):
        ok = False
        context["error"] = (
            f"Nothing started: the input still holds {redaction.REDACTED}, a secret of the "
            "source run that is not shown. Type its value again."
        )
    if ok:
        try:
            if source is not None and context.get("from_step"):
                run = run_fork(
                    run_id=source.run.id,
                    from_step=context["from_step"],
                    by=request.user,
                    reason=str(data.get("reason", ""))[:500],
                    input=value,
                )
                done = f"Forked run {source.run.id} into {run.id} with the edited input."
            else:
                run = durable.start(spec.name, value, started_by=request.user)
                done = f"Started {spec.name} as run {run.id}."
        except (DurableError, ValueError) as exc:
            context["error"] = f"Nothing started: {exc}"
        else:
            messages.success(request, done)
            return redirect("dashboard:run", run_id=run.id)
    status = 422
    context.setdefault("error", "Nothing started: correct the fields marked below.")
    return render(request, "dashboard/start_run.html", context, status=status)
