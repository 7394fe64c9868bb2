"""Part 1: checkpoint overhead of sequential no-op steps, side by side.

Each (system, database) pair runs in its own long-lived child process (``python -m
bench.checkpoint --system S --db D``) that sets the system up once and then answers
``rep`` commands; the orchestrator interleaves the repetitions of all systems so that a
noisy minute of the machine hits them alike. Systems:

- ``floor``: one single-row INSERT + COMMIT per step (psycopg 3 on PostgreSQL; sqlite3 in
  WAL mode with ``synchronous=NORMAL``, Durable's own SQLite settings, on SQLite).
- ``durable``: ``durable.start`` with ``DURABLE_DISPATCH=manual``, then
  ``durable.worker.engine.execute`` in-process (the engine, not Celery).
- ``dbos``: DBOS Transact, ``@DBOS.workflow`` calling an ``@DBOS.step`` per step, its
  own system database.
- ``langgraph``: a one-node loop graph (one super-step per step) with ``PostgresSaver``
  (``SqliteSaver`` on SQLite), ``durability="sync"``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from typing import Any, TypedDict

from .common import emit, serve

SYSTEMS = ("floor", "durable", "dbos", "langgraph")
PEER_PACKAGES = {
    "dbos": ("dbos",),
    "langgraph": ("langgraph", "langgraph.checkpoint.postgres", "langgraph.checkpoint.sqlite"),
}


def missing_packages(system: str, db: str) -> str | None:
    """None when the system can run here, else what is missing."""
    import importlib.util

    names = list(PEER_PACKAGES.get(system, ()))
    if system == "langgraph":
        names = [
            "langgraph",
            "langgraph.checkpoint.postgres"
            if db == "postgresql"
            else "langgraph.checkpoint.sqlite",
        ]
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"package {name} is not installed (pip install -e '.[bench]')"
    return None


# ----------------------------------------------------------------------------- systems


class Floor:
    """The physical floor: one INSERT + COMMIT per step."""

    def __init__(self, db: str, url: str) -> None:
        self.db = db
        self.url = url
        self.conn: Any = None
        if db == "postgresql":
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, "
                    "run_id text NOT NULL, position integer NOT NULL, output text)"
                )
        else:
            conn = self._connect()
            conn.execute(
                "CREATE TABLE IF NOT EXISTS bench_floor (id integer PRIMARY KEY "
                "AUTOINCREMENT, run_id text NOT NULL, position integer NOT NULL, "
                "output text)"
            )
            conn.commit()
            conn.close()

    def _connect(self) -> Any:
        if self.db == "postgresql":
            import psycopg

            return psycopg.connect(self.url)
        import sqlite3

        conn = sqlite3.connect(self.url)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def rep(self, runs: int, steps: int, **_: Any) -> None:
        if self.conn is None:
            self.conn = self._connect()
        conn = self.conn
        sql = (
            "INSERT INTO bench_floor (run_id, position, output) VALUES (%s, %s, %s)"
            if self.db == "postgresql"
            else "INSERT INTO bench_floor (run_id, position, output) VALUES (?, ?, ?)"
        )
        for _ in range(runs):
            run_id = uuid.uuid4().hex
            for pos in range(steps):
                conn.execute(sql, (run_id, pos, "null"))
                conn.commit()

    def quiesce(self) -> dict[str, Any]:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        return {"keep": 0}

    tables_sql = "c.relname = 'bench_floor'"


class Durable:
    def __init__(self, db: str, url: str) -> None:
        from django.core.management import call_command

        from .common import setup_django

        setup_django()
        call_command("migrate", verbosity=0, interactive=False)
        import durable  # noqa: F401
        from durable import registry

        registry.get_workflow("bench.noop")  # the bench workflows are registered
        from .workflows import batched_reason

        #: why ``durability="batched"`` cannot be measured here (None: it can)
        self.batched_reason = batched_reason()
        self.tx = {"read": 0, "write": 0}
        self._install_counter()

    def _install_counter(self) -> None:
        """Count transactions by kind from the client side: a statement in autocommit is
        a transaction of its own; an atomic block is one transaction, a write one if any
        of its statements writes. (``pg_stat_database.xact_commit`` counts both kinds.)"""
        import re

        from django.db import connections
        from django.db.backends.signals import connection_created

        writes = re.compile(r"\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
        tx = self.tx

        # what each statement text is, worked out once per text: the counter is the
        # bench's instrument, and scanning a hot statement's 1.5 KB at every step was
        # charged to Durable's step (~5 us)
        kinds: dict[str, tuple[bool, bool]] = {}

        def classify(sql: str) -> tuple[bool, bool]:
            """``(is_write, is_savepoint)`` of ``sql``."""
            found = kinds.get(sql)
            if found is None:
                head = sql.lstrip()[:20].upper()
                found = (
                    bool(writes.search(sql))
                    and not head.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK")),
                    head.startswith(("SAVEPOINT", "RELEASE SAVEPOINT")),
                )
                if len(kinds) < 10_000:
                    kinds[sql] = found
            return found

        def wrapper(execute, sql, params, many, context):
            conn = context["connection"]
            is_write, savepoint = classify(sql or "")
            if savepoint:
                return execute(sql, params, many, context)
            if not conn.in_atomic_block:
                tx["write" if is_write else "read"] += 1
            else:
                state = conn.__dict__.setdefault("_bench_tx", {"open": False, "write": False})
                if is_write:
                    state["write"] = True
                if not state["open"]:
                    state["open"] = True

                    def done() -> None:
                        tx["write" if state["write"] else "read"] += 1
                        state["open"] = False
                        state["write"] = False

                    conn.on_commit(done)
            return execute(sql, params, many, context)

        def install(sender, connection, **_: Any) -> None:
            if wrapper not in connection.execute_wrappers:
                connection.execute_wrappers.append(wrapper)

        connection_created.connect(install, weak=False)
        for conn in connections.all(initialized_only=True):
            install(None, conn)

    def tx_counts(self) -> dict[str, int]:
        return dict(self.tx)

    def rep(
        self,
        runs: int,
        steps: int,
        workflow: str = "noop",
        sleep: float = 0,
        durability: str = "",
        **_: Any,
    ) -> None:
        import durable
        from durable.worker.engine import execute

        inp: dict[str, Any] = {"steps": steps}
        if sleep:
            inp["sleep"] = sleep
        if durability:
            inp["durability"] = durability
        for _ in range(runs):
            run = durable.start(f"bench.{workflow}", inp)
            status = execute(run.id, worker_id="bench")
            if status != "succeeded":
                raise RuntimeError(f"run {run.id} ended {status}")

    def quiesce(self) -> dict[str, Any]:
        from django.db import connections

        connections.close_all()
        return {"keep": 0}

    tables_sql = "c.relname LIKE 'durable\\_%'"


class Dbos:
    def __init__(self, db: str, url: str) -> None:
        from dbos import DBOS

        sys_url = url if db == "postgresql" else f"sqlite:///{url}"
        DBOS(config={"name": "bench", "system_database_url": sys_url, "log_level": "WARNING"})

        @DBOS.step()
        def noop_step() -> None:
            return None

        @DBOS.workflow()
        def noop_workflow(n: int) -> int:
            for _ in range(n):
                noop_step()
            return n

        self.dbos = DBOS
        self.workflow = noop_workflow
        DBOS.launch()

    def rep(self, runs: int, steps: int, **_: Any) -> None:
        for _ in range(runs):
            if self.workflow(steps) != steps:
                raise RuntimeError("DBOS workflow returned a wrong value")

    def quiesce(self) -> dict[str, Any]:
        from dbos._dbos import _get_dbos_instance

        # any failure is fine: terminating the backends is enough
        with contextlib.suppress(Exception):
            _get_dbos_instance()._sys_db.engine.dispose()
        # background threads (queue polling, notifications) hold connections: terminate
        return {"keep": 0, "terminate": True}

    def close(self) -> None:
        self.dbos.destroy()

    tables_sql = "n.nspname = 'dbos'"


class _LGState(TypedDict):
    i: int
    n: int


def _lg_step(state: _LGState) -> dict[str, int]:
    return {"i": state["i"] + 1}


def _lg_route(state: _LGState) -> str:
    return "step" if state["i"] < state["n"] else "__end__"


class LangGraph:
    def __init__(self, db: str, url: str) -> None:
        self.db = db
        self.url = url
        self.conn: Any = None
        self.graph: Any = None
        self._open()
        self.saver.setup()

    def _open(self) -> None:
        from langgraph.graph import END, START, StateGraph

        if self.db == "postgresql":
            import psycopg
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg.rows import dict_row

            self.conn = psycopg.connect(
                self.url, autocommit=True, prepare_threshold=0, row_factory=dict_row
            )
            self.saver = PostgresSaver(self.conn)
        else:
            import sqlite3

            from langgraph.checkpoint.sqlite import SqliteSaver

            self.conn = sqlite3.connect(self.url, check_same_thread=False)
            self.saver = SqliteSaver(self.conn)

        builder = StateGraph(_LGState)
        builder.add_node("step", _lg_step)
        builder.add_conditional_edges(START, _lg_route, ["step", END])
        builder.add_conditional_edges("step", _lg_route, ["step", END])
        self.graph = builder.compile(checkpointer=self.saver)

    def rep(self, runs: int, steps: int, **_: Any) -> None:
        if self.conn is None:
            self._open()
        for _ in range(runs):
            config = {
                "configurable": {"thread_id": uuid.uuid4().hex},
                "recursion_limit": steps + 10,
            }
            out = self.graph.invoke({"i": 0, "n": steps}, config, durability="sync")
            if out["i"] != steps:
                raise RuntimeError("LangGraph graph returned a wrong value")

    def quiesce(self) -> dict[str, Any]:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        return {"keep": 0}

    tables_sql = "c.relname LIKE 'checkpoint%'"


IMPLS = {"floor": Floor, "durable": Durable, "dbos": Dbos, "langgraph": LangGraph}


def tables_sql(system: str) -> str:
    return IMPLS[system].tables_sql


# ------------------------------------------------------------------------------ server


def _profile(
    impl: Any, runs: int, steps: int, workflow: str = "noop", top: int = 25
) -> dict[str, Any]:
    """One repetition under pyinstrument: the call tree and the top self-time functions."""
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0002)
    t0 = time.perf_counter()
    profiler.start()
    impl.rep(runs, steps, workflow=workflow)
    profiler.stop()
    seconds = time.perf_counter() - t0
    session = profiler.last_session
    root = session.root_frame()
    steps_total = runs * steps
    selfs: dict[str, float] = {}
    inclusive: dict[str, float] = {}
    stack = [(root, frozenset())] if root is not None else []
    while stack:
        frame, above = stack.pop()
        if frame.is_synthetic:
            continue
        key = f"{frame.function} ({frame.file_path_short}:{frame.line_no})"
        if key not in above:  # count a recursive function once per call path
            inclusive[key] = inclusive.get(key, 0.0) + frame.time
        selfs[key] = selfs.get(key, 0.0) + frame.total_self_time
        below = above | {key}
        stack.extend((child, below) for child in frame.children)
    total = sum(selfs.values()) or 1.0

    def table(values: dict[str, float], keep: Any) -> list[dict[str, Any]]:
        return [
            {"function": k, "ms_per_step": v / steps_total * 1000, "share": v / total}
            for k, v in sorted(values.items(), key=lambda kv: -kv[1])
            if keep(k)
        ][:top]

    top_self = table(selfs, lambda k: True)
    top_durable = table(inclusive, lambda k: "durable/" in k or "durable\\" in k)
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    return {
        "seconds": seconds,
        "steps": steps_total,
        "tree": text,
        "top_self": top_self,
        "top_durable": top_durable,
        "sampled_seconds": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint")
    parser.add_argument("--system", choices=SYSTEMS, required=True)
    parser.add_argument("--db", choices=("sqlite", "postgresql"), required=True)
    parser.add_argument("--url", required=True, help="database URL, or SQLite file path")
    args = parser.parse_args()
    t0 = time.perf_counter()
    impl = IMPLS[args.system](args.db, args.url)
    impl.rep(2, 3)  # warm up: imports, prepared statements, connection
    hello: dict[str, Any] = {"ready": True, "setup_seconds": time.perf_counter() - t0}
    hello["pid"] = os.getpid()
    if hasattr(impl, "batched_reason"):
        hello["batched_reason"] = impl.batched_reason
    emit(hello)

    def rep(runs: int, steps: int, **kwargs: Any) -> dict[str, Any]:
        t = time.perf_counter()
        impl.rep(runs, steps, **kwargs)
        seconds = time.perf_counter() - t
        return {"seconds": seconds, "steps": runs * steps, "runs": runs}

    serve(
        {
            "rep": rep,
            "quiesce": impl.quiesce,
            "tx_counts": lambda: getattr(impl, "tx_counts", dict)(),
            "profile": lambda **kw: _profile(impl, **kw),
        }
    )
    close = getattr(impl, "close", None)
    if close is not None:
        close()


if __name__ == "__main__":
    main()
