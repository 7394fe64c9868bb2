"""Render the results (the JSON the parts produced) as the Markdown table and targets."""

from __future__ import annotations

import math
from typing import Any

from .numbers import MARGINAL_SCENARIOS, fmt, marginal_client_tx, mmm
from .numbers import find_row as _row
from .numbers import median_of as _median
from .numbers import ok as _ok
from .targets import targets_section
from .throughput import throughput_section

SYSTEM_NAMES = {
    "floor": "Floor (INSERT + COMMIT)",
    "durable": "Durable",
    "dbos": "DBOS Transact",
    "langgraph": "LangGraph (Postgres/SqliteSaver, sync)",
}

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
        if r["system"] == "durable" and r["scenario"] in ("seq", *MARGINAL_SCENARIOS)
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
        order = {k: i for i, k in enumerate(("seq", *MARGINAL_SCENARIOS))}
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
                    "read-only ones are SELECTs in autocommit (Django's connection health "
                    "checks; until issue 13, a per-step status read), which write no WAL and "
                    "wait for no flush."
                ),
            ]
    batched = cp.get("batched") or {}
    if batched.get("available") is False:
        out += ["", f'`durability="batched"` rows: not available ({batched.get("reason", "")}).']
    if cp.get("skipped"):
        out += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in cp["skipped"].items())]
    return out


SHAPE_LABELS = {
    "orm": "the engine's own checkpoint (`Checkpoints.record_success`: one prepared statement)",
    "raw4": "the same 4 statements, raw psycopg (no ORM)",
    "cte": "one fenced statement (`WITH r AS (UPDATE run ... RETURNING) INSERT step, event`)",
    "cte_hot": "… without re-writing the indexed `lease_expires_at`, fillfactor 85 (HOT)",
    "cte_hot_noevent": "… and without the per-step trace event row",
    "share": "the fence as a `FOR SHARE` read of the run (no run UPDATE), step and event",
    "share_noevent": "… without the trace event row",
    "step_only": "the step's INSERT alone, unfenced (the least a checkpoint writes)",
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


def prune_section(s: dict[str, Any]) -> list[str]:
    title = "## Retention: prune throughput and checkpoint latency while it runs"
    if "skipped" in s:
        return [title, "", f"Skipped: {s['skipped']}"]
    b, d = s["checkpoint_ms_before"], s["checkpoint_ms_during"]
    return [
        title,
        "",
        (
            f"{s['pruned_runs']} finished runs of {s['steps_per_run']} steps (a trace event "
            f"per step) deleted by `durable.services.retention.prune` in {s['batches']} batches, "
            f"while "
            f"a live `bench.noop` run of the same database checkpoints in-process "
            f"({s['live_runs_during']} live runs during the prune; median (min–max) and p95 "
            "of their ms/step)."
        ),
        "",
        "| Prune runs/s | Prune steps/s | Checkpoint ms/step alone | p95 alone "
        "| Checkpoint ms/step during prune | p95 during |",
        "|---|---|---|---|---|---|",
        (
            f"| {s['runs_per_second']} | {s['steps_per_second']} | {mmm(b)} | "
            f"{fmt(s['checkpoint_p95_before'])} | {mmm(d)} | {fmt(s['checkpoint_p95_during'])} |"
        ),
    ]


def replay_section(s: dict[str, Any]) -> list[str]:
    title = "## Replay check: open runs checked a minute"
    if "skipped" in s:
        return [title, "", f"Skipped: {s['skipped']}"]
    return [
        title,
        "",
        (
            f"{s['runs']} runs of `bench.replay` parked on an approval, {s['steps_per_run']} "
            "recorded steps each, replayed dry against the registered code "
            "(`durable.worker.dry.check_runs` in process, median (min–max) of its seconds; "
            "and `manage.py durable replay-check --json` in a process of its own, its start "
            "included)."
        ),
        "",
        "| Database | Check s | Runs/min | Command s | Command runs/min |",
        "|---|---|---|---|---|",
        (
            f"| {s['database']} | {mmm(s['check_seconds'])} | {s['runs_per_minute']:,} | "
            f"{fmt(s['command_seconds'])} | {s['command_runs_per_minute']:,} |"
        ),
    ]


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
    out += targets_section(results)
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
    if "prune" in parts:
        out += prune_section(parts["prune"]) + [""]
    if "replay" in parts:
        out += replay_section(parts["replay"]) + [""]
    if "stream" in parts:
        from .stream import section as stream_section

        out += stream_section(parts["stream"]) + [""]
    if "growth" in parts:
        from .growth import section as growth_section

        out += growth_section(parts["growth"]) + [""]
    if "startup" in parts:
        from .startup import section as startup_section

        out += startup_section(parts["startup"]) + [""]
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
