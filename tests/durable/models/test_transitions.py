"""The run state machine: the declared table, how it is applied, and that it is the only
writer of ``Run.status``.

The table is pinned against an independent copy of the rules (legal transitions are
declared once), for the operator's actions and the engine's own. ``apply`` and
``update`` are checked against that copy for every action and source status, and a
static test fails when a module moves a run's status or spells out the lease release
outside ``durable/models/transitions.py``. How each service obeys the table is tested in
``tests/approvals/test_transitions.py`` (it needs the approval flows).
"""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from durable.exceptions import IllegalTransition
from durable.models import Run, RunStatus, transitions

S = RunStatus
ACTIVE = {S.PENDING, S.RUNNING, S.RETRYING, S.WAITING}
FINISHED = {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.COMPENSATED, S.COMPENSATION_FAILED}
LEASE = {"lease_token": "", "lease_owner": "", "lease_expires_at": None}

#: the rules, written out independently of durable/models/transitions.py:
#: action -> (sources, target, {source: other target}, releases the lease)
EXPECTED: dict[str, tuple[set[str], str | None, dict[str, str | None], bool]] = {
    # the operator's
    "cancel": (ACTIVE, S.CANCELLED, {}, False),
    "compensate": ({S.FAILED, S.CANCELLED, S.COMPENSATION_FAILED}, S.COMPENSATING, {}, False),
    "compensate_child": (
        {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.COMPENSATION_FAILED},
        S.COMPENSATING,
        {},
        False,
    ),
    "resume": ({S.FAILED}, S.PENDING, {}, False),
    "fork": (FINISHED, None, {}, False),
    "signal": (ACTIVE, None, {}, False),
    "decide": (ACTIVE, None, {}, False),
    "reconcile": ({S.WAITING}, S.PENDING, {}, False),
    "settle": ({S.COMPENSATING} | FINISHED, None, {}, False),
    "abort": (
        {S.WAITING, S.COMPENSATING},
        S.FAILED,
        {S.COMPENSATING: S.COMPENSATION_FAILED},
        False,
    ),
    # the engine's
    "claim": (
        {S.PENDING, S.RETRYING, S.RUNNING, S.COMPENSATING},
        S.RUNNING,
        {S.COMPENSATING: None},
        False,
    ),
    "park": ({S.RUNNING}, S.WAITING, {}, True),
    "schedule_retry": ({S.RUNNING, S.COMPENSATING}, S.RETRYING, {S.COMPENSATING: None}, True),
    "fail": ({S.RUNNING, S.COMPENSATING}, S.FAILED, {S.COMPENSATING: S.COMPENSATION_FAILED}, True),
    "complete": ({S.RUNNING, S.COMPENSATING}, S.SUCCEEDED, {S.COMPENSATING: S.COMPENSATED}, True),
    "exceed_deadline": ({S.PENDING, S.RETRYING, S.WAITING}, S.FAILED, {}, False),
    "wake": ({S.WAITING}, S.PENDING, {}, False),
    "release": ({S.RUNNING, S.COMPENSATING}, S.PENDING, {S.COMPENSATING: None}, True),
    "release_stopped": (set(RunStatus.values) - {S.RUNNING, S.COMPENSATING}, None, {}, True),
}
OPERATOR = {
    "cancel",
    "compensate",
    "compensate_child",
    "resume",
    "fork",
    "signal",
    "decide",
    "reconcile",
    "settle",
    "abort",
}
CASES = [(action, status) for action in EXPECTED for status in RunStatus.values]


def expected_target(action: str, source: str) -> str | None:
    _, target, by_source, _ = EXPECTED[action]
    return by_source.get(source, target)


def test_the_table_declares_exactly_the_expected_actions_and_targets():
    assert set(transitions.TRANSITIONS) == set(EXPECTED)
    assert transitions.OPERATOR_ACTIONS == OPERATOR
    for action, (sources, target, by_source, releases) in EXPECTED.items():
        row = transitions.TRANSITIONS[action]
        assert set(row.sources) == sources, action
        assert transitions.target(action) == target, action
        assert dict(row.by_source) == by_source, action
        assert row.releases_lease is releases, action
    # a compensating run only takes an operator's decision on an unknown outcome
    assert [
        a
        for a in EXPECTED
        if a in OPERATOR and S.COMPENSATING in transitions.TRANSITIONS[a].sources
    ] == ["settle", "abort"]
    assert dict(transitions.LEASE_RELEASED) == LEASE


@pytest.mark.parametrize(("action", "status"), CASES)
def test_can_matches_the_table(action, status):
    allowed = status in EXPECTED[action][0]
    assert transitions.can(action, status) is allowed
    run = Run(id="x", status=status)
    assert transitions.can(action, run) is allowed
    if not allowed:
        with pytest.raises(IllegalTransition, match=f"cannot {action} run x: it is {status}"):
            transitions.check(action, run)


def _leased_run(status: str, *, pk: str = "x") -> Run:
    now = timezone.now()
    return Run(
        id=pk,
        workflow_name="wf",
        workflow_version="1",
        input_hash="h",
        status=status,
        lease_token="t" * 32,
        lease_owner="w",
        lease_expires_at=now + timedelta(minutes=5),
        wake_at=now + timedelta(minutes=5),
    )


@pytest.mark.parametrize(("action", "status"), CASES)
def test_apply_sets_the_target_and_the_lease_or_refuses(action, status):
    run = _leased_run(status)
    if status not in EXPECTED[action][0]:
        with pytest.raises(IllegalTransition, match=f"it is {status}"):
            transitions.apply(action, run, claims=7)
        assert run.status == status and run.lease_token and run.claims == 0
        return
    target = expected_target(action, status)
    written = transitions.apply(action, run, claims=7)
    expected = {
        "claims": 7,
        **({"status": target} if target is not None else {}),
        **(LEASE if EXPECTED[action][3] else {}),
    }
    assert written == expected
    assert run.status == (target if target is not None else status) and run.claims == 7
    assert (run.lease_token == "") is EXPECTED[action][3]


@pytest.mark.django_db
@pytest.mark.parametrize(("action", "status"), CASES)
def test_update_is_a_compare_and_set_on_the_sources(action, status):
    run = _leased_run(status, pk="cas")
    run.save()
    later = timezone.now() + timedelta(hours=1)
    moved = transitions.update(action, Run.objects.filter(pk=run.pk), updated_at=later)
    after = Run.objects.get(pk=run.pk)
    if status not in EXPECTED[action][0]:
        assert moved == 0
        assert (after.status, after.lease_token, after.updated_at) == (
            status,
            "t" * 32,
            run.updated_at,
        )
        return
    target = expected_target(action, status)
    assert moved == 1
    assert after.status == (target if target is not None else status)
    assert after.updated_at == later
    assert (after.lease_token == "" and after.lease_expires_at is None) is EXPECTED[action][3]


def test_update_limited_to_one_source():
    with pytest.raises(ValueError, match="not a source"):
        transitions.update("release", Run.objects.none(), source=S.PENDING)


# ------------------------------------------------- the table is the only writer

ROOT = Path(__file__).resolve().parents[3]


def _modules():
    for package in ("durable", "approvals"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel or rel == "durable/models/transitions.py":
                continue
            yield rel, ast.parse(path.read_text(), filename=rel)


def _is_run_status(node: ast.AST) -> bool:
    """``RunStatus.X`` (or ``S.X``, the modules' alias)."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("RunStatus", "S")
        and node.attr.isupper()
    )


def _status_writes(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        # run.status = RunStatus.X
        if (
            isinstance(node, ast.Assign)
            and _is_run_status(node.value)
            and any(isinstance(t, ast.Attribute) and t.attr == "status" for t in node.targets)
        ):
            lines.append(node.lineno)
        # qs.update(status=RunStatus.X)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
        ):
            lines += [
                node.lineno
                for kw in node.keywords
                if kw.arg == "status" and _is_run_status(kw.value)
            ]
        # {"status": RunStatus.X, ...} (fields for an update or a save)
        if isinstance(node, ast.Dict):
            lines += [
                node.lineno
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value == "status" and _is_run_status(v)
            ]
    return lines


def _lease_releases(tree: ast.AST) -> list[int]:
    """``lease_token=""`` in an update, a dict or an assignment: the lease given back by
    hand (a filter on it is no release)."""
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
        ):
            lines += [
                node.lineno
                for kw in node.keywords
                if kw.arg == "lease_token"
                and isinstance(kw.value, ast.Constant)
                and kw.value.value == ""
            ]
        if isinstance(node, ast.Dict):
            lines += [
                node.lineno
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant)
                and k.value == "lease_token"
                and isinstance(v, ast.Constant)
                and v.value == ""
            ]
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and node.value.value == ""
            and any(isinstance(t, ast.Attribute) and t.attr == "lease_token" for t in node.targets)
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_moves_a_run_status_outside_the_table():
    found = {rel: lines for rel, tree in _modules() if (lines := _status_writes(tree))}
    assert found == {}, (
        "write the status through durable.models.transitions.apply() or update(), not by hand"
    )


def test_no_module_spells_out_the_lease_release():
    found = {rel: lines for rel, tree in _modules() if (lines := _lease_releases(tree))}
    assert found == {}, "give the lease back with durable.models.transitions.LEASE_RELEASED"


def test_the_static_checks_see_a_hand_written_move():
    tree = ast.parse(
        "run.status = RunStatus.FAILED\n"
        "Run.objects.filter(pk=1).update(status=S.WAITING, lease_token='')\n"
        "fields = {'status': RunStatus.PENDING, 'lease_token': ''}\n"
        "run.lease_token = ''\n"
        "Run.objects.filter(status=S.RUNNING).exclude(lease_token='')\n"
    )
    assert sorted(_status_writes(tree)) == [1, 2, 3]
    assert sorted(_lease_releases(tree)) == [2, 3, 4]
