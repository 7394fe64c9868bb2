"""The client's address, as every throttle counts it (login lock-out, API token guesses,
webhook signatures): django-axes calls :func:`client_address` (``AXES_CLIENT_IP_CALLABLE``).

``REMOTE_ADDR`` unless ``TRUSTED_PROXY_COUNT`` (``DURABLE_TRUSTED_PROXY_COUNT``) is above
0: then the entry of ``X-Forwarded-For`` that the outermost trusted proxy wrote, counted
from the right (each proxy appends the address it received the request from, so with
``n`` trusted proxies the client is the ``n``-th entry from the right; entries further
left were written by the client and are not trusted). A header with fewer entries than
``n`` (a request that bypassed the proxies, or a misconfigured proxy) falls back to
``REMOTE_ADDR``.

Ours rather than django-ipware's (which axes uses when it is installed): with a proxy
that *sets* the header to one entry (``proxy_set_header X-Forwarded-For $remote_addr``,
docs/security.md) ipware's proxy count does not pick it, and without ipware axes reads
``REMOTE_ADDR``, so behind the proxy every client shared one count (django-axes#1099).
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str | None:
    """The client's IP address as text (``None`` when the request has none)."""
    remote = request.META.get("REMOTE_ADDR") or None
    count = int(getattr(settings, "TRUSTED_PROXY_COUNT", 0) or 0)
    if count <= 0:
        return remote
    header = request.META.get("HTTP_X_FORWARDED_FOR", "")
    entries = [entry.strip() for entry in header.split(",") if entry.strip()]
    if len(entries) < count:
        return remote
    candidate = entries[-count]
    try:
        return str(ipaddress.ip_address(candidate.strip("[]")))
    except ValueError:  # not an address: the proxy did not write it
        return remote
