"""The run page draws a LangGraph run's graph: nodes in layers from start, conditional
and back edges, and what each node did in this run (issue 31, item 3)."""

from __future__ import annotations

import re

import pytest

import durable
from durable.contrib.langgraph.drawing import END, START, _layers, graph_drawing
from durable.models import RunStatus
from durable.testing import drive
from tests.dashboard.conftest import login, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def _nodes(page: str) -> dict[str, str]:
    """node label -> state class, from the page's SVG."""
    found = re.findall(r'<g class="graph-node node-([a-z]+)"><title>([^:<]+):', page)
    return {label: state for state, label in found}


def test_a_finished_chain_draws_every_node_as_ran_once(lg_workflows):
    run = drive(durable.start("lg.chain", {"log": ["in"]}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    drawing = graph_drawing(run)
    assert drawing is not None
    assert drawing.layers == {START: 0, "a": 1, "b": 2, "c": 3, "d": 4, END: 5}
    states = {n.name: (n.state, n.visits) for n in drawing.nodes}
    assert states == {
        START: ("start", 0),
        "a": ("ran", 1),
        "b": ("ran", 1),
        "c": ("ran", 1),
        "d": ("ran", 1),
        END: ("end", 0),
    }
    viewer = login(make_user("vera", "viewer"))
    page = viewer.get(f"/runs/{run.id}/").content.decode()
    assert 'id="graph-title"' in page
    assert _nodes(page) == {
        "start": "start",
        "a": "ran",
        "b": "ran",
        "c": "ran",
        "d": "ran",
        "end": "end",
    }
    assert "<svg" in page and "graph-edge" in page


def test_a_waiting_interrupt_is_drawn_where_the_run_waits(lg_workflows):
    run = drive(durable.start("lg.approval", {"action_details": "refund 5"}).id)
    assert run.status == RunStatus.WAITING, run.error
    drawing = graph_drawing(run)
    states = {n.name: n.state for n in drawing.nodes}
    assert states["approval"] in ("interrupted", "next")
    assert states["proceed"] == "not run" and states["cancel"] == "not run"
    assert {n.name for n in drawing.nodes} == {START, "approval", "proceed", "cancel", END}


def test_a_loop_is_a_back_edge_and_a_condition_a_dashed_edge(lg_workflows):
    from durable.contrib.langgraph.drawing import _layout
    from examples.langgraph_agent import build

    nodes, edges, width, height, layers = _layout(build().compile())
    assert layers == {START: 0, "model": 1, "tools": 2, END: 3}  # the end is last
    kinds = sorted((e.conditional, e.back) for e in edges)
    # start->model; model->tools and model->end by a condition; tools->model loops back
    assert kinds == [(False, False), (False, True), (True, False), (True, False)]
    for n in nodes:
        assert 0 <= n.x and n.x + 132 <= width and 0 <= n.y and n.y + 34 <= height


def test_a_loop_is_a_back_edge_not_a_deeper_layer():
    edges = [
        (START, "model", False),
        ("model", "tools", True),
        ("model", END, True),
        ("tools", "model", False),
    ]
    layers = _layers([START, "model", "tools", END], edges)
    assert layers == {START: 0, "model": 1, "tools": 2, END: 3}


def test_a_run_of_a_plain_workflow_has_no_graph_section(settings):
    from tests.dashboard import dash_workflows  # noqa: F401  (registers dash.echo)

    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    assert graph_drawing(run) is None
    viewer = login(make_user("vic", "viewer"))
    assert 'id="graph-title"' not in viewer.get(f"/runs/{run.id}/").content.decode()
