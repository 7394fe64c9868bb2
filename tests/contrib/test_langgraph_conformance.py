"""DurableSaver passes langgraph-checkpoint-conformance with every capability it knows.

The suite is LangGraph's own (``langgraph.checkpoint.conformance``): it drives the
async methods against a fresh saver per capability. Every capability the installed
version lists must be detected (implemented) and passed, on the database under test
(PostgreSQL with DATABASE_URL, else the embedded SQLite).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, Capability

from durable.contrib.langgraph import DurableSaver

pytestmark = pytest.mark.django_db(transaction=True)


def _run_suite(**saver_kwargs: Any) -> Any:
    @checkpointer_test(name="DurableSaver")
    async def durable_saver():
        yield DurableSaver(**saver_kwargs)

    async def main() -> Any:
        try:
            return await validate(durable_saver)
        finally:
            # the ORM ran in asgiref's sync thread: close its connection there
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def _assert_all_passed(report: Any) -> None:
    results = report.results
    assert {Capability(name) for name in results} == set(Capability) == ALL_CAPABILITIES
    problems = {
        name: (r.detected, r.passed, [str(f)[:300] for f in r.failures])
        for name, r in results.items()
        if not (r.detected and r.passed)
    }
    assert not problems, problems
    assert report.passed_all()
    assert sum(r.tests_passed for r in results.values()) > 70


def test_every_capability_passes():
    report = _run_suite()
    report.print_report()
    _assert_all_passed(report)


def test_every_capability_passes_with_everything_encrypted():
    _assert_all_passed(_run_suite(encrypt="all"))
