"""Graph workflows of the LangGraph contrib's tests (in-process and on real workers).

Node bodies append one line per execution to ``$CRASH_TEST_DIR/lg_nodes.jsonl`` (or to
``NODE_LOG`` in-process) so "ran exactly once" is counted across processes. A node
named in ``$LG_CRASH_AT`` (``node``) SIGKILLs its own worker the first time it runs
(a marker file keeps a second worker from doing it again).
"""

from __future__ import annotations

import json
import operator
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import durable
from durable.contrib.langgraph import call_tool, graph_workflow

NODE_LOG: list[dict[str, Any]] = []
#: nodes that raise a TransientError the first time they run (in-process tests)
FAIL_ONCE: set[str] = set()
REFUNDS: list[dict[str, Any]] = []


def _note(run: str, node: str, **extra: Any) -> None:
    line = {"node": node, "pid": os.getpid(), **extra}
    NODE_LOG.append(line)
    folder = os.environ.get("CRASH_TEST_DIR")
    if folder:
        with open(Path(folder) / "lg_nodes.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _maybe_crash(node: str) -> None:
    folder = os.environ.get("CRASH_TEST_DIR")
    if not folder or os.environ.get("LG_CRASH_AT") != node:
        return
    marker = Path(folder) / f"lg-crashed-{node}"
    if marker.exists():
        return
    marker.write_text("1")
    os.kill(os.getpid(), signal.SIGKILL)


class Steps(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answers: Annotated[list[Any], operator.add]
    refund: Any


def _node(name: str, pause: float = 0.0):
    def body(state: Steps) -> dict[str, Any]:
        _note("", name)
        if pause:
            time.sleep(pause)
        _maybe_crash(name)
        if name in FAIL_ONCE:
            FAIL_ONCE.discard(name)
            raise durable.TransientError(f"{name} failed once")
        return {"log": [name]}

    body.__name__ = name
    return body


def chain_graph() -> StateGraph:
    """a -> b -> c -> d, one node per super-step."""
    g = StateGraph(Steps)
    for name in "abcd":
        g.add_node(name, _node(name, pause=0.2 if name == "c" else 0.0))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", "d")
    g.add_edge("d", END)
    return g


graph_workflow("lg.chain", "1", chain_graph)


def _ask(key: str):
    def body(state: Steps) -> dict[str, Any]:
        _note("", f"ask-{key}")
        answer = interrupt({"question": f"question {key}?", "key": key})
        return {"answers": [{key: answer}]}

    body.__name__ = f"ask_{key}"
    return body


def two_questions_graph() -> StateGraph:
    """start -> (ask_x | ask_y) in one super-step -> end: two interrupts at once."""
    g = StateGraph(Steps)
    g.add_node("start", _node("start"))
    g.add_node("ask_x", _ask("x"))
    g.add_node("ask_y", _ask("y"))
    g.add_node("end", _node("end"))
    g.add_edge(START, "start")
    g.add_edge("start", "ask_x")
    g.add_edge("start", "ask_y")
    g.add_edge(["ask_x", "ask_y"], "end")
    g.add_edge("end", END)
    return g


graph_workflow("lg.two_questions", "1", two_questions_graph)


def plain_question_graph() -> StateGraph:
    g = StateGraph(Steps)

    def ask(state: Steps) -> dict[str, Any]:
        return {"answers": [interrupt("Ship it?")]}

    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


graph_workflow("lg.plain_question", "1", plain_question_graph)


def two_in_a_row_graph() -> StateGraph:
    """One node asks twice: the second question must get its own answer."""
    g = StateGraph(Steps)

    def ask(state: Steps) -> dict[str, Any]:
        first = interrupt({"question": "first?"})
        second = interrupt({"question": "second?"})
        return {"answers": [first, second]}

    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


graph_workflow("lg.two_in_a_row", "1", two_in_a_row_graph)


def refunds_made() -> list[dict[str, Any]]:
    """The refunds made so far: in this process, or in every worker (CRASH_TEST_DIR)."""
    folder = os.environ.get("CRASH_TEST_DIR")
    path = Path(folder) / "lg_refunds.jsonl" if folder else None
    if path is None:
        return list(REFUNDS)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _find_refund(params: dict[str, Any], *, idempotency_key: str) -> Any:
    for r in refunds_made():
        if r["key"] == idempotency_key:
            return r
    return durable.NOT_FOUND


@durable.tool(name="lg_refund", safety="unsafe_write", reconcile=_find_refund)
def lg_refund(charge: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    refund = {"charge": charge, "amount": amount, "key": idempotency_key}
    REFUNDS.append(refund)
    folder = os.environ.get("CRASH_TEST_DIR")
    if folder:
        with open(Path(folder) / "lg_refunds.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(refund) + "\n")
    return refund


def refund_graph() -> StateGraph:
    """plan -> pay (a ledger write through call_tool) -> after."""
    g = StateGraph(Steps)
    g.add_node("plan", _node("plan"))

    def pay(state: Steps) -> dict[str, Any]:
        _note("", "pay")
        result = call_tool("lg_refund", {"charge": "ch_1", "amount": 5})
        _note("", "pay-after-tool")
        _maybe_crash("pay")
        return {"refund": result, "log": ["pay"]}

    g.add_node("pay", pay)
    g.add_node("after", _node("after"))
    g.add_edge(START, "plan")
    g.add_edge("plan", "pay")
    g.add_edge("pay", "after")
    g.add_edge("after", END)
    return g


graph_workflow("lg.refund", "1", refund_graph)
