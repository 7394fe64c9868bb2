"""Formatting and lookup helpers shared by the report and the targets (no Django, no I/O).

A figure that was not measured is ``nan`` (or missing) all the way to the table, where it
shows as ``–``: a row is never dropped because one of its numbers is absent.
"""

from __future__ import annotations

import math
from typing import Any

#: Durable-only checkpoint scenarios whose marginal cost per step is derived by
#: subtracting the per-run cost (start, claim, completion) of the one-step runs
MARGINAL_SCENARIOS = ("read_tool", "write_tool", "read_tool_paced", "chain_sync", "chain_batched")


def ok(x: Any) -> bool:
    """True for a number that is not ``nan``."""
    return isinstance(x, (int, float)) and not math.isnan(x)


def fmt(x: Any, digits: int = 3) -> str:
    """A number for a table: thousands separated from 100 up, 3 significant digits below."""
    if not ok(x):
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}g}" if abs(x) < 1 else f"{x:.{max(digits - 1, 1)}f}"


def mmm(s: dict[str, Any] | None) -> str:
    """``median (min–max)``."""
    if not s or not ok(s.get("median")):
        return "–"
    if s.get("n", 0) <= 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def find_row(rows: list[dict[str, Any]], system: str, db: str, scenario: str) -> dict[str, Any]:
    """The checkpoint row of (system, db, scenario), or ``{}``."""
    return next(
        (r for r in rows if (r["system"], r["db"], r["scenario"]) == (system, db, scenario)), {}
    )


def median_of(r: dict[str, Any], key: str = "per_step_ms") -> float:
    """The median of a row's summary ``key`` (ms), ``nan`` when absent."""
    return (r.get(key) or {}).get("median", math.nan)


def marginal_client_tx(cp: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Marginal *write* transactions per step (client count), per (db, scenario): the
    per-run cost (start, claim, completion) measured by the one-step runs subtracted."""
    rows = cp["rows"]
    scen = {s["key"]: s for s in cp["scenarios"]}
    out: dict[tuple[str, str], float] = {}
    for db in ("postgresql", "sqlite"):
        long_ = find_row(rows, "durable", db, "seq").get("client_tx_per_run")
        one = find_row(rows, "durable", db, "single").get("client_tx_per_run")
        if not long_ or not one:
            continue
        steps = scen["seq"]["steps"]
        m = (long_["write"] - one["write"]) / (steps - 1)
        out[(db, "seq")] = m
        overhead = one["write"] - m
        for key in MARGINAL_SCENARIOS:
            r = find_row(rows, "durable", db, key).get("client_tx_per_run")
            if r and key in scen:
                out[(db, key)] = (r["write"] - overhead) / scen[key]["steps"]
    return out
