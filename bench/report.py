"""Render the results (the JSON the parts produced) as the Markdown table and targets."""

from __future__ import annotations

import math
from typing import Any

SYSTEM_NAMES = {
    "floor": "Floor (INSERT + COMMIT)",
    "durable": "Durable",
    "dbos": "DBOS Transact",
    "langgraph": "LangGraph (Postgres/SqliteSaver, sync)",
}

#: the targets of issue 6
TARGETS = {
    "step_ms": 0.5,
    "floor_ratio": 2.0,
    "dbos_ratio": 7.0,
    "langgraph_ratio": 4.0,
    "read_commits": 1.0,
    "write_commits": 2.0,
    "dispatch_p50_ms": 15.0,
    "recovery_p50_s": 3.0,
    "recovery_default_p50_s": 10.0,
    "approval_p50_ms": 100.0,
    "dashboard_p95_ms": 100.0,
    "rss_mb": 150.0,
}


def _ok(x: Any) -> bool:
    return isinstance(x, (int, float)) and not math.isnan(x)


def fmt(x: Any, digits: int = 3) -> str:
    if not _ok(x):
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}g}" if abs(x) < 1 else f"{x:.{max(digits - 1, 1)}f}"


def mmm(s: dict[str, Any] | None) -> str:
    """``median (min–max)``."""
    if not s or not _ok(s.get("median")):
        return "–"
    if s.get("n", 0) <= 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def _row(rows: list[dict[str, Any]], system: str, db: str, scenario: str) -> dict[str, Any]:
    return next(
        (r for r in rows if (r["system"], r["db"], r["scenario"]) == (system, db, scenario)), {}
    )


def _median(r: dict[str, Any], key: str = "per_step_ms") -> float:
    return (r.get(key) or {}).get("median", math.nan)


# -------------------------------------------------------------------------- sections


def checkpoint_section(cp: dict[str, Any]) -> list[str]:
    rows = cp["rows"]
    scen = {s["key"]: s for s in cp["scenarios"]}
    seq, single = scen["seq"], scen["single"]
    out = [
        "## 1. Checkpoint overhead (sequential no-op steps, in-process)",
        "",
        (
            f"Median (min–max) of {cp['reps']} repetitions, interleaved across systems. "
            f"ms/step = wall time of {seq['label']} / steps (run start and completion "
            f"included); ms/run = {single['label']}. Commits and bytes: PostgreSQL, counted in "
            "the last repetition (`pg_stat_database.xact_commit` of the system's own database "
            "after its connections closed; `pg_total_relation_size` of its tables)."
        ),
        "",
    ]
    systems = [s for s in SYSTEM_NAMES if any(r["system"] == s for r in rows)]
    durable_pg = _median(_row(rows, "durable", "postgresql", "seq"))
    out.append(
        "| System | PostgreSQL ms/step | × Durable | SQLite ms/step | PostgreSQL "
        "ms/run (1 step) | SQLite ms/run (1 step) | commits/step (marginal) | "
        "bytes/step |"
    )
    out.append("|---|---|---|---|---|---|---|---|")
    for system in systems:
        pg = _row(rows, system, "postgresql", "seq")
        sl = _row(rows, system, "sqlite", "seq")
        pg1 = _row(rows, system, "postgresql", "single")
        sl1 = _row(rows, system, "sqlite", "single")
        ratio = _median(pg) / durable_pg if _ok(durable_pg) and _ok(_median(pg)) else math.nan
        commits = "–"
        if "commits_per_step" in pg:
            commits = fmt(pg["commits_per_step"])
            if "commits_marginal" in pg:
                commits += f" ({fmt(pg['commits_marginal'])})"
        out.append(
            f"| {SYSTEM_NAMES[system]} | {mmm(pg.get('per_step_ms'))} | "
            f"{fmt(ratio, 2) + '×' if _ok(ratio) else '–'} | "
            f"{mmm(sl.get('per_step_ms'))} | {mmm(pg1.get('per_run_ms'))} | "
            f"{mmm(sl1.get('per_run_ms'))} | {commits} | "
            f"{fmt(pg.get('bytes_per_step', math.nan))} |"
        )
    tool_rows = [
        r
        for r in rows
        if r["system"] == "durable"
        and r["scenario"] in ("seq", "read_tool", "write_tool", "read_tool_paced")
    ]
    if tool_rows:
        out += [
            "",
            (
                "Durable by kind of step (commits/step: all commits of the runs / steps; "
                "marginal: without the per-run start, claim and completion):"
            ),
            "",
            (
                "| Step | DB | ms/step | commits/step | marginal commits/step | "
                "read-only tx/step (client) | write tx/step (client) | marginal write tx/step "
                "| bytes/step |"
            ),
            "|---|---|---|---|---|---|---|---|---|",
        ]
        order = {"seq": 0, "read_tool": 1, "write_tool": 2, "read_tool_paced": 3}
        marg = marginal_client_tx(cp)
        for r in sorted(tool_rows, key=lambda r: (r["db"] != "postgresql", order[r["scenario"]])):
            label = "`ctx.step` no-op" if r["scenario"] == "seq" else r["label"]
            tx = r.get("client_tx_per_step") or {}
            out.append(
                f"| {label} | {r['db']} | {mmm(r['per_step_ms'])} | "
                f"{fmt(r.get('commits_per_step', math.nan))} | "
                f"{fmt(r.get('commits_marginal', math.nan))} | "
                f"{fmt(tx.get('read', math.nan))} | {fmt(tx.get('write', math.nan))} | "
                f"{fmt(marg.get((r['db'], r['scenario']), math.nan))} | "
                f"{fmt(r.get('bytes_per_step', math.nan))} |"
            )
        if any(r.get("client_tx_per_step") for r in tool_rows):
            out += [
                "",
                (
                    "Client-side transaction count (Durable's bench process wraps every "
                    "Django connection, heartbeat thread included: a statement in autocommit is "
                    "a transaction; an atomic block is one, a *write* one if any statement in "
                    "it is an INSERT/UPDATE/DELETE). `xact_commit` counts both kinds; the "
                    "read-only ones are the strict-cancellation status reads "
                    "(`AUTHORIZATION_STALE_SECONDS = 0`) and other SELECTs in autocommit, which "
                    "write no WAL and wait for no flush."
                ),
            ]
    if cp.get("skipped"):
        out += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in cp["skipped"].items())]
    return out


def marginal_client_tx(cp: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Marginal *write* transactions per step (client count), per (db, scenario): the
    per-run cost (start, claim, completion) measured by the one-step runs subtracted."""
    rows = cp["rows"]
    scen = {s["key"]: s for s in cp["scenarios"]}
    out: dict[tuple[str, str], float] = {}
    for db in ("postgresql", "sqlite"):
        long_ = _row(rows, "durable", db, "seq").get("client_tx_per_run")
        one = _row(rows, "durable", db, "single").get("client_tx_per_run")
        if not long_ or not one:
            continue
        steps = scen["seq"]["steps"]
        m = (long_["write"] - one["write"]) / (steps - 1)
        out[(db, "seq")] = m
        overhead = one["write"] - m
        for key in ("read_tool", "write_tool", "read_tool_paced"):
            r = _row(rows, "durable", db, key).get("client_tx_per_run")
            if r and key in scen:
                out[(db, key)] = (r["write"] - overhead) / scen[key]["steps"]
    return out


SHAPE_LABELS = {
    "orm": "engine today: `Execution.write` via the ORM (4 round trips)",
    "raw4": "the same 4 statements, raw psycopg (no ORM)",
    "cte": "one fenced statement (`WITH r AS (UPDATE run ... RETURNING) INSERT step, event`)",
    "cte_hot": "… without re-writing the indexed `lease_expires_at`, fillfactor 85 (HOT)",
    "cte_hot_noevent": "… and without the per-step trace event row",
}


def shapes_section(s: dict[str, Any]) -> list[str]:
    if "skipped" in s:
        return ["## Checkpoint SQL shapes (diagnosis)", "", f"Skipped: {s['skipped']}"]
    out = [
        "## Checkpoint SQL shapes (diagnosis, PostgreSQL, Durable's schema)",
        "",
        (
            f"{s['steps']} checkpoints of one running run per shape, median (min–max) of "
            f"{s['reps']} interleaved repetitions; HOT = share of `durable_run` updates that "
            "were heap-only (no index writes)."
        ),
        "",
        "| Shape | ms/step | HOT updates | bytes/step |",
        "|---|---|---|---|",
    ]
    for key, label in SHAPE_LABELS.items():
        r = s["shapes"].get(key)
        if r:
            out.append(
                f"| {label} | {mmm(r['ms'])} | {r.get('hot_share', math.nan):.0%} | "
                f"{fmt(r.get('bytes_per_step', math.nan))} |"
            )
    return out


def dispatch_section(d: dict[str, Any]) -> list[str]:
    out = [
        "## 2. Dispatch latency (one-step run, `durable.start` → SUCCEEDED, worker process)",
        "",
        ("| Broker / database | p50 ms | p99 ms | min–max ms | start → claimed p50 ms | runs |"),
        "|---|---|---|---|---|---|",
    ]
    for key, r in d.items():
        if "skipped" in r:
            out.append(f"| {key} | skipped: {r['skipped']} | | | | |")
            continue
        t, c = r["start_to_finished_ms"], r["start_to_claimed_ms"]
        out.append(
            f"| {key} | {fmt(t['p50'])} | {fmt(t['p99'])} | {fmt(t['min'])}–"
            f"{fmt(t['max'])} | {fmt(c['p50'])} | {t['n']} |"
        )
    return out


def throughput_section(t: dict[str, Any]) -> list[str]:
    if "skipped" in t:
        return ["## 3. Throughput", "", f"Skipped: {t['skipped']}"]
    out = [
        (
            "## 3. Throughput (PostgreSQL + Redis, runs of "
            f"{t.get('steps_per_run', 20)} no-op steps dispatched at once)"
        ),
        "",
        "| Workers | steps/s | runs | steps | seconds |",
        "|---|---|---|---|---|",
    ]
    for n in (1, 2):
        r = t.get(f"workers_{n}")
        if r:
            out.append(
                f"| {n} | {fmt(r['steps_per_second'])} | {r['runs']} | {r['steps']} | "
                f"{fmt(r['seconds'])} |"
            )
    return out


def _recovery_row(label: str, r: dict[str, Any]) -> str:
    s, k = r["kill_to_next_step_s"], r["settings"]
    liveness = (
        f"beat {k['DURABLE_WORKER_BEAT_SECONDS']:g} s, dead after "
        f"{k['DURABLE_WORKER_DEAD_AFTER_SECONDS']:g} s"
        if "DURABLE_WORKER_BEAT_SECONDS" in k
        else "–"
    )
    return (
        f"| {label} | {k['DURABLE_LEASE_SECONDS']:g} s / "
        f"{fmt(k['DURABLE_HEARTBEAT_SECONDS'])} s | "
        f"{k['DURABLE_SWEEP_INTERVAL_SECONDS']:g} s | {liveness} | {r['kills']} | "
        f"{r.get('recovered', s['n'])} | {fmt(s['p50'])} | {fmt(s['p99'])} | "
        f"{fmt(s['min'])}–{fmt(s['max'])} |"
    )


def recovery_section(r: dict[str, Any]) -> list[str]:
    if "skipped" in r:
        return ["## 4. Recovery", "", f"Skipped: {r['skipped']}"]
    k = r["settings"]
    rows = [_recovery_row("tuned", r)]
    default = r.get("default_settings")
    if default and "kill_to_next_step_s" in default:
        rows.append(_recovery_row("default settings", default))
    failures = list(r.get("failures") or []) + list((default or {}).get("failures") or [])
    return [
        ("## 4. Recovery (SIGKILL the worker mid-step → the next step starts on another worker)"),
        "",
        (
            "| settings | lease / heartbeat | sweep | process liveness | kills | recovered "
            "| p50 s | p99 s | min–max s |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        (
            f"Steps of {k['step_seconds']} s; the sweeper is a {k['sweeper']}; PostgreSQL + "
            'Redis, 2 workers. "default settings" changes nothing: a dead worker\'s run '
            "is released when its process has not beaten for the dead-after time, not "
            "when the 30 s lease runs out."
        ),
    ] + (["", "Not recovered within 60 s: " + "; ".join(failures)] if failures else [])


def approval_section(a: dict[str, Any]) -> list[str]:
    if "skipped" in a:
        return ["## 5. Approval latency", "", f"Skipped: {a['skipped']}"]
    s = a["decision_to_next_step_ms"]
    return [
        (
            "## 5. Approval latency (`approval_decide` committed → the next step starts; "
            "worker process, PostgreSQL + Redis)"
        ),
        "",
        "| approvals | p50 ms | p99 ms | min–max ms |",
        "|---|---|---|---|",
        (
            f"| {a['approvals']} | {fmt(s['p50'])} | {fmt(s['p99'])} | {fmt(s['min'])}–"
            f"{fmt(s['max'])} |"
        ),
    ]


def dashboard_section(d: dict[str, Any]) -> list[str]:
    if "skipped" in d:
        return ["## 6. Dashboard at scale", "", f"Skipped: {d['skipped']}"]
    seed = d["seed"]
    how = (
        "reused from an earlier invocation"
        if d.get("seed_reused")
        else f"seeded in {fmt(seed['seed_seconds'])} s"
    )
    out = [
        "## 6. Dashboard at scale (Django test client, superuser, PostgreSQL)",
        "",
        (
            f"Seeded {seed['runs']:,} runs, {seed['steps']:,} steps, {seed['events']:,} trace "
            f"events, {seed['pending_approvals']:,} pending approvals by COPY "
            f"({how}). "
            f"{d.get('repeats')} requests per page after 2 warm-up requests."
        ),
        "",
        "| Page | p50 ms | p95 ms | queries | KiB | slowest query ms |",
        "|---|---|---|---|---|---|",
    ]
    for p in d["pages"]:
        if not p.get("available"):
            out.append(
                f"| {p['page']} (`{p['path']}`) | {p.get('note', 'not available')} | | | | |"
            )
            continue
        out.append(
            f"| {p['page']} (`{p['path']}`) | {fmt(p['ms']['p50'])} | "
            f"{fmt(p['ms']['p95'])} | {p['queries']} | {fmt(p['bytes'] / 1024)} | "
            f"{fmt(p.get('slowest_query_ms', math.nan))} |"
        )
    slow = [p for p in d["pages"] if p.get("available") and p.get("slowest_query_ms", 0) > 20]
    if slow:
        out += ["", "<details><summary>Slowest query of each page over 20 ms</summary>", ""]
        for p in slow:
            out += [
                (
                    f"- {p['page']}: {fmt(p['slowest_query_ms'])} ms: "
                    f"`{p.get('slowest_query', '')[:600]}`"
                )
            ]
        out += ["", "</details>"]
    return out


def page_profiles(d: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for p in d.get("profiles") or []:
        b = p["buckets"]
        out += [
            "",
            (
                f"Profile of `{p['path']}` ({p['page']}; pyinstrument, ms per request): "
                f"sampled {fmt(p['sampled_ms'])} ms, of which SQL "
                f"{fmt(b['sql (psycopg, sqlite3)']['ms'])} ms and template rendering "
                f"{fmt(b['templates (django.template)']['ms'])} ms."
            ),
            "",
            "| project function (inclusive) | ms/request | share |",
            "|---|---|---|",
        ]
        for f in p["top_project"][:8]:
            out.append(f"| `{f['function']}` | {fmt(f['ms'])} | {f['share']:.0%} |")
    return out


def memory_section(t: dict[str, Any]) -> list[str]:
    r = t.get("workers_1") if isinstance(t, dict) else None
    if not r:
        return ["## 7. Memory", "", "Not measured (needs the throughput part)."]
    return [
        "## 7. Memory (worker RSS, `--pool=solo`, VmRSS)",
        "",
        "| worker | RSS when ready MB | RSS after MB | steps executed |",
        "|---|---|---|---|",
        (
            f"| 1 of 1 | {fmt(r['rss_ready_mb'][0])} | {fmt(r['rss_after_mb'][0])} | "
            f"{r['steps'] + 2 * 20:,} |"
        ),
    ]


# --------------------------------------------------------------------------- targets


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    parts = results["parts"]
    T = TARGETS
    out: list[dict[str, Any]] = []

    def add(
        name: str,
        measured: float,
        target: float,
        unit: str,
        *,
        higher: bool = False,
        note: str = "",
    ) -> None:
        if not _ok(measured):
            out.append({"target": name, "measured": "not measured", "met": None, "gap": note})
            return
        met = measured >= target if higher else measured <= target
        gap = ""
        if not met:
            gap = f"{fmt(measured)}{unit} vs {fmt(target)}{unit}: " + (
                f"{fmt(target / measured, 2)}× short"
                if higher
                else f"{fmt(measured / target, 2)}× over"
            )
        out.append(
            {
                "target": name,
                "measured": f"{fmt(measured)}{unit}",
                "met": met,
                "gap": (gap + (" — " + note if note and gap else note)).strip(),
            }
        )

    cp = parts.get("checkpoint")
    if cp:
        rows = cp["rows"]
        d = _median(_row(rows, "durable", "postgresql", "seq"))
        f = _median(_row(rows, "floor", "postgresql", "seq"))
        db = _median(_row(rows, "dbos", "postgresql", "seq"))
        lg = _median(_row(rows, "langgraph", "postgresql", "seq"))
        add("checkpointed no-op step on PostgreSQL ≤ 0.5 ms", d, T["step_ms"], " ms")
        add(
            "≤ 2× the INSERT + COMMIT floor",
            d / f if _ok(f) else math.nan,
            T["floor_ratio"],
            "×",
            note=f"floor {fmt(f)} ms" if _ok(f) else "",
        )
        add(
            "≥ 7× faster than DBOS",
            db / d if _ok(db) else math.nan,
            T["dbos_ratio"],
            "×",
            higher=True,
            note=f"DBOS {fmt(db)} ms" if _ok(db) else "DBOS not run",
        )
        add(
            "≥ 4× faster than LangGraph",
            lg / d if _ok(lg) else math.nan,
            T["langgraph_ratio"],
            "×",
            higher=True,
            note=f"LangGraph {fmt(lg)} ms" if _ok(lg) else "LangGraph not run",
        )
        r = _row(rows, "durable", "postgresql", "read_tool")
        marg = marginal_client_tx(cp)
        wnote = ""
        if ("postgresql", "read_tool") in marg:
            wnote = (
                f"; write transactions only (client count), marginal: "
                f"{fmt(marg[('postgresql', 'read_tool')])}"
            )
        add(
            "≤ 1 commit per read-only step (marginal)",
            r.get("commits_marginal", math.nan),
            T["read_commits"],
            "",
            note=(
                f"all commits of the runs / steps: "
                f"{fmt(r.get('commits_per_step', math.nan))}" + wnote
            )
            if r
            else "",
        )
        r = _row(rows, "durable", "postgresql", "write_tool")
        wnote = ""
        if ("postgresql", "write_tool") in marg:
            wnote = (
                f"; write transactions only (client count), marginal: "
                f"{fmt(marg[('postgresql', 'write_tool')])}"
            )
        add(
            "≤ 2 commits per unsafe write (marginal)",
            r.get("commits_marginal", math.nan),
            T["write_commits"],
            "",
            note=(
                f"all commits of the runs / steps: "
                f"{fmt(r.get('commits_per_step', math.nan))}" + wnote
            )
            if r
            else "",
        )
    d = parts.get("dispatch", {}).get("redis/postgresql")
    if d is not None:
        add(
            "one-step run p50 ≤ 15 ms on Redis",
            d.get("start_to_finished_ms", {}).get("p50", math.nan),
            T["dispatch_p50_ms"],
            " ms",
        )
    r = parts.get("recovery")
    if r is not None:
        add(
            "recovery p50 ≤ 3 s",
            r.get("kill_to_next_step_s", {}).get("p50", math.nan),
            T["recovery_p50_s"],
            " s",
        )
        d = r.get("default_settings") or {}
        if "kill_to_next_step_s" in d:
            add(
                "recovery p50 ≤ 10 s, default settings",
                d["kill_to_next_step_s"].get("p50", math.nan),
                T["recovery_default_p50_s"],
                " s",
            )
    a = parts.get("approval")
    if a is not None:
        add(
            "approval → next step p50 ≤ 100 ms",
            a.get("decision_to_next_step_ms", {}).get("p50", math.nan),
            T["approval_p50_ms"],
            " ms",
        )
    db_ = parts.get("dashboard")
    if db_ is not None and "pages" in db_:
        avail = [p for p in db_["pages"] if p.get("available")]
        worst = max(avail, key=lambda p: p["ms"]["p95"], default=None)
        over = [
            f"{p['page']} {fmt(p['ms']['p95'])} ms"
            for p in avail
            if p["ms"]["p95"] > T["dashboard_p95_ms"]
        ]
        missing = [p["page"] for p in db_["pages"] if not p.get("available")]
        note = "over: " + "; ".join(over) if over else ""
        if missing:
            note += ("; " if note else "") + "not measured: " + ", ".join(missing)
        add(
            "dashboard p95 ≤ 100 ms (worst page)",
            worst["ms"]["p95"] if worst else math.nan,
            T["dashboard_p95_ms"],
            " ms",
            note=note,
        )
    t = parts.get("throughput")
    if t is not None and "workers_1" in t:
        w = t["workers_1"]
        add(
            f"worker RSS ≤ 150 MB after {w['steps']:,} steps",
            w["rss_after_mb"][0],
            T["rss_mb"],
            " MB",
            note="" if w["steps"] >= 10_000 else "fewer than 10k steps (--quick)",
        )
    return out


def profile_section(profile: dict[str, Any] | None, lines: int = 70) -> list[str]:
    if not profile:
        return []
    out = [
        (
            "## Profile of the checkpoint path (pyinstrument, Durable on "
            f"{profile['db']}, {profile['steps']} steps)"
        ),
        "",
        "Top functions by own time (ms per step; share of the sampled time):",
        "",
        "| function | ms/step | share |",
        "|---|---|---|",
    ]
    for f in profile["top_self"][:20]:
        out.append(f"| `{f['function']}` | {fmt(f['ms_per_step'])} | {f['share']:.0%} |")
    if profile.get("top_durable"):
        out += [
            "",
            "Durable's own functions, inclusive time (ms per step; share):",
            "",
            "| function | ms/step | share |",
            "|---|---|---|",
        ]
        for f in profile["top_durable"][:20]:
            out.append(f"| `{f['function']}` | {fmt(f['ms_per_step'])} | {f['share']:.0%} |")
    tree = profile["tree"].splitlines()
    out += ["", "<details><summary>Call tree (pyinstrument)</summary>", "", "```"]
    out += tree[:lines] + (["... (truncated)"] if len(tree) > lines else [])
    out += ["```", "", "</details>"]
    return out


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    v = results.get("versions", {})
    parts = results["parts"]
    out = [
        f"# Durable benchmark — {results['date']}" + (" (--quick)" if results["quick"] else ""),
        "",
        (
            f"Machine: {m.get('cpu', '?')}, {m.get('cpus')} CPUs, {m.get('memory_gb', '?')} GB, "
            f"{m.get('platform')}; load average at start "
            f"{', '.join(f'{x:.2f}' for x in m.get('loadavg_start', []))}, at end "
            f"{', '.join(f'{x:.2f}' for x in m.get('loadavg_end', []))}."
        ),
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        (
            f"Total time: {results.get('total_seconds', '?')} s "
            f"({', '.join(f'{k} {s} s' for k, s in results.get('part_seconds', {}).items())})."
        ),
        "",
    ]
    for m in results.get("merged", []):
        la = m.get("machine", {}).get("loadavg_start", [])
        out.insert(
            -1,
            f"Re-run and merged at {m['date']}: {', '.join(m['parts'])}"
            + (f" (load average {la[0]:.2f})" if la else "")
            + ".",
        )
    if results.get("merged"):
        out.insert(-1, "Total time is the sum of the parts' latest times.")
    tg = targets(results)
    if tg:
        out += [
            "## Targets (issue 6)",
            "",
            "| Target | Measured | Met | Gap |",
            "|---|---|---|---|",
        ]
        for t in tg:
            met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
            out.append(f"| {t['target']} | {t['measured']} | {met} | {t['gap']} |")
        out.append("")
    if "checkpoint" in parts:
        out += checkpoint_section(parts["checkpoint"]) + [""]
    if "shapes" in parts:
        out += shapes_section(parts["shapes"]) + [""]
    if "dispatch" in parts:
        out += dispatch_section(parts["dispatch"]) + [""]
    if "throughput" in parts:
        out += throughput_section(parts["throughput"]) + [""]
    if "recovery" in parts:
        out += recovery_section(parts["recovery"]) + [""]
    if "approval" in parts:
        out += approval_section(parts["approval"]) + [""]
    if "dashboard" in parts:
        out += dashboard_section(parts["dashboard"]) + page_profiles(parts["dashboard"]) + [""]
    if "throughput" in parts and "memory" in results.get("requested_parts", ["memory"]):
        out += memory_section(parts["throughput"]) + [""]
    if results.get("errors"):
        out += (
            ["## Errors", ""]
            + [f"- {k}: `{v.splitlines()[0] if v else ''}`" for k, v in results["errors"].items()]
            + [""]
        )
    if "checkpoint" in parts:
        out += profile_section(parts["checkpoint"].get("profile")) + [""]
    return "\n".join(out).rstrip() + "\n"
