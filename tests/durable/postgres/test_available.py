"""``durable.postgres.available()`` is the engine's one test of the database vendor: a
one-statement path chosen anywhere else would be a second rule for when it applies.
Read as text, never imported."""

from __future__ import annotations

import re
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[3] / "durable"
VENDOR = re.compile(r"\.vendor\b")


def vendor_tests(source: str) -> list[int]:
    """Line numbers of ``source`` that read a connection's ``vendor``."""
    return [n for n, line in enumerate(source.splitlines(), 1) if VENDOR.search(line)]


def test_the_checker_finds_a_vendor_test():
    source = 'x = 1\nif connection.vendor == "postgresql":\n    pass\n'
    assert vendor_tests(source) == [2]
    assert vendor_tests("vendors = []\n") == []


def test_only_the_postgres_package_tests_the_vendor():
    found = {
        path.relative_to(ENGINE.parent).as_posix(): lines
        for path in sorted(ENGINE.rglob("*.py"))
        if "migrations" not in path.parts and "postgres" not in path.relative_to(ENGINE).parts
        for lines in [vendor_tests(path.read_text(encoding="utf-8"))]
        if lines
    }
    assert found == {}, (
        f"vendor tests outside durable/postgres/ (use postgres.available()): {found}"
    )
    assert vendor_tests((ENGINE / "postgres" / "__init__.py").read_text(encoding="utf-8"))
