"""Fixture workflows of the schedule tests (importing this module registers them)."""

from __future__ import annotations

import durable


@durable.workflow(name="sched.report", version="1")
def report(ctx, data):
    return {"team": (data or {}).get("team")}
