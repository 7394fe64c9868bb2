"""``durable.signatures``: a callable's signature, read once per callable."""

from __future__ import annotations

import functools
import inspect

import pytest

from durable.signatures import accepts_keyword, signature


def tool(a: int, *, idempotency_key: str) -> int:
    return a


def test_a_signature_is_read_once_per_callable():
    first = signature(tool)
    assert first == inspect.signature(tool)
    assert signature(tool) is first  # cached
    assert first.bind(a=1, idempotency_key="k").arguments == {"a": 1, "idempotency_key": "k"}
    with pytest.raises(TypeError):
        first.bind(b=2)


def test_an_unhashable_callable_is_read_each_time():
    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, x: int) -> int:
            return x

    fn = Unhashable()
    assert list(signature(fn).parameters) == ["x"]
    assert accepts_keyword(fn, "x") and not accepts_keyword(fn, "y")


def test_a_callable_without_a_signature_raises_as_inspect_does():
    with pytest.raises(ValueError):
        signature(functools.partial)  # a builtin class whose signature is unknown
