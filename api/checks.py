"""System checks of the API's settings (``manage.py check``; docs/security.md).

``api.W010``: an entry of ``DURABLE_WEBHOOK_ALLOWED_NETWORKS`` that is neither a CIDR,
an address nor a host name (it is ignored). ``api.W011``: the allow-list admits
loopback (the server itself: its admin and metrics ports, the database). ``api.W012``:
it admits a private range wider than a /24 (IPv4) or a /64 (IPv6) -- a whole internal
network where one receiver was meant.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register

#: the ranges that are not public (the ones ``api.egress.refusal`` refuses)
NOT_PUBLIC = [
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "::ffff:0:0/96",
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
    )
]
LOOPBACK = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]
WIDEST = {4: 24, 6: 64}
MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


@register(Tags.security, "durable")
def check_webhook_allow_list(app_configs: Any = None, **kwargs: Any) -> list:
    from .egress import LOCAL_NAMES, normal_host

    messages: list = []
    setting = "DURABLE_WEBHOOK_ALLOWED_NETWORKS"
    for entry in getattr(settings, setting, None) or []:
        text = str(entry).strip()
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            if not text or "/" in text or ":" in text:
                messages.append(
                    Warning(
                        f"{setting}: {text!r} is neither a CIDR, an address nor a host name",
                        hint="write e.g. 10.1.2.0/24, 10.1.2.3 or receiver.internal; it is ignored",
                        id="api.W010",
                    )
                )
            elif normal_host(text) in LOCAL_NAMES or normal_host(text).endswith(".localhost"):
                messages.append(_loopback(setting, text))
            continue
        mapped: list[Any] = [net]  # and the IPv4 range an IPv4-mapped one stands for
        if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(MAPPED):
            mapped.append(
                ipaddress.ip_network(
                    f"{ipaddress.IPv4Address(int(net.network_address) & 0xFFFFFFFF)}/"
                    f"{max(net.prefixlen - 96, 0)}",
                    strict=False,
                )
            )
        if any(m.overlaps(lo) for m in mapped for lo in LOOPBACK if m.version == lo.version):
            messages.append(_loopback(setting, text))
        elif any(
            m.prefixlen < WIDEST[m.version] and m.overlaps(p)
            for m in mapped
            for p in NOT_PUBLIC
            if p.version == m.version
        ):
            messages.append(
                Warning(
                    f"{setting}: {text} admits a private range wider than a "
                    f"/{WIDEST[net.version]}: every internal service in it can be sent webhooks",
                    hint="list the receivers' own addresses or narrow the range",
                    id="api.W012",
                )
            )
    return messages


def _loopback(setting: str, text: str) -> Warning:
    return Warning(
        f"{setting}: {text} admits loopback: webhooks may then reach the server itself "
        "(its admin and metrics ports, a local database)",
        hint="only for tests and local development; list the receiver's own address",
        id="api.W011",
    )
