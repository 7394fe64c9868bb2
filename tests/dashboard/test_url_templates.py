"""The row templates' ``url()`` (dashboard/jinja_env.py) reverses a route once and fills
its arguments in: it must give exactly what ``reverse()`` gives, and go through
``reverse()`` for arguments that need quoting or that a route refuses."""

from __future__ import annotations

import pytest
from django.urls import NoReverseMatch, URLPattern, URLResolver, get_resolver, reverse

from dashboard.jinja_env import url


def _named(patterns, namespace: str = ""):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace == "admin":
                continue
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _named(entry.url_patterns, inner)
        elif isinstance(entry, URLPattern) and entry.name:
            yield f"{namespace}{entry.name}", len(entry.pattern.converters)


@pytest.mark.parametrize(
    "args", [("run-1", "input", 42), ("7", "x.y", "a_b"), (3, 1, 2), ("A1~", "z", "0")]
)
def test_every_named_route_gives_what_reverse_gives(args):
    seen = 0
    for name, arity in sorted(set(_named(get_resolver().url_patterns))):
        given = args[:arity]
        try:
            expected = reverse(name, args=given)
        except NoReverseMatch:
            continue  # a route whose converters refuse these (the fast path may not)
        assert url(name, *given) == expected, name
        seen += 1
    assert seen > 20


def test_arguments_that_need_quoting_or_are_refused_go_through_reverse():
    assert url("dashboard:run", "run-1") == "/runs/run-1/"
    assert url("dashboard:runs") == reverse("dashboard:runs")
    with pytest.raises(NoReverseMatch):
        url("dashboard:run", "a b")  # not a run id: reverse() refuses it, and so does url()
    assert url("dashboard:payload", "r1", "input", 5) == "/runs/r1/payload/input/5/"
