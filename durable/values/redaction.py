"""Deciding what is secret: secret-looking dict keys and token-looking strings.

Two settings drive it (see :mod:`durable.conf`):

- ``DURABLE["REDACT_KEYS"]`` -- case-insensitive substrings of dict keys; ``-`` counts
  as ``_``, so ``"api_key"`` matches ``"X-Api-Key"`` and ``"openai_api_key"``.
  ``DURABLE["REDACT_KEYS_ALLOW"]`` lists normalised keys that contain an entry but are
  not secret (``"total_tokens"``), matched exactly.
- ``DURABLE["REDACT_PATTERNS"]`` -- regular expressions for tokens found anywhere in a
  string (by default: ``sk-...`` and Stripe keys, ``Authorization:`` values, ``Bearer``
  and ``Basic`` credentials, GitHub, Slack and AWS keys, PEM private-key blocks, JWTs,
  ``user:password@`` in URLs).

:mod:`durable.values.codec` encrypts the values these select -- every value under a secret
key, whatever its type, and every string matching a pattern; :func:`redact_text` blanks
pattern matches (and secret-named URL parameters) out of free text (error messages,
tracebacks, logs, span data, approval titles);
:func:`check_identifier` refuses identifiers that look like secrets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from durable import conf
from durable.exceptions import DurableConfigurationError
from durable.values.fields import hidden_character

__all__ = [
    "REDACTED",
    "KeyMatcher",
    "PatternMatcher",
    "check_identifier",
    "is_secret_key",
    "key_matcher",
    "matches_secret_pattern",
    "pattern_matcher",
    "redact_text",
]

#: what a redacted value is shown as
REDACTED = "[REDACTED]"


# matchers for the current settings; emptied whenever DURABLE (or settings) change
_settings_cache: dict[str, Any] = {}


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "DURABLE":
        _settings_cache.clear()


def _normalise(key: str) -> str:
    return key.lower().replace("-", "_")


def _as_tuple(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Iterable):
        return tuple(str(v) for v in value)
    raise DurableConfigurationError(f"DURABLE[{name!r}] must be a list of strings")


# --- keys ----------------------------------------------------------------------------


class KeyMatcher:
    """``matcher(key) -> bool``: whether a dict key names a secret, with a result cache."""

    __slots__ = ("_allow", "_cache", "_regex")

    def __init__(self, keys: tuple[str, ...], allow: tuple[str, ...] = ()) -> None:
        parts = sorted({_normalise(k) for k in keys if k}, key=len, reverse=True)
        self._regex = re.compile("|".join(map(re.escape, parts))) if parts else None
        self._allow = frozenset(_normalise(k) for k in allow if k)
        self._cache: dict[str, bool] = {}

    def __call__(self, key: str) -> bool:
        try:
            return self._cache[key]
        except KeyError:
            pass
        normal = _normalise(key)
        found = (
            self._regex is not None
            and normal not in self._allow
            and self._regex.search(normal) is not None
        )
        if len(self._cache) >= 8192:
            self._cache.clear()
        self._cache[key] = found
        return found


@lru_cache(maxsize=16)
def _key_matcher_for(keys: tuple[str, ...], allow: tuple[str, ...]) -> KeyMatcher:
    return KeyMatcher(keys, allow)


def key_matcher() -> KeyMatcher | None:
    """Return the matcher for the configured ``REDACT_KEYS``, or None when there are none.

    Cached until the ``DURABLE`` setting changes (``setting_changed``).
    """
    try:
        return _settings_cache["keys"]
    except KeyError:
        pass
    keys = _as_tuple(conf.get("REDACT_KEYS"), "REDACT_KEYS")
    allow = _as_tuple(conf.get("REDACT_KEYS_ALLOW"), "REDACT_KEYS_ALLOW")
    matcher = _key_matcher_for(keys, allow) if keys else None
    _settings_cache["keys"] = matcher
    return matcher


def is_secret_key(key: str) -> bool:
    """Whether a dict key names a secret.

    True when any ``REDACT_KEYS`` entry is a substring of ``key``, ignoring case and
    treating ``-`` as ``_`` (``"X-Api-Key"``, ``"openai_api_key"`` and
    ``"Authorization"`` match the defaults), unless the normalised key is listed in
    ``REDACT_KEYS_ALLOW`` (``"total_tokens"``). Non-str keys are never secret.
    """
    if not isinstance(key, str):
        return False
    matcher = key_matcher()
    return matcher is not None and matcher(key)


# --- patterns ------------------------------------------------------------------------


class PatternMatcher:
    """``matcher(text) -> bool``: whether any ``REDACT_PATTERNS`` entry matches in ``text``.

    ``matcher.key(text)`` is the same test with a result cache, for dict keys (short,
    and repeated across a payload).
    """

    __slots__ = ("_key_cache", "_searches", "compiled")

    def __init__(self, compiled: tuple[re.Pattern[str], ...]) -> None:
        self.compiled = compiled
        # one search per pattern: an alternation of them all is slower, as it loses
        # each pattern's literal-prefix scan
        self._searches = tuple(p.search for p in compiled)
        self._key_cache: dict[str, bool] = {}

    def __call__(self, text: str) -> bool:
        return any(search(text) is not None for search in self._searches)

    def key(self, text: str) -> bool:
        try:
            return self._key_cache[text]
        except KeyError:
            pass
        found = self(text)
        if len(self._key_cache) >= 8192:
            self._key_cache.clear()
        self._key_cache[text] = found
        return found


@lru_cache(maxsize=16)
def _compiled(patterns: tuple[str, ...]) -> PatternMatcher:
    """Compile the patterns; raise DurableConfigurationError naming a bad one."""
    compiled = []
    for i, p in enumerate(patterns):
        try:
            compiled.append(re.compile(p))
        except re.error as exc:
            raise DurableConfigurationError(
                f"DURABLE['REDACT_PATTERNS'] entry #{i + 1} ({p!r}) is not a valid "
                f"regular expression: {exc}"
            ) from exc
    return PatternMatcher(tuple(compiled))


def _current_patterns() -> PatternMatcher:
    return _compiled(_as_tuple(conf.get("REDACT_PATTERNS"), "REDACT_PATTERNS"))


def pattern_matcher() -> PatternMatcher | None:
    """Return the matcher for the configured ``REDACT_PATTERNS``, or None when there are none.

    Cached until the ``DURABLE`` setting changes (``setting_changed``).
    """
    try:
        return _settings_cache["patterns"]
    except KeyError:
        pass
    current = _current_patterns()
    matcher = current if current.compiled else None
    _settings_cache["patterns"] = matcher
    return matcher


def matches_secret_pattern(text: str) -> bool:
    """Whether any ``REDACT_PATTERNS`` entry matches somewhere in ``text``."""
    matcher = pattern_matcher()
    return matcher is not None and matcher(text)


def redact_text(text: str) -> str:
    """Return ``text`` with every ``REDACT_PATTERNS`` match, and every secret known in
    this context (:func:`secrets_scope`), replaced by ``[REDACTED]``.

    The value of a URL query or form parameter whose name is a secret key
    (:func:`is_secret_key`: ``?api_key=...``, ``&password=...``) or one of
    :data:`URL_SECRET_PARAMETERS` (``?key=``, ``&sig=``) is replaced too, its name kept.

    For free text that is stored or shown as is: error messages, tracebacks, logs, spans.
    """
    for p in _current_patterns().compiled:
        text = p.sub(REDACTED, text)
    if "=" in text:
        text = _PARAMETER.sub(_redact_parameter, text)
    for secret in known_secrets():
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


#: ``?name=value`` / ``&name=value`` in a URL or a form body
_PARAMETER = re.compile(r"(?<=[?&])([A-Za-z0-9_.\-\[\]]+)=([^&#\s\"'<>]+)")


#: URL parameters that carry a credential by their exact name, though too short to be a
#: ``REDACT_KEYS`` substring (``"key"`` would blank every ``monkey``): Google's and many
#: other APIs' ``?key=``, and signed URLs' ``sig=``/``signature=`` (Azure SAS, S3)
URL_SECRET_PARAMETERS = frozenset({"key", "sig", "signature"})


def _redact_parameter(match: re.Match[str]) -> str:
    secret = match[1].lower() in URL_SECRET_PARAMETERS or is_secret_key(match[1])
    if match[2] == REDACTED or not secret:
        return match[0]
    return f"{match[1]}={REDACTED}"


def check_identifier(value: str, what: str) -> str:
    """Return ``value``; raise :class:`~durable.exceptions.InvalidIdentifier` when it holds
    a character that does not show as itself (a control, a bidirectional override, a
    zero-width character: :func:`durable.values.fields.hidden_character`) and
    :class:`~durable.exceptions.SecretInIdentifier` when it matches a ``REDACT_PATTERNS``
    entry or contains a secret known in this context.

    For identifiers that are stored and shown in clear and must stay distinct: step ids,
    wait and signal keys, tags, run ids. ``what`` names the kind in the message (the
    value itself is never in it).
    """
    from durable.exceptions import InvalidIdentifier, SecretInIdentifier

    if not isinstance(value, str) or not value:
        return value
    hidden = hidden_character(value)
    if hidden is not None:
        raise InvalidIdentifier(what, *hidden)
    matcher = pattern_matcher()
    if matcher is not None and matcher.key(value):
        raise SecretInIdentifier(what)
    for secret in known_secrets():
        if secret in value:
            raise SecretInIdentifier(what)
    return value


# --- secrets known by value -------------------------------------------------------------
# A value chosen as secret by its dict key ({"password": "hunter2"}) is just a str once
# the workflow passes it on (ctx.step(..., data["password"])). While a run executes, the
# engine remembers such values so they stay redacted wherever they travel.

_KNOWN: ContextVar[frozenset[str]] = ContextVar("durable_known_secrets", default=frozenset())

#: shorter values are not remembered: redacting every "1" or "no" would be noise
MIN_KNOWN_SECRET_LENGTH = 4


def known_secrets() -> frozenset[str]:
    """Secret values remembered in the current context."""
    return _KNOWN.get()


def secrets_in(value: Any, *, _depth: int = 0) -> set[str]:
    """The str values found under secret keys (and inside ``Secret``) anywhere in ``value``."""
    from durable.types import Secret

    found: set[str] = set()
    if _depth > 50:
        return found
    if isinstance(value, Secret):
        inner = value.reveal()
        if isinstance(inner, str) and len(inner) >= MIN_KNOWN_SECRET_LENGTH:
            found.add(inner)
        return found
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and isinstance(item, str) and is_secret_key(key):
                if len(item) >= MIN_KNOWN_SECRET_LENGTH:
                    found.add(item)
            elif isinstance(key, str) and is_secret_key(key):
                # a list or dict under a secret key: every str in it is secret
                found |= _strings_in(item, _depth + 1)
            else:
                found |= secrets_in(item, _depth=_depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            found |= secrets_in(item, _depth=_depth + 1)
    return found


def _strings_in(value: Any, depth: int) -> set[str]:
    if depth > 50:
        return set()
    if isinstance(value, str):
        return {value} if len(value) >= MIN_KNOWN_SECRET_LENGTH else set()
    found: set[str] = set()
    if isinstance(value, dict):
        for item in value.values():  # keys are structure, not the secret
            found |= _strings_in(item, depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            found |= _strings_in(item, depth + 1)
    return found


@contextmanager
def secrets_scope(values: Iterable[str]) -> Iterator[None]:
    """Remember ``values`` as secrets for every encode and redaction inside the block."""
    token = _KNOWN.set(_KNOWN.get() | frozenset(values))
    try:
        yield
    finally:
        _KNOWN.reset(token)
