"""Checking a tool's arguments against its signature and type annotations (pydantic).

Used where a person supplies arguments that a tool will run with -- an approver's edit
(:mod:`approvals.services`) -- so that a wrong type or a missing argument is refused when
it is typed, not after the run resumed. A model is built once per tool function from
``inspect.signature`` and the resolved annotations (``typing.get_type_hints``):

- a parameter without a default is required; one without an annotation accepts anything;
- ``idempotency_key`` is Durable's to pass and is not an argument;
- unknown names are refused unless the function takes ``**kwargs``;
- validation is *strict* and runs in pydantic's JSON mode: ``"forty"`` and ``"40"`` are
  not an ``int``, ``40`` is; an ISO text is a ``datetime``. Values are checked, never
  converted: the tool receives exactly the value that was approved (whose hash the
  approval recorded).

An annotation pydantic cannot build a schema for (an arbitrary class) is treated as
``Any`` for that parameter rather than refusing every edit.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import typing
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

logger = logging.getLogger("durable.arguments")

__all__ = ["ArgumentError", "validate_arguments"]

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
