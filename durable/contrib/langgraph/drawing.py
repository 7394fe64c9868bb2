"""The drawing of a graph run for the dashboard's run page: the graph's nodes in layers,
its edges, and what each node did in this run.

The graph is the one :func:`~durable.contrib.langgraph.graph.graph_workflow` registered
for the run's workflow and version in this process (LangGraph's ``get_graph()``); a run
of another workflow, or of a graph this process does not have, has no drawing. Nodes are
layered by their distance from ``__start__`` (breadth first, so a loop back to an
earlier node is drawn as a back edge, not as a deeper layer). What a node did comes from
the run's super-step records (``superstep-<n>`` steps, their ``nodes`` and ``next``):
how many times it ran, whether it failed or was interrupted, whether it runs next. The
layout of a graph is computed once per process; a run reads at most
:data:`SUPERSTEPS_READ` records.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from durable.values import codec

#: super-step records read for one drawing (the first ones: a longer run says so)
SUPERSTEPS_READ = 500
#: the size of a node's box and the gaps between them, in SVG user units
NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 132, 34, 36, 46, 14

START, END = "__start__", "__end__"


@dataclass
class Node:
    name: str
    x: float
    y: float
    #: "start" / "end" (LangGraph's own), else "ran", "not run", "failed",
    #: "interrupted" or "next" (the run goes on there)
    state: str = "not run"
    visits: int = 0

    @property
    def cx(self) -> float:
        return self.x + NODE_W / 2

    @property
    def label(self) -> str:
        return {START: "start", END: "end"}.get(self.name, self.name)


@dataclass
class Edge:
    path: str
    conditional: bool
    back: bool


@dataclass
class Drawing:
    width: float
    height: float
    nodes: list[Node]
    edges: list[Edge]
    #: the run has more super-steps than were read
    cut: bool = False
    #: node name -> its layer, for tests and the text alternative
    layers: dict[str, int] = field(default_factory=dict)


_layouts: dict[tuple[str, str], tuple[list[Node], list[Edge], float, float, dict[str, int]]] = {}
_lock = threading.Lock()


def _layers(names: list[str], edges: list[tuple[str, str, bool]]) -> dict[str, int]:
    following: dict[str, list[str]] = {n: [] for n in names}
    for source, target, _ in edges:
        following.setdefault(source, []).append(target)
    depth = {START: 0} if START in following else {}
    queue = [START] if depth else []
    while queue:
        node = queue.pop(0)
        for target in following.get(node, []):
            if target not in depth:
                depth[target] = depth[node] + 1
                queue.append(target)
    deepest = max(depth.values(), default=0)
    for name in names:  # unreachable from start: below the rest, in their order
        depth.setdefault(name, deepest + 1)
    if END in depth:  # the end is always the last layer
        depth[END] = max(d for n, d in depth.items() if n != END) + 1
    return depth


def _layout(graph: Any) -> tuple[list[Node], list[Edge], float, float, dict[str, int]]:
    drawn = graph.get_graph()
    names = list(drawn.nodes)
    pairs = [(e.source, e.target, bool(e.conditional)) for e in drawn.edges]
    depth = _layers(names, pairs)
    rows: dict[int, list[str]] = {}
    for name in names:
        rows.setdefault(depth[name], []).append(name)
    widest = max(len(r) for r in rows.values()) if rows else 1
    width = MARGIN * 2 + widest * NODE_W + (widest - 1) * GAP_X + 40  # room for back edges
    nodes: dict[str, Node] = {}
    for layer, members in sorted(rows.items()):
        span = len(members) * NODE_W + (len(members) - 1) * GAP_X
        left = (width - 40 - span) / 2
        for i, name in enumerate(members):
            x = left + i * (NODE_W + GAP_X)
            y = MARGIN + layer * (NODE_H + GAP_Y)
            state = "start" if name == START else "end" if name == END else "not run"
            nodes[name] = Node(name, round(x, 1), round(y, 1), state)
    height = MARGIN * 2 + (max(rows) + 1) * NODE_H + max(rows) * GAP_Y if rows else 60
    edges = []
    for source, target, conditional in pairs:
        a, b = nodes.get(source), nodes.get(target)
        if a is None or b is None:
            continue
        back = depth[target] <= depth[source]
        if back:  # around the right side of the boxes
            x1, y1 = a.x + NODE_W, a.y + NODE_H / 2
            x2, y2 = b.x + NODE_W, b.y + NODE_H / 2
            bend = max(x1, x2) + 30
            path = (
                f"M{x1:.1f},{y1:.1f} C{bend:.1f},{y1:.1f} {bend:.1f},{y2:.1f} {x2 + 2:.1f},{y2:.1f}"
            )
        else:
            x1, y1, x2, y2 = a.cx, a.y + NODE_H, b.cx, b.y - 2
            middle = (y1 + y2) / 2
            path = (
                f"M{x1:.1f},{y1:.1f} C{x1:.1f},{middle:.1f} {x2:.1f},{middle:.1f} {x2:.1f},{y2:.1f}"
            )
        edges.append(Edge(path, conditional, back))
    return list(nodes.values()), edges, round(width, 1), round(height, 1), depth


def graph_drawing(run: Any) -> Drawing | None:
    """The :class:`Drawing` of ``run`` (a ``durable.models.Run``), or ``None`` when its
    workflow is not a graph workflow registered in this process."""
    from .graphs import _builders, compiled

    key = (run.workflow_name, str(run.workflow_version))
    builder = _builders.get(key)
    if builder is None:
        return None
    with _lock:
        layout = _layouts.get(key)
    if layout is None:
        layout = _layout(compiled(key[0], key[1], builder[0], builder[1]))
        with _lock:
            _layouts[key] = layout
    base, edges, width, height, depth = layout
    nodes = {n.name: Node(n.name, n.x, n.y, n.state) for n in base}
    visits: Counter[str] = Counter()
    failed: set[str] = set()
    interrupted: set[str] = set()
    following: list[str] = []
    records = _records(run)
    for record in records[:SUPERSTEPS_READ]:
        for entry in record.get("nodes") or []:
            name = str(entry.get("node"))
            visits[name] += 1
            if entry.get("error"):
                failed.add(name)
            elif entry.get("interrupted"):
                interrupted.add(name)
            else:
                failed.discard(name)
                interrupted.discard(name)
        following = [str(n) for n in record.get("next") or []]
    for name, node in nodes.items():
        if node.state in ("start", "end"):
            continue
        node.visits = visits.get(name, 0)
        if name in failed:
            node.state = "failed"
        elif name in interrupted and name in following:
            node.state = "interrupted"
        elif name in following and not run.is_terminal:
            node.state = "next"
        elif node.visits:
            node.state = "ran"
    return Drawing(
        width=width,
        height=height,
        nodes=list(nodes.values()),
        edges=edges,
        cut=len(records) > SUPERSTEPS_READ,
        layers=dict(depth),
    )


def _records(run: Any) -> list[dict[str, Any]]:
    from durable.models import Step

    outputs = (
        Step.objects.filter(run=run, step_id__startswith="superstep-")
        .exclude(output=None)
        .order_by("position")
        .values_list("output", flat=True)[: SUPERSTEPS_READ + 1]
    )
    records = []
    for text in outputs:
        try:
            value = codec.decode_for_display(text)
        except (ValueError, TypeError):
            continue
        if isinstance(value, dict):
            records.append(value)
    return records
