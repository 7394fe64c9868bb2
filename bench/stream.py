"""Part "stream": the time to the first token through Durable against calling the model
directly, and what a streamed call costs in storage.

``python -m bench.stream --calls N --words W`` (environment: ``DATABASE_URL`` of a
scratch database, or none for the embedded SQLite under ``DURABLE_VAR_DIR``) serves the
scripted model (examples/fake_llm.py) from a thread, its chunks ``--delay`` seconds
apart (``[fault:stream_delay]``, a model's pace), a reply of about W words, then:

1. **direct**: N streamed chat completions with the ``openai`` client, as an agent
   without Durable makes them: seconds from the request to the first content delta, and
   to the end of the stream;
2. **through Durable**: N runs of ``bench.stream`` (one ``ctx.llm(..., stream=True)``),
   each executed by :func:`durable.testing.drive` in a thread of this process while this
   thread reads ``durable.stream(run_id, poll=P)``: seconds from ``durable.start`` to the
   first ``token`` event the reader gets, and to the run's end; for the default poll
   (0.25 s) and 0.05 s. What Durable adds is the start (a run row), the writer's batching
   (at most 50 ms) and the reader's poll;
3. **storage**: stream rows per call and bytes per call (PostgreSQL: the stream table's
   ``pg_total_relation_size`` growth, indexes and TOAST included; SQLite: the rows' data
   lengths, a lower bound), beside the bytes of the step's record.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from .common import (
    Config,
    django_env,
    emit,
    percentile,
    pg_available,
    recreate_pg_db,
    run_child,
    setup_django,
    summary,
)

POLLS = (0.25, 0.05)


def _message(words: int) -> str:
    return " ".join(f"w{i}" for i in range(words))


def _direct(url: str, message: str, calls: int) -> dict[str, Any]:
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="scripted")
    first, whole = [], []
    for _ in range(calls):
        t = time.perf_counter()
        got = None
        stream = client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": message}],
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if got is None and chunk.choices and chunk.choices[0].delta.content:
                got = time.perf_counter() - t
        whole.append(time.perf_counter() - t)
        first.append(got if got is not None else float("nan"))
    return {"first_token_s": _stats(first), "whole_s": _stats(whole)}


def _stats(values: list[float]) -> dict[str, float]:
    return {**summary(values), "p95": percentile(values, 95)}


def _through_durable(message: str, calls: int, poll: float) -> dict[str, Any]:
    from django.db import connections

    import durable
    from durable.testing import drive

    first, whole = [], []
    for _ in range(calls):
        t = time.perf_counter()
        run = durable.start("bench.stream", {"message": message})

        def execute(run_id: str = run.id) -> None:
            try:
                drive(run_id)
            finally:
                connections.close_all()

        worker = threading.Thread(target=execute)
        worker.start()
        got = None
        for event in durable.stream(run.id, poll=poll):
            if got is None and event["kind"] == "token":
                got = time.perf_counter() - t
        worker.join()
        whole.append(time.perf_counter() - t)
        first.append(got if got is not None else float("nan"))
        status = durable.get_run(run.id).status
        if status != "succeeded" or got is None:
            raise RuntimeError(f"bench.stream run {run.id} ended {status}, first token {got}")
    return {"poll_s": poll, "first_token_s": _stats(first), "whole_s": _stats(whole)}


def _storage(calls: int) -> dict[str, Any]:
    from django.db import connection

    from durable.models import Step, StreamEvent

    rows = StreamEvent.objects.count()
    steps = list(Step.objects.filter(kind="llm").values_list("output", flat=True))
    record = sum(len(s or "") for s in steps) / max(len(steps), 1)
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_total_relation_size(%s)", [StreamEvent._meta.db_table])
            size = cur.fetchone()[0]
        how = "pg_total_relation_size"
    else:
        size = sum(
            len(str(d)) + len(k) + len(s)
            for d, k, s in StreamEvent.objects.values_list("data", "kind", "step_id")
        )
        how = "row data lengths"
    return {
        "calls": calls,
        "rows_per_call": round(rows / calls, 1),
        "bytes_per_call": round(size / calls),
        "record_bytes_per_call": round(record),
        "how": how,
    }


def part_stream(cfg: Config, log_dir: Any) -> dict[str, Any]:
    """The orchestrator's part (``python -m bench --only stream``): on PostgreSQL."""
    if problem := pg_available(cfg):
        return {"skipped": problem}
    url = recreate_pg_db(cfg, "stream").replace("postgresql://", "postgres://", 1)
    args = ["--calls", "5" if cfg.quick else "30", "--words", "200"]
    env = django_env(cfg, database_url=url)
    return run_child("bench.stream", args, env, timeout=1800, verbose=cfg.verbose)[-1]


def section(s: dict[str, Any]) -> list[str]:
    """The part's section of the results file."""
    from .numbers import fmt

    title = "## Streaming: time to the first token, and the storage of a streamed call"
    if "skipped" in s:
        return [title, "", f"Skipped: {s['skipped']}"]
    d = s["direct"]
    rows = [
        "| Path | Reader's poll s | First token p50 s | First token p95 s | Whole reply p50 s |",
        "|---|---|---|---|---|",
        f"| the model directly (openai client) | – | {fmt(d['first_token_s']['median'])} | "
        f"{fmt(d['first_token_s']['p95'])} | {fmt(d['whole_s']['median'])} |",
    ]
    for r in s["durable"]:
        ratio = r["first_token_s"]["median"] / d["first_token_s"]["median"]
        rows.append(
            f"| through Durable (start, worker, `durable.stream`) | {r['poll_s']} | "
            f"{fmt(r['first_token_s']['median'])} ({ratio:.0f}×) | "
            f"{fmt(r['first_token_s']['p95'])} | {fmt(r['whole_s']['median'])} |"
        )
    st = s["storage"]
    return [
        title,
        "",
        (
            f"{s['calls']} streamed calls a row on {s['database']}, the scripted model's reply "
            f"to {s['words']} words, its chunks {s['chunk_delay_s']} s apart (bench/stream.py). "
            "Through Durable, the clock starts at `durable.start` and the first token is the "
            "first `token` event the reader gets: the run's start, the writer's batching "
            "(at most 50 ms) and the reader's poll are what Durable adds."
        ),
        "",
        *rows,
        "",
        (
            f"Storage: {st['rows_per_call']} stream rows and {st['bytes_per_call']:,} bytes a "
            f"call ({st['how']}), beside the step's record of {st['record_bytes_per_call']:,} "
            "bytes."
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--words", type=int, default=200)
    p.add_argument("--delay", type=float, default=0.005, help="seconds between two chunks")
    a = p.parse_args(argv)
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    import os

    import bench.workflows  # noqa: F401  (registers bench.stream)
    from examples._http import start
    from examples.fake_llm import FakeLLM

    llm = FakeLLM()
    server = start(llm.router, "fake-llm")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    os.environ.update(OPENAI_BASE_URL=url, OPENAI_API_KEY="scripted")
    message = f"[fault:stream_delay={a.delay}] {_message(a.words)}"
    try:
        _direct(url, message, 2)  # warm-up: the client, the server's threads
        direct = _direct(url, message, a.calls)
        durable_rows = [_through_durable(message, a.calls, poll) for poll in POLLS]
        storage = _storage(a.calls * len(POLLS))
    finally:
        server.shutdown()
    emit(
        {
            "database": connection.vendor,
            "calls": a.calls,
            "words": a.words,
            "chunk_delay_s": a.delay,
            "direct": direct,
            "durable": durable_rows,
            "storage": storage,
        }
    )


if __name__ == "__main__":
    main()
