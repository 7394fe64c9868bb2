"""Where outgoing webhooks may go: public addresses only, unless allow-listed.

A webhook subscription names a URL that the server then POSTs to; without a check, anyone
who may subscribe could make the server reach what only it can reach -- its own admin
ports, the database, a cloud's metadata service (server-side request forgery, OWASP
SSRF Prevention Cheat Sheet). So:

- :func:`check_url` refuses, when a subscription is made (API, admin), a URL whose host
  is, or resolves to, an address that is not public: loopback, private (RFC 1918,
  100.64.0.0/10, fc00::/7), link-local, multicast, unspecified, reserved, and the
  metadata addresses (:data:`METADATA`), in every spelling the resolver accepts
  (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``, ``[::ffff:127.0.0.1]``,
  ``localhost``, ``LOCALHOST.``), and a name that resolves there.
- :func:`post` checks again at each delivery, after resolving the name once, and then
  connects to an address it checked -- the URL's host is replaced by that address, the
  ``Host`` header and the TLS server name (SNI, and the certificate's check) stay the
  name's -- so a name whose DNS answer changes (DNS rebinding) cannot slip through.
  Redirects are not followed.

``DURABLE_WEBHOOK_ALLOWED_NETWORKS`` (docs/settings.md) admits internal receivers: CIDRs
(``10.1.2.0/24``), addresses, or host names (admitted whatever they resolve to). The
metadata addresses are refused even then. See docs/security.md#outgoing-webhooks.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterable
from typing import Any

import httpx
from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: the cloud metadata services (AWS, GCP, Azure, ...; AWS's IPv6 one): never reached
METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
#: NAT64's well-known prefix (RFC 6052): the last 32 bits are an IPv4 address
NAT64 = ipaddress.ip_network("64:ff9b::/96")
#: names that are the machine itself whatever the resolver says (RFC 6761 section 6.3)
LOCAL_NAMES = ("localhost", "localhost.localdomain")


class EgressRefused(ValueError):
    """The destination may not be reached; the message says which address and why."""


def allow_list() -> tuple[list[IPNetwork], set[str]]:
    """``DURABLE_WEBHOOK_ALLOWED_NETWORKS`` as ``(networks, host names)``.

    An entry that parses as an address or CIDR is a network (host bits ignored); one
    that does not but holds ``/`` or ``:`` is skipped (the system check ``api.W010``
    names it); anything else is a host name (lower case, without a trailing dot).
    """
    networks: list[IPNetwork] = []
    names: set[str] = set()
    for entry in getattr(settings, "DURABLE_WEBHOOK_ALLOWED_NETWORKS", None) or []:
        entry = str(entry).strip()
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            if entry and "/" not in entry and ":" not in entry:
                names.add(normal_host(entry))
    return networks, names


def normal_host(host: str) -> str:
    """``host`` lower case, without brackets or a trailing dot."""
    return host.strip().strip("[]").rstrip(".").lower()


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells, as the resolver reads it, or ``None`` for a name.

    IPv4 is read as ``inet_aton`` does (the C library's, which ``getaddrinfo`` and so
    httpx use): ``2130706433``, ``0x7f.1``, ``0177.0.0.1`` and ``127.1`` are 127.0.0.1.
    """
    host = normal_host(host)
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefx." for c in host) and host[0].isdigit():
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _embedded(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (IPv4-mapped, 6to4, NAT64), else ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def refusal(ip: IPAddress, networks: Iterable[IPNetwork] | None = None) -> str | None:
    """Why ``ip`` may not be reached, or ``None`` when it may.

    ``networks``: the allowed networks (default: the setting's). Metadata addresses are
    refused even when allowed; an IPv6 address carrying an IPv4 one is judged by both.
    """
    if networks is None:
        networks = allow_list()[0]
    inner = _embedded(ip)
    if ip in METADATA or inner in METADATA:
        return f"{ip} is a cloud metadata address"
    allowed = list(networks)
    if any(ip in net or inner in net for net in allowed):
        return None
    for addr in dict.fromkeys((inner, ip)):
        kind = _kind(addr)
        if kind:
            return f"{ip} is {kind}" if addr == ip else f"{ip} carries {addr}, {kind}"
    return None


def _kind(ip: IPAddress) -> str:
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_reserved:
        return "a reserved address"
    if getattr(ip, "is_site_local", False):  # fec0::/10: deprecated, still routed inside
        return "a site-local address"
    if ip.is_private or not ip.is_global:
        return "a private address"
    return ""


def _getaddrinfo(host: str, port: int) -> list[Any]:
    """``socket.getaddrinfo`` for TCP (a seam for the tests)."""
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


def resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses ``host`` resolves to, in the resolver's order, without repeats.

    Raises ``OSError`` (``socket.gaierror``) when it does not resolve, and
    :class:`EgressRefused` when it is not a name the resolver can encode (IDNA: an empty
    label, or one over 63 characters).
    """
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        answers = _getaddrinfo(normal_host(host), port)
    except UnicodeError as exc:  # the idna codec, before any lookup
        raise EgressRefused(f"{normal_host(host)} is not a valid host name: {exc}") from None
    found: dict[IPAddress, None] = {}
    for *_, sockaddr in answers:
        found[ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])] = None
    return list(found)


def _split(url: str) -> tuple[urllib.parse.SplitResult, str, int]:
    """The URL, its host (:func:`normal_host`) and port, read as the standard library
    does (which keeps spellings such as ``0177.0.0.1`` that httpx refuses to parse)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EgressRefused(f"not a valid URL: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise EgressRefused("give an http(s) URL with a host")
    default = 443 if parts.scheme.lower() == "https" else 80
    return parts, normal_host(parts.hostname), port or default


def _parts(url: str) -> tuple[httpx.URL, str, int]:
    _, host, port = _split(url)
    try:
        parsed = httpx.URL(url)
        parsed_host = parsed.host  # decodes an A-label (xn--): an IDNAError, a ValueError
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise EgressRefused(f"not a valid URL: {exc}") from None
    if normal_host(parsed_host) != host:  # the two parsers must agree on the host
        raise EgressRefused(f"the URL's host is ambiguous ({host} or {parsed_host})")
    return parsed, host, port


def check_url(url: str, *, resolve_names: bool = True) -> list[IPAddress]:
    """Refuse ``url`` unless every address its host is or resolves to may be reached.

    Returns the addresses checked (empty for an allow-listed host name, or a name that
    does not resolve now: :func:`post` checks again when it delivers). Raises
    :class:`EgressRefused` (a ``ValueError``) saying which address and why: not an
    http(s) URL, user credentials in it (they would be stored and shown as the URL), a
    local name (``localhost``, RFC 6761), or an address :func:`refusal` refuses.
    """
    parts, host, port = _split(url)
    if parts.username is not None or parts.password is not None:
        raise EgressRefused("remove the user name and password from the URL")
    if "%" in host:
        raise EgressRefused(f"{host}: a percent-encoded host is not taken")
    addresses = _check_host(host, port, resolve_names=resolve_names, unresolved_ok=True)
    _parts(url)  # httpx, which delivers, must read the same host
    return addresses


def _check_host(host: str, port: int, *, resolve_names: bool, unresolved_ok: bool) -> list[Any]:
    networks, names = allow_list()
    if host in names:  # admitted whatever it resolves to, but for the metadata
        if unresolved_ok:
            return []
        addresses = resolve(host, port)
        for ip in addresses:
            if ip in METADATA or _embedded(ip) in METADATA:
                raise EgressRefused(f"{host} resolves to {ip}, a cloud metadata address")
        return addresses
    literal = literal_address(host)
    if literal is None and (host in LOCAL_NAMES or host.endswith(".localhost")):
        raise EgressRefused(f"{host} names this machine")
    if literal is None and not resolve_names:
        return []
    try:
        addresses = resolve(host, port)
    except OSError:
        if unresolved_ok:
            return []
        raise
    for ip in addresses:
        why = refusal(ip, networks)
        if why:
            shown = f"{host} resolves to {ip}: " if literal is None else ""
            raise EgressRefused(f"{shown}{why}; only public addresses are reached")
    return addresses


#: the most of a receiver's answer read, in bytes (what is kept is shorter still:
#: ``api.models.WebhookAnswer``)
MAX_ANSWER_BYTES = 64 * 1024


def _bounded(
    response: httpx.Response, request: httpx.Request, *, deadline: float
) -> httpx.Response:
    """``response`` (streamed) with at most :data:`MAX_ANSWER_BYTES` of its body, read
    before ``deadline`` (``time.monotonic()``); the stream is closed."""
    body = bytearray()
    try:
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) >= MAX_ANSWER_BYTES or time.monotonic() > deadline:
                break
    except httpx.HTTPError:  # the answer's status is what counts; its body is a courtesy
        pass
    finally:
        response.close()
    headers = [
        (name, value)
        for name, value in response.headers.multi_items()
        if name.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx.Response(
        response.status_code,
        headers=headers,
        content=bytes(body[:MAX_ANSWER_BYTES]),
        request=request,
        extensions={"reason_phrase": response.extensions.get("reason_phrase", b"")},
    )


def post(
    url: str,
    *,
    content: bytes,
    headers: dict[str, str],
    timeout: float,
    verify: ssl.SSLContext | bool = True,
) -> httpx.Response:
    """POST ``content`` to ``url``, connecting only to an address :func:`refusal` admits.

    The host name is resolved once and every address checked; the request then goes to
    the first one that accepts a connection (the others on a connect error), with the
    ``Host`` header and the TLS server name (SNI and certificate check) of the name.
    Redirects are not followed (a 3xx is the answer); proxies from the environment are
    not used (a proxy would resolve the name again). Of the answer's body at most
    :data:`MAX_ANSWER_BYTES` are read, within ``timeout`` seconds in all (an endless or
    dribbling body neither holds the worker nor fills its memory); the returned
    response holds what was read. Raises :class:`EgressRefused` for a
    refused destination, ``httpx.HTTPError`` for network errors (a name that does not
    resolve is an ``httpx.ConnectError``). ``verify``: as httpx's (default: the public
    certificate authorities, ``certifi``).
    """
    parsed, host, port = _parts(url)
    try:
        addresses = _check_host(host, port, resolve_names=True, unresolved_ok=False)
    except OSError as exc:
        raise httpx.ConnectError(f"{host} does not resolve: {exc}") from None
    wire = dict(headers)
    name = parsed.raw_host.decode("ascii")  # an internationalised name as IDNA (punycode)
    shown = f"[{name}]" if ":" in name else name
    default_port = parsed.port is None or parsed.port == (443 if parsed.scheme == "https" else 80)
    wire["host"] = shown if default_port else f"{shown}:{parsed.port}"
    extensions = {"sni_hostname": name} if parsed.scheme == "https" else {}
    last: httpx.HTTPError | None = None
    client = httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False, verify=verify)
    with client:
        for ip in addresses:
            request = client.build_request(
                "POST",
                parsed.copy_with(host=str(ip)),
                content=content,
                headers=wire,
                extensions=extensions,
            )
            try:
                response = client.send(request, stream=True)
            except httpx.ConnectError as exc:
                last = exc
                continue
            return _bounded(response, request, deadline=time.monotonic() + timeout)
    assert last is not None  # resolve() returns at least one address or raises
    raise last
