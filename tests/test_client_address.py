"""The client address every throttle counts (config/client_address.py)."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from config.client_address import client_address


@pytest.mark.parametrize(
    ("count", "forwarded", "expected"),
    [
        (0, "81.2.69.1", "10.0.0.5"),  # no trusted proxy: the header is the client's word
        (1, "81.2.69.1", "81.2.69.1"),  # nginx sets one entry
        (1, "6.6.6.6, 81.2.69.1", "81.2.69.1"),  # the client's forged entry is left of it
        (2, "6.6.6.6, 81.2.69.1, 10.0.0.9", "81.2.69.1"),  # two proxies
        (2, "81.2.69.1", "10.0.0.5"),  # fewer entries than proxies: bypassed them
        (1, "", "10.0.0.5"),
        (1, "not-an-address", "10.0.0.5"),
        (1, "[2001:db8::1]", "2001:db8::1"),
    ],
)
def test_the_client_is_the_entry_the_outermost_trusted_proxy_wrote(
    settings, count, forwarded, expected
):
    settings.TRUSTED_PROXY_COUNT = count
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.5", HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == expected


def test_the_throttles_count_by_it(settings):
    from axes.helpers import get_client_ip_address

    settings.TRUSTED_PROXY_COUNT = 1
    request = RequestFactory().get("/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="81.2.69.1")
    assert get_client_ip_address(request) == "81.2.69.1"
