"""Fixture workflows whose runs fail for good outside a step's retries, and S35's run
(a 429 with ``Retry-After: inf``), for tests/durable/test_failure_reasons.py and the
surfaces' tests."""

from __future__ import annotations

import durable
from durable.models import RunStatus
from durable.testing import drive
from tests.durable.values import values_workflows as vw

#: what S35's run must say, wherever its error shows
S35_WHY = "the Retry-After of HTTP 429 asks for it; the maximum is 315,576,000 seconds (10 years)"


def s35_run():
    """S35: the provider answers 429 with ``Retry-After: inf``; the step fails at once."""
    vw.RAISE["provider"] = [vw.RateLimited("inf")]
    run = drive(durable.start("values.provider").id)
    assert run.status == RunStatus.FAILED and vw.CALLS["provider"] == 1
    vw.reset()
    return run


@durable.workflow(name="reasons.raises", version="1")
def raises(ctx, data):
    ctx.step("first", lambda: 1)
    raise ValueError("the workflow gave up")


@durable.workflow(name="reasons.two_steps", version="1")
def two_steps(ctx, data):
    ctx.step("first", lambda: 1)
    ctx.step("second", lambda: 2)
