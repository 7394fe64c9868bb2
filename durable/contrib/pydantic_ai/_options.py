"""The run options of a ``DurableAgent`` run, stored with the run's input.

Invariant: what ``start`` stores is what every execution of the run -- the first, a
resume after an approval, a recovery on another worker -- gives back to the agent, of
the same types. ``deps`` go through Durable's codec (:mod:`durable.values.codec`:
``datetime``, ``Decimal``, ``UUID``, ``bytes``... keep their types, a value under a
secret key such as ``api_key`` is stored encrypted), a dataclass or Pydantic model as
the dict of its fields, rebuilt into the agent's ``deps_type`` at each execution. A
value the codec cannot store is refused by ``start`` with a
:class:`~durable.PayloadError` naming the field, before any run is written.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.errors import PydanticSchemaGenerationError
from pydantic_ai.usage import UsageLimits

from durable.exceptions import PayloadError
from durable.retry import RetryPolicy
from durable.values import codec

#: the metadata key of a PydanticAI tool's own :class:`StepSettings` (as Temporal's
#: ``metadata={"temporal": ActivityConfig(...)}``)
STEP_SETTINGS_KEY = "durable"

_HOW = (
    "pass what can be stored (ids, names, settings) and build the rest at each execution "
    "with DurableAgent(..., deps_factory=...)"
)


@dataclass(frozen=True)
class StepSettings:
    """How the step of a model request or a tool call runs.

    ``timeout`` (seconds, > 0): an attempt still running then is cancelled and fails as
    :class:`~durable.StepTimeout` (transient: tried again under ``retry``); ``None``: no
    limit. ``retry``: the step's :class:`~durable.RetryPolicy`; ``None``: the default
    step policy (3 attempts). Raises ``ValueError`` for a timeout that is not > 0.
    """

    timeout: float | None = None
    retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"StepSettings: timeout must be > 0 seconds, not {self.timeout!r}")

    def over(self, base: StepSettings | None) -> StepSettings:
        """These settings, each unset one taken from ``base``."""
        if base is None:
            return self
        return StepSettings(
            timeout=self.timeout if self.timeout is not None else base.timeout,
            retry=self.retry if self.retry is not None else base.retry,
        )


def tool_settings(metadata: Mapping[str, Any] | None) -> StepSettings | None:
    """The :class:`StepSettings` a tool's ``metadata["durable"]`` gives (or ``None``)."""
    given = (metadata or {}).get(STEP_SETTINGS_KEY)
    if given is None or isinstance(given, StepSettings):
        return given
    if isinstance(given, Mapping):
        return StepSettings(**given)
    raise TypeError(
        f'a tool\'s metadata["{STEP_SETTINGS_KEY}"] is a StepSettings or a dict of its '
        f"fields, not {type(given).__name__}"
    )


# ---------------------------------------------------------------- deps


def _plain(value: Any, path: str) -> Any:
    """``value`` as what the codec stores: dataclasses and models as dicts of fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _plain(getattr(value, f.name), f"{path}.{f.name}")
            for f in dataclasses.fields(value)
        }
    if isinstance(value, BaseModel):
        return {
            name: _plain(getattr(value, name), f"{path}.{name}")
            for name in type(value).model_fields
        }
    if type(value) is dict:
        return {k: _plain(v, f"{path}[{k!r}]") for k, v in value.items()}
    if type(value) in (list, tuple):
        items = [_plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if type(value) is list else tuple(items)
    try:
        codec.encode(value, where=path)
    except PayloadError:
        raise PayloadError(
            f"{path}: a {type(value).__module__}.{type(value).__qualname__} cannot be "
            f"stored with the run; {_HOW}"
        ) from None
    return value


def _rebuild(stored: Any, deps_type: Any) -> Any:
    if stored is None or deps_type in (None, type(None), Any, object):
        return stored
    try:
        return TypeAdapter(deps_type).validate_python(stored)
    except PydanticSchemaGenerationError:  # a type Pydantic cannot validate: its fields
        if isinstance(stored, dict) and isinstance(deps_type, type):
            return deps_type(**stored)
        return stored


def store_deps(deps: Any, deps_type: Any, *, factory: bool) -> Any:
    """The stored form of ``deps`` (raises :class:`~durable.PayloadError` naming the
    field that cannot be stored, or the type that cannot be rebuilt from it)."""
    stored = _plain(deps, "deps")
    if factory:  # the factory makes the deps: what is stored is its input
        return stored
    try:
        _rebuild(codec.decode(codec.encode(stored, where="deps")), deps_type)
    except PayloadError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported with the type that refused
        raise PayloadError(
            f"deps: the stored value does not rebuild into {deps_type!r} ({exc}); {_HOW}"
        ) from None
    return stored


def load_deps(stored: Any, deps_type: Any, factory: Callable[[Any], Any] | None) -> Any:
    """The deps of an execution: ``factory(stored)``, else ``stored`` as ``deps_type``
    (``ValueError`` when it no longer fits: the type changed under a waiting run)."""
    if factory is not None:
        return factory(stored)
    try:
        return _rebuild(stored, deps_type)
    except Exception as exc:  # noqa: BLE001 - the run fails saying why, once
        raise ValueError(
            f"the run's stored deps no longer fit the agent's deps_type {deps_type!r} "
            f"({exc}); a change of the deps type needs a new workflow version"
        ) from None


# ---------------------------------------------------------------- other options


def store_usage_limits(limits: UsageLimits | None) -> dict[str, Any] | None:
    if limits is None:
        return None
    if not isinstance(limits, UsageLimits):
        raise TypeError(f"usage_limits is a pydantic_ai.UsageLimits, not {type(limits).__name__}")
    return {f.name: getattr(limits, f.name) for f in dataclasses.fields(limits)}


def load_usage_limits(stored: dict[str, Any] | None) -> UsageLimits | None:
    if stored is None:
        return None
    known = {f.name for f in dataclasses.fields(UsageLimits)}
    return UsageLimits(**{k: v for k, v in stored.items() if k in known})


def store_model_settings(settings: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if settings is None:
        return None
    stored = _plain(dict(settings), "model_settings")
    codec.encode(stored, where="model_settings")
    return typing.cast(dict[str, Any], stored)


def toolset_ids(toolsets: Sequence[Any] | None, known: Mapping[str, Any]) -> list[str] | None:
    """The ids of the run's extra toolsets: each one of ``known`` (the agent's registered
    toolsets), given as itself or its id; ``ValueError`` for any other."""
    if toolsets is None:
        return None
    ids: list[str] = []
    for toolset in toolsets:
        tid = toolset if isinstance(toolset, str) else getattr(toolset, "id", None)
        if (
            not isinstance(tid, str)
            or tid not in known
            or (not isinstance(toolset, str) and known[tid] is not toolset)
        ):
            raise ValueError(
                f"toolsets: {toolset!r} is not one of the agent's registered toolsets "
                f"({sorted(known) or 'none'}); register it with DurableAgent(..., toolsets=[...]) "
                "so every worker has its code"
            )
        ids.append(tid)
    return ids
