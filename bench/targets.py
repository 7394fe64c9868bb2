"""The targets of issue 13, each with its measured value, met or not, and the gap.

Every target the parts of this invocation could measure gets a row; one whose figure is
missing says "not measured" (or "not available", for a feature the installed durable
does not have) instead of disappearing, so that a table never looks better than the run
was. Ratios are taken within one invocation (the floor, LangGraph and DBOS ran on the
same server in the same minutes); absolute figures move with the machine's load.
"""

from __future__ import annotations

import math
from typing import Any

from .numbers import find_row, fmt, marginal_client_tx, median_of, ok

#: issue 13's thresholds (ms, s, MB, ratios); the last five are issue 6's, kept
TARGETS = {
    "floor_ratio": 1.5,  # checkpointed no-op step / INSERT + COMMIT, PostgreSQL
    "read_commits": 1.0,  # marginal xact_commit per read-only tool step (reads counted)
    "write_commits": 2.0,  # marginal xact_commit per unsafe_write tool step
    "write_floor_ratio": 2.5,  # unsafe_write tool step / INSERT + COMMIT
    "batched_speedup": 5.0,  # ms/step of sync / ms/step of batched
    "dispatch_p50_ms": 15.0,
    "approval_p50_ms": 100.0,
    "dashboard_p95_ms": 100.0,
    "recovery_p50_s": 3.0,
    "recovery_default_p50_s": 10.0,
    "rss_mb": 150.0,
    "replay_runs_per_min": 1000.0,  # issue 32: the replay check, runs checked a minute
    "cli_start_s": 1.0,  # issue 33: a CLI command that reads runs, spawn to exit
    "worker_ready_s": 2.0,  # issue 33: a worker, spawn to ready
    # issue 33: a figure at the largest seeded size / the same at the smallest (100x the
    # runs); logarithmic growth would be ~1.5x (log 1M / log 10k), linear 100x
    "growth_ratio": 2.0,
    "api_p95_ms": 100.0,  # issue 33: the API's runs list and a run's detail
}


class _Rows:
    """The table being built: ``{"target", "measured", "met", "gap"}`` per row, where
    ``met`` is True, False, None (not measured) or ``"reported"`` (no threshold)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def info(self, name: str, measured: str, met: Any, gap: str = "") -> None:
        self.rows.append({"target": name, "measured": measured, "met": met, "gap": gap})

    def add(
        self,
        name: str,
        measured: float,
        target: float,
        unit: str,
        *,
        higher: bool = False,
        note: str = "",
        places: int | None = None,
    ) -> None:
        """``places``: compare the measured value rounded to that many decimals (a count
        that must *equal* 1.00 is met by 1.004, as the table shows it)."""
        if not ok(measured) or not ok(target):
            self.info(name, "not measured", None, note)
            return
        value = round(measured, places) if places is not None else measured
        met = value >= target if higher else value <= target
        gap = ""
        if not met:
            gap = f"{fmt(measured)}{unit} vs {fmt(target)}{unit}: " + (
                f"{fmt(target / measured)}× short" if higher else f"{fmt(measured / target)}× over"
            )
        shown = f"{measured:.2f}" if places is not None else fmt(measured)
        self.info(name, f"{shown}{unit}", met, (gap + (" — " + note if note and gap else note)))


def _checkpoint(t: _Rows, cp: dict[str, Any]) -> None:
    T = TARGETS
    rows = cp["rows"]
    d = median_of(find_row(rows, "durable", "postgresql", "seq"))
    f = median_of(find_row(rows, "floor", "postgresql", "seq"))
    pg_note = "" if ok(d) else "PostgreSQL not run"
    t.add(
        "checkpointed no-op step ≤ 1.5× the INSERT + COMMIT floor (PostgreSQL)",
        d / f if ok(f) else math.nan,
        T["floor_ratio"],
        "×",
        note=f"Durable {fmt(d)} ms, floor {fmt(f)} ms" if ok(d) and ok(f) else pg_note,
    )
    marg = marginal_client_tx(cp)
    for key, name, target in (
        (
            "read_tool",
            "marginal commits per read-only step = 1.00, reads counted (`xact_commit`)",
            T["read_commits"],
        ),
        (
            "write_tool",
            "`unsafe_write` tool step ≤ 2 round trips (marginal commits ≤ 2.00)",
            T["write_commits"],
        ),
    ):
        r = find_row(rows, "durable", "postgresql", key)
        note = pg_note
        if "commits_per_step" in r:
            note = f"all commits of the runs / steps: {fmt(r['commits_per_step'])}"
            if ("postgresql", key) in marg:
                note += (
                    "; write transactions only (client count), marginal: "
                    f"{marg[('postgresql', key)]:.2f}"
                )
        t.add(name, r.get("commits_marginal", math.nan), target, "", note=note, places=2)
    w = median_of(find_row(rows, "durable", "postgresql", "write_tool"))
    t.add(
        "`unsafe_write` tool step ≤ 2.5× the floor (PostgreSQL)",
        w / f if ok(f) and ok(w) else math.nan,
        T["write_floor_ratio"],
        "×",
        note=f"{fmt(w)} ms/step, floor {fmt(f)} ms" if ok(w) and ok(f) else pg_note,
    )
    one = median_of(find_row(rows, "durable", "postgresql", "single"), "per_run_ms")
    lg = median_of(find_row(rows, "langgraph", "postgresql", "single"), "per_run_ms")
    t.add(
        "one-step run (start + claim + completion, in process) ≤ LangGraph's ms/run "
        "(PostgreSQL, same invocation)",
        one,
        lg,
        " ms",
        note=f"LangGraph {fmt(lg)} ms/run" if ok(lg) else (pg_note or "LangGraph not run"),
    )
    _batched(t, cp)


def _batched(t: _Rows, cp: dict[str, Any]) -> None:
    name = 'chain of read-only steps with `durability="batched"` ≥ 5× faster than `sync`'
    info = cp.get("batched") or {}
    if info.get("available") is False:
        t.info(name, "not available", None, info.get("reason", ""))
        return
    rows = cp["rows"]
    for db, label in (("postgresql", "PostgreSQL"), ("sqlite", "SQLite")):
        sync = median_of(find_row(rows, "durable", db, "chain_sync"))
        batched = median_of(find_row(rows, "durable", db, "chain_batched"))
        if ok(sync) and ok(batched):
            t.add(
                name,
                sync / batched,
                TARGETS["batched_speedup"],
                "×",
                higher=True,
                note=f"{label}: sync {fmt(sync)} ms/step, batched {fmt(batched)} ms/step",
            )
            return
    t.info(name, "not measured", None, "no chain rows in the checkpoint part")


def _dashboard(t: _Rows, d: dict[str, Any]) -> None:
    avail = [p for p in d["pages"] if p.get("available")]
    worst = max(avail, key=lambda p: p["ms"]["p95"], default=None)
    limit = TARGETS["dashboard_p95_ms"]
    over = [f"{p['page']} {fmt(p['ms']['p95'])} ms" for p in avail if p["ms"]["p95"] > limit]
    missing = [p["page"] for p in d["pages"] if not p.get("available")]
    note = f"{len(over)} of {len(avail)} pages over: " + "; ".join(over) if over else ""
    if missing:
        note += ("; " if note else "") + "not measured: " + ", ".join(missing)
    t.add(
        "dashboard p95 ≤ 100 ms on every page measured (worst page shown)",
        worst["ms"]["p95"] if worst else math.nan,
        limit,
        " ms",
        note=note,
    )


def _throughput(t: _Rows, tp: dict[str, Any]) -> None:
    from .throughput import scaling

    def figures(r: dict[str, Any]) -> tuple[str, str]:
        sps = [r.get(f"workers_{n}", {}).get("steps_per_second", math.nan) for n in (1, 2, 4)]
        s = scaling(r)
        factors = ", ".join(f"{k} {fmt(v, 2)}×" for k, v in s.items())
        return " / ".join(fmt(x) for x in sps) + " steps/s", (
            f"scaling {factors}" if factors else ""
        )

    if "skipped" in tp:
        t.info("throughput, Durable workers 1 / 2 / 4", "not measured", None, tp["skipped"])
        return
    measured, gap = figures(tp)
    t.info("throughput, Durable workers 1 / 2 / 4 (PostgreSQL + Redis)", measured, "reported", gap)
    dbos = tp.get("dbos") or {}
    name = "throughput, DBOS queue executors 1 / 2 / 4 (same server)"
    if "workers_1" not in dbos:
        why = dbos.get("skipped") or dbos.get("error") or "not run"
        t.info(name, "not measured", None, why)
        return
    measured, gap = figures(dbos)
    vs = []
    for n in (1, 2, 4):
        a = tp.get(f"workers_{n}", {}).get("steps_per_second")
        b = dbos.get(f"workers_{n}", {}).get("steps_per_second")
        if a and b:
            vs.append(f"{n}w {fmt(a / b, 2)}×")
    if vs:
        gap += ("; " if gap else "") + "Durable ÷ DBOS: " + ", ".join(vs)
    t.info(name, measured, "reported", gap)


def _growth(t: _Rows, g: dict[str, Any]) -> None:
    """Each figure at the largest size over the same at the smallest (bench/growth.py),
    and the API's p95 at the largest size."""
    sizes = g.get("sizes") or []
    if len(sizes) < 2:
        t.info(
            "growth from the smallest to the largest size ≤ 2×",
            "not measured",
            None,
            g.get("skipped", ""),
        )
        return
    small, large = sizes[0], sizes[-1]

    def api(r: dict[str, Any], endpoint: str) -> float:
        row = next((a for a in r.get("api", []) if a["endpoint"] == endpoint), {})
        return row.get("ms", {}).get("p95", math.nan)

    def worst(r: dict[str, Any]) -> float:
        return (r.get("worst_page") or {}).get("ms", {}).get("p95", math.nan)

    figures = {
        "a step (p50)": (small["step_ms"]["p50"], large["step_ms"]["p50"]),
        "a claim (p50)": (small["claim_ms"]["p50"], large["claim_ms"]["p50"]),
        "the worst dashboard page (p95)": (worst(small), worst(large)),
        "the API's runs list (p95)": (
            api(small, "API runs list (50)"),
            api(large, "API runs list (50)"),
        ),
        "the API's run detail (p95)": (
            api(small, "API run detail (500 steps)"),
            api(large, "API run detail (500 steps)"),
        ),
    }
    span = f"{small['runs']:,} → {large['runs']:,} runs"
    for label, (a, b) in figures.items():
        t.add(
            f"{label} grows ≤ 2× from {span}",
            b / a if ok(a) and a else math.nan,
            TARGETS["growth_ratio"],
            "×",
            note=f"{fmt(a)} → {fmt(b)} ms",
        )
    for endpoint in ("API runs list (50)", "API run detail (500 steps)"):
        t.add(
            f"{endpoint} p95 ≤ 100 ms at {large['runs']:,} runs (one client)",
            api(large, endpoint),
            TARGETS["api_p95_ms"],
            " ms",
        )


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the targets table for the parts in ``results`` (see :class:`_Rows`)."""
    parts = results["parts"]
    T = TARGETS
    t = _Rows()
    if parts.get("checkpoint"):
        _checkpoint(t, parts["checkpoint"])
    d = (parts.get("dispatch") or {}).get("redis/postgresql")
    if d is not None:
        t.add(
            "one-step run p50 ≤ 15 ms on Redis (dispatch, kept from issue 6)",
            d.get("start_to_finished_ms", {}).get("p50", math.nan),
            T["dispatch_p50_ms"],
            " ms",
            note=d.get("skipped", ""),
        )
    a = parts.get("approval")
    if a is not None:
        t.add(
            "approval → next step p50 ≤ 100 ms (kept)",
            a.get("decision_to_next_step_ms", {}).get("p50", math.nan),
            T["approval_p50_ms"],
            " ms",
            note=a.get("skipped", ""),
        )
    db = parts.get("dashboard")
    if db is not None and "pages" in db:
        _dashboard(t, db)
    tp = parts.get("throughput")
    if tp is not None:
        _throughput(t, tp)
    r = parts.get("recovery")
    if r is not None:
        t.add(
            "recovery p50 ≤ 3 s (tuned lease and sweep)",
            r.get("kill_to_next_step_s", {}).get("p50", math.nan),
            T["recovery_p50_s"],
            " s",
            note=r.get("skipped", ""),
        )
        dflt = r.get("default_settings") or {}
        if "kill_to_next_step_s" in dflt:
            t.add(
                "recovery p50 ≤ 10 s, default settings",
                dflt["kill_to_next_step_s"].get("p50", math.nan),
                T["recovery_default_p50_s"],
                " s",
            )
    rc = parts.get("replay")
    if rc is not None:
        t.add(
            "replay check ≥ 1,000 open runs a minute (`manage.py durable replay-check`, "
            "end to end)",
            rc.get("command_runs_per_minute", math.nan),
            T["replay_runs_per_min"],
            " runs/min",
            higher=True,
            note=rc.get("skipped", "") or f"in process: {rc.get('runs_per_minute', 0):,} runs/min",
        )
    su = parts.get("startup")
    if su is not None:
        t.add(
            "a CLI command starts ≤ 1 s (`manage.py durable runs`, the demo's apps)",
            su.get("cli_runs_s", {}).get("median", math.nan),
            T["cli_start_s"],
            " s",
            note=su.get("skipped", "")
            or f"`durable workflows` {fmt(su.get('cli_workflows_s', {}).get('median'))} s",
        )
        t.add(
            "a worker is ready ≤ 2 s (the demo's configuration)",
            su.get("worker_ready_s", {}).get("median", math.nan),
            T["worker_ready_s"],
            " s",
            note=su.get("skipped", "")
            or "naming its modules: "
            f"{fmt(su.get('worker_named_modules_ready_s', {}).get('median'))} s",
        )
    g = parts.get("growth")
    if g is not None:
        _growth(t, g)
    if tp is not None and "workers_1" in tp:
        w = tp["workers_1"]
        t.add(
            f"worker RSS ≤ 150 MB after {w['steps']:,} steps",
            w["rss_after_mb"][0],
            T["rss_mb"],
            " MB",
            note="" if w["steps"] >= 10_000 else "fewer than 10k steps (--quick)",
        )
    return t.rows


def targets_section(results: dict[str, Any]) -> list[str]:
    """The "Targets (issue 13)" table as Markdown lines (none when nothing was measured)."""
    rows = targets(results)
    if not rows:
        return []
    out = ["## Targets (issue 13)", "", "| Target | Measured | Met | Gap |", "|---|---|---|---|"]
    for r in rows:
        met = r["met"]
        shown = (
            "n/a" if met is None else met if isinstance(met, str) else ("yes" if met else "**no**")
        )
        out.append(f"| {r['target']} | {r['measured']} | {shown} | {r['gap']} |")
    return out + [""]
