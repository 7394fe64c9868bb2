"""Checking a tool's arguments against its signature and type annotations (pydantic).

Used where a person supplies arguments that a tool will run with -- an approver's edit
(:mod:`approvals.services`) -- so that a wrong type or a missing argument is refused when
it is typed, not after the run resumed. A model is built once per tool function from
``inspect.signature`` and the resolved annotations (``typing.get_type_hints``):

- a parameter without a default is required; one without an annotation accepts anything;
- ``idempotency_key`` is Durable's to pass and is not an argument;
- unknown names are refused unless the function takes ``**kwargs``;
- validation is *strict* and runs in pydantic's JSON mode: ``"forty"`` and ``"40"`` are
  not an ``int``, ``40`` is; an ISO text is a ``datetime``. The value that was approved
  (whose hash the approval recorded) is the one stored as the call's input.

When the tool runs, :func:`convert_arguments` gives it its annotated types: a JSON value
(an approver's edit, an MCP client's arguments) for a parameter annotated with a richer
type -- ``date``, ``Decimal``, a pydantic model, a dataclass, an enum, ``list[date]`` --
is converted the way pydantic's JSON mode reads it (the rule FastMCP follows for its
tools); a value that is not JSON (a workflow passed the object itself), or does not fit,
is passed unchanged.

An annotation pydantic cannot build a schema for (an arbitrary class) is treated as
``Any`` for that parameter rather than refusing every edit.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import types
import typing
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

logger = logging.getLogger("durable.arguments")

__all__ = ["ArgumentError", "convert_arguments", "validate_arguments"]

#: Durable passes this keyword itself (``"{run_id}:{step_id}"``)
RESERVED = frozenset({"idempotency_key"})


@dataclass(frozen=True)
class ArgumentError:
    """One problem with one argument: ``field`` (dotted path, ``""`` for the whole) and
    ``message`` (pydantic's text; it never repeats the value, which may be secret)."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an unresolvable name: fall back per parameter
        hints: dict[str, Any] = {}
        namespace = getattr(fn, "__globals__", {})
        for name, ann in getattr(fn, "__annotations__", {}).items():
            if not isinstance(ann, str):
                hints[name] = ann
                continue
            try:  # what get_type_hints does, one annotation at a time
                hints[name] = eval(ann, namespace, {})  # the tool's own source text
            except Exception:  # noqa: BLE001, S112 - left unchecked (Any)
                continue
        return hints


def _buildable(annotation: Any) -> bool:
    try:
        TypeAdapter(annotation)
    except Exception:  # noqa: BLE001 - pydantic raises several types here
        return False
    return True


@functools.lru_cache(maxsize=512)
def _model(fn: Callable[..., Any]) -> type[BaseModel]:
    signature = inspect.signature(fn)
    hints = _hints(fn)
    fields: dict[str, Any] = {}
    extra: Literal["allow", "forbid"] = "forbid"
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"
            continue
        if (
            param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY)
            or param.name in RESERVED
        ):
            continue  # tools are called with keyword arguments only
        if param.name.startswith("_") or param.name == "model_config":
            raise ValueError(f"parameter {param.name!r} cannot be a pydantic field")
        annotation = hints.get(param.name, Any)
        if annotation is not Any and not _buildable(annotation):
            logger.info(
                "durable: %s.%s: annotation %r is not checked",
                fn.__qualname__,
                param.name,
                annotation,
            )
            annotation = Any
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    config = ConfigDict(
        extra=extra, strict=True, arbitrary_types_allowed=True, protected_namespaces=()
    )
    with warnings.catch_warnings():  # a parameter named like a BaseModel attribute is fine
        warnings.simplefilter("ignore")
        return create_model(
            f"{getattr(fn, '__name__', 'tool')}_arguments", __config__=config, **fields
        )


def _errors(exc: ValidationError) -> list[ArgumentError]:
    out = []
    for err in exc.errors(include_input=False, include_url=False):
        field = ".".join(str(part) for part in err.get("loc", ()))
        kind = err.get("type", "")
        message = err.get("msg", "invalid")
        if kind == "missing":
            message = "required: the tool has no default for it"
        elif kind == "extra_forbidden":
            message = "the tool takes no argument of this name"
        out.append(ArgumentError(field, message))
    return out


def _binding_errors(fn: Callable[..., Any], arguments: dict[str, Any]) -> list[ArgumentError]:
    """The names alone: what ``inspect.signature(fn).bind`` says (no types)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    kwargs = {k: v for k, v in arguments.items() if k not in RESERVED}
    if "idempotency_key" in signature.parameters:
        kwargs["idempotency_key"] = ""
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        return [ArgumentError("", str(exc))]
    return []


def validate_arguments(
    fn: Callable[..., Any], arguments: dict[str, Any], *, unchecked: Iterable[str] = ()
) -> list[ArgumentError]:
    """Return what is wrong with calling ``fn(**arguments)`` (empty: nothing).

    ``unchecked``: names whose values are present but not to be type-checked (a secret
    kept from the original call: its stored value is not JSON). Values must be JSON
    types (what an approver can type); others are checked in pydantic's Python mode.
    """
    errors = [
        ArgumentError(name, "is set by Durable, not by an edit")
        for name in arguments
        if name in RESERVED
    ]
    try:
        model = _model(fn)
    except Exception as exc:  # noqa: BLE001 - no signature, or names pydantic refuses
        logger.info("durable: cannot build a model of the arguments of %r: %s", fn, exc)
        return errors + _binding_errors(fn, arguments)
    skip = set(unchecked)
    checked = {k: (None if k in skip else v) for k, v in arguments.items() if k not in RESERVED}
    if skip:
        # a kept secret satisfies "present"; its type is not the edit's business
        fields: dict[str, Any] = {name: (Any, ...) for name in skip if name in model.model_fields}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = create_model(model.__name__, __base__=model, **fields)
    try:
        text = json.dumps(checked, allow_nan=False)
    except (TypeError, ValueError):
        text = None
    try:
        if text is not None:
            model.model_validate_json(text, strict=True)
        else:
            model.model_validate(checked, strict=True)
    except ValidationError as exc:
        errors.extend(_errors(exc))
    return errors


#: annotations whose JSON value is already the Python value: nothing to convert
_NATIVE = frozenset({str, int, float, bool, type(None), dict, list, object})


def _native(annotation: Any) -> bool:
    if annotation is Any or annotation in _NATIVE:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return True
    if origin is typing.Annotated:
        return _native(typing.get_args(annotation)[0])
    if origin in (dict, list, typing.Union, types.UnionType):
        return all(_native(arg) for arg in typing.get_args(annotation))
    return False


@functools.lru_cache(maxsize=512)
def _converters(fn: Callable[..., Any]) -> dict[str, TypeAdapter[Any]]:
    """The parameters of ``fn`` whose annotation is richer than JSON, with an adapter."""
    hints = _hints(fn)
    out: dict[str, TypeAdapter[Any]] = {}
    for name in inspect.signature(fn).parameters:
        annotation = hints.get(name, Any)
        if name in RESERVED or _native(annotation):
            continue
        try:
            out[name] = TypeAdapter(annotation)
        except Exception:  # noqa: BLE001, S112 - not buildable: passed unchanged
            continue
    return out


def convert_arguments(fn: Callable[..., Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` with each value converted to its parameter's annotated type, when
    the annotation is richer than JSON and the value is its JSON form (``"2026-12-05"``
    for a ``date``, an object for a pydantic model or dataclass). A value that is not
    JSON (already an object), does not fit, or names no annotated parameter is left as it is;
    ``arguments`` itself is not changed. Never raises: a value that does not fit was
    refused by :func:`validate_arguments` where arguments are taken."""
    try:
        converters = _converters(fn)
    except (TypeError, ValueError):  # no signature, or an unhashable callable
        return arguments
    if not converters or not converters.keys() & arguments.keys():
        return arguments
    out = dict(arguments)
    for name, adapter in converters.items():
        if name not in out:
            continue
        try:
            text = json.dumps(out[name], allow_nan=False)
        except (TypeError, ValueError):
            continue  # not a JSON value: already a Python object, given as it is
        try:
            out[name] = adapter.validate_json(text, strict=True)
        except ValidationError:
            continue  # not the JSON form of its type: the tool gets it as given
    return out


def arguments_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, ``{"type": "object", "properties", "required",
    ...}``) of ``fn``'s keyword arguments, as :func:`validate_arguments` checks them:
    ``idempotency_key`` left out, ``additionalProperties: false`` unless ``fn`` takes
    ``**kwargs``. A function whose signature cannot be modelled gets the open schema
    ``{"type": "object"}``."""
    try:
        schema = _model(fn).model_json_schema()
    except Exception as exc:  # noqa: BLE001 - no signature, or names pydantic refuses
        logger.info("durable: no argument schema for %r: %s", fn, exc)
        return {"type": "object"}
    schema.pop("title", None)
    for prop in (schema.get("properties") or {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return schema
