"""Secret values: encryption of redacted values at rest.

The :class:`~durable.types.Secret` wrapper lives with the public value types (re-exported
here). Redacted values (a ``Secret``, a string under a secret-looking key, a string that
looks like a token) are never stored in clear: :mod:`durable.values.codec` stores them as
Fernet tokens (AES-128-CBC + HMAC-SHA256, from :mod:`cryptography`).

The key comes from ``DURABLE["ENCRYPTION_KEY"]``: a url-safe base64 32-byte Fernet key
(``Fernet.generate_key()``), or several separated by commas for rotation -- the first
encrypts, every one of them decrypts. When it is empty the key is derived from
``settings.SECRET_KEY`` (``urlsafe_b64encode(sha256(SECRET_KEY))``), so changing
``SECRET_KEY`` makes values stored under the old one unreadable unless the old derived
key is listed in ``ENCRYPTION_KEY``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from durable import conf
from durable.exceptions import DurableConfigurationError
from durable.types import Secret

__all__ = ["Secret", "decrypt", "derive_key", "encrypt", "keyed_digest"]


# --- keys ----------------------------------------------------------------------------

_lock = threading.Lock()
# (settings fingerprint, MultiFernet, hmac key); rebuilt when the settings change
_cache: tuple[tuple[Any, ...], MultiFernet, bytes] | None = None


def derive_key(secret_key: str | bytes) -> str:
    """Return the Fernet key derived from a Django ``SECRET_KEY``.

    ``urlsafe_b64encode(sha256(secret_key))`` as text. Useful to list the old derived
    key in ``ENCRYPTION_KEY`` when rotating ``SECRET_KEY``.
    """
    raw = secret_key.encode("utf-8") if isinstance(secret_key, str) else bytes(secret_key)
    return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).decode("ascii")


def _key_list(raw: Any) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, bytes):
        raw = raw.decode("ascii")
    if isinstance(raw, str):
        items = raw.split(",")
    elif isinstance(raw, (list, tuple)):
        items = [k.decode("ascii") if isinstance(k, bytes) else str(k) for k in raw]
    else:
        raise DurableConfigurationError(
            "DURABLE['ENCRYPTION_KEY'] must be a string (one Fernet key, or several "
            f"separated by commas), not {type(raw).__name__}"
        )
    return [k.strip() for k in items if k and k.strip()]


def _build(raw: Any, secret_key: Any) -> tuple[MultiFernet, bytes]:
    keys = _key_list(raw)
    if not keys:
        if not secret_key:
            raise DurableConfigurationError(
                "Durable needs DURABLE['ENCRYPTION_KEY'] or a non-empty SECRET_KEY to "
                "encrypt redacted values"
            )
        keys = [derive_key(secret_key)]
    fernets = []
    for i, key in enumerate(keys):
        try:
            fernets.append(Fernet(key))
        except (ValueError, TypeError) as exc:
            raise DurableConfigurationError(
                f"DURABLE['ENCRYPTION_KEY'] key #{i + 1} is not a valid Fernet key "
                "(32 url-safe base64-encoded bytes; make one with "
                "cryptography.fernet.Fernet.generate_key())"
            ) from exc
    first = base64.urlsafe_b64decode(keys[0])
    hmac_key = hashlib.sha256(b"durable.keyed_digest\x00" + first).digest()
    return MultiFernet(fernets), hmac_key


def _current() -> tuple[MultiFernet, bytes]:
    """Return the (MultiFernet, hmac key) for the current settings, cached."""
    global _cache
    raw = conf.get("ENCRYPTION_KEY")
    fingerprint = (
        tuple(raw) if isinstance(raw, list) else raw,
        None if raw else getattr(settings, "SECRET_KEY", None),
    )
    cached = _cache
    if cached is not None and cached[0] == fingerprint:
        return cached[1], cached[2]
    with _lock:
        fernet, hmac_key = _build(raw, fingerprint[1])
        _cache = (fingerprint, fernet, hmac_key)
    return fernet, hmac_key


def encrypt(text: str) -> str:
    """Encrypt ``text`` with the first configured key; return a Fernet token (ASCII).

    Raises :class:`~durable.exceptions.DurableConfigurationError` when the key setting
    is invalid, and ``UnicodeEncodeError`` when ``text`` holds lone surrogates.
    """
    fernet, _ = _current()
    return fernet.encrypt(text.encode("utf-8")).decode("ascii")


def decrypt(token: str) -> str:
    """Decrypt a token made by :func:`encrypt` with any of the configured keys.

    Raises :class:`~durable.exceptions.DurableConfigurationError` when no configured
    key opens it (the key was rotated away, or ``SECRET_KEY`` changed while
    ``ENCRYPTION_KEY`` was empty) or the token is corrupt.
    """
    fernet, _ = _current()
    try:
        return fernet.decrypt(token.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeEncodeError, ValueError) as exc:
        raise DurableConfigurationError(
            "cannot decrypt a stored secret: none of the keys in "
            "DURABLE['ENCRYPTION_KEY'] (or the key derived from SECRET_KEY when it is "
            "empty) opens it; list the old key after the new one to rotate keys"
        ) from exc


def keyed_digest(text: str) -> str:
    """Return a hex HMAC-SHA256 of ``text`` under a key derived from the encryption key.

    Stable for equal texts while the first encryption key stays the same; used to
    fingerprint values that hold secrets without storing the secrets.
    """
    _, hmac_key = _current()
    return hmac.new(hmac_key, text.encode("utf-8"), hashlib.sha256).hexdigest()
