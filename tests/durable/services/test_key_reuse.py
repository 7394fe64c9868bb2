"""A key a caller chooses names one request (durable/idempotency.py, S33): the same key
with the same content answers as the first time; with other content it is refused with
a KeyConflict naming the key, and nothing more is stored.

The Hypothesis property checks "the same content" against an oracle of its own: a copy
of the payload with its dict keys in another order is the same request; a payload
changed in a way its stored form keeps (``1`` to ``1.0``, ``True`` to ``1``, a tuple to a
list, one more key) is another.
"""

from __future__ import annotations

import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durable
from durable.exceptions import IdempotencyConflict, KeyConflict, RunInputConflict
from durable.idempotency import check_same, conflict, stored_fingerprint
from durable.models import Run, RunStatus, Signal
from durable.testing import drive
from durable.values import codec
from tests import waits_workflows, workflows  # noqa: F401  (register the workflows)
from tests.durable.runtime import child_workflows  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_run():
    run = drive(durable.start("tests.signal", {}).id)
    assert run.status == RunStatus.WAITING, run.error
    return run


def test_s33_a_dedupe_key_reused_with_another_payload_is_a_conflict():
    """evt-1 with {"amount": 10}, then evt-1 with {"amount": 99}: refused, naming the key;
    the 10 stays the one signal; the first content again is a duplicate."""
    run = waiting_run()
    first = durable.signal(run.id, "go", {"amount": 10}, dedupe_key="evt-1")
    assert not first.duplicate and first.delivered
    with pytest.raises(KeyConflict) as caught:
        durable.signal(run.id, "go", {"amount": 99}, dedupe_key="evt-1")
    assert caught.value.key == "evt-1" and caught.value.differs == "payload"
    assert "signal dedupe key 'evt-1'" in str(caught.value)
    assert "different payload" in str(caught.value)
    (stored,) = Signal.objects.filter(run=run)
    assert codec.decode(stored.payload) == {"amount": 10}
    again = durable.signal(run.id, "go", {"amount": 10}, dedupe_key="evt-1")
    assert again.duplicate and again.pk == first.pk
    assert drive(run.id).output_value() == {"got": {"amount": 10}}


def test_a_dedupe_key_reused_for_another_signal_name_is_a_conflict():
    run = waiting_run()
    durable.signal(run.id, "later", "x", dedupe_key="k")
    with pytest.raises(KeyConflict, match="different name") as caught:
        durable.signal(run.id, "go", "x", dedupe_key="k")
    assert caught.value.differs == "name"
    assert Signal.objects.filter(run=run).count() == 1
    # a key is per run: another run may use it for anything
    other = waiting_run()
    assert not durable.signal(other.id, "go", "y", dedupe_key="k").duplicate


def test_cli_signal_with_a_reused_key_names_it():
    run = waiting_run()
    durable.signal(run.id, "go", {"amount": 10}, dedupe_key="evt-1")
    with pytest.raises(CommandError, match="signal dedupe key 'evt-1'"):
        call_command(
            "durable",
            "signal",
            run.id,
            "go",
            "--payload",
            '{"amount": 99}',
            "--dedupe-key",
            "evt-1",
            stdout=StringIO(),
            stderr=StringIO(),
        )
    assert Signal.objects.filter(run=run).count() == 1


def test_a_secret_payload_repeated_is_the_same_request():
    """Secrets are stored encrypted (a new token each time): compared by keyed digest."""
    run = waiting_run()
    payload = {"api_key": "sk-live-123", "n": [1, (2, 3)]}
    durable.signal(run.id, "later", payload, dedupe_key="s")
    stored = Signal.objects.get(run=run).payload
    assert "sk-live-123" not in stored  # encrypted, so the texts of two sends differ
    again = durable.signal(run.id, "later", dict(reversed(payload.items())), dedupe_key="s")
    assert again.duplicate
    with pytest.raises(KeyConflict):
        durable.signal(run.id, "later", {**payload, "api_key": "sk-live-124"}, dedupe_key="s")


def test_the_existing_conflicts_are_key_conflicts_with_their_own_words():
    """run id on start and the ledger's idempotency key keep their messages."""
    run_conflict = RunInputConflict("r-1", "input")
    assert isinstance(run_conflict, KeyConflict) and run_conflict.differs == "input"
    assert str(run_conflict).startswith("run r-1 already exists with a different input")
    ledger = IdempotencyConflict("r:step")
    assert isinstance(ledger, KeyConflict) and ledger.key == "r:step"
    assert conflict({"a": 1, "b": 2}, {"a": 1, "b": 2}) is None
    assert conflict({"a": 1, "b": 2}, {"a": 1, "b": 3}) == "b"
    with pytest.raises(KeyConflict, match="fork run id 'f' was already used with a different"):
        check_same("fork run id", "f", {"from_step": "a"}, {"from_step": "b"})


# --- the property: key x content ----------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
contents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.text(max_size=4), children, max_size=4),
    ),
    max_leaves=8,
)


def reordered(value: Any) -> Any:
    """The same value with every dict's keys in reverse order (a new object)."""
    if type(value) is dict:
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if type(value) is list:
        return [reordered(v) for v in value]
    if type(value) is tuple:
        return tuple(reordered(v) for v in value)
    return value


def changed(value: Any) -> Any:
    """Another value, by a change the stored form keeps: types count."""
    t = type(value)
    if t is bool:
        return int(value)  # True -> 1
    if t is int:
        return float(value) if abs(value) < 2**53 else value + 1  # 1 -> 1.0
    if t is float:
        return value + 1.0 if value + 1.0 != value else value / 2
    if t is str:
        return value + "x"
    if value is None:
        return 0
    if t is tuple:
        return list(value)
    if t is list:
        return [*value, None]
    return {**value, "\x01extra": None}


SIGNAL_PROPERTY = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SIGNAL_PROPERTY
@given(content=contents, same=st.booleans(), key=st.text(min_size=1, max_size=20))
def test_a_reused_key_is_a_duplicate_exactly_when_the_stored_content_is_equal(content, same, key):
    run = durable.start("tests.signal", {})  # pending: signals are kept in its mailbox
    key = f"{key}-{uuid.uuid4().hex[:8]}"
    first = durable.signal(run.id, "go", content, dedupe_key=key)
    again_content = reordered(content) if same else changed(content)
    assert (codec.fingerprint(again_content) == codec.fingerprint(content)) is same  # oracle
    if same:
        again = durable.signal(run.id, "go", again_content, dedupe_key=key)
        assert again.duplicate and again.pk == first.pk
    else:
        with pytest.raises(KeyConflict) as caught:
            durable.signal(run.id, "go", again_content, dedupe_key=key)
        assert caught.value.key == key and caught.value.differs == "payload"
    (stored,) = Signal.objects.filter(run=run, dedupe_key=key)
    assert stored_fingerprint(stored.payload) == codec.fingerprint(content)


@SIGNAL_PROPERTY
@given(content=contents, same=st.booleans())
def test_a_reused_run_id_returns_the_run_exactly_when_the_stored_input_is_equal(content, same):
    """The same rule on start: run_id is the key, the workflow's input the content."""
    run_id = f"r-{uuid.uuid4().hex[:12]}"
    first = durable.start("tests.signal", content, run_id=run_id)
    again_content = reordered(content) if same else changed(content)
    if same:
        assert durable.start("tests.signal", again_content, run_id=run_id).pk == first.pk
    else:
        with pytest.raises(RunInputConflict) as caught:
            durable.start("tests.signal", again_content, run_id=run_id)
        assert caught.value.key == run_id and caught.value.differs == "input"
    assert Run.objects.get(pk=run_id).input_hash == codec.fingerprint(content)


def test_a_fork_run_id_names_one_fork():
    """The SDK: the same fork again returns it; another step under the id is refused."""
    source = drive(durable.start("tests.add_twice", {"a": 1, "b": 2}).id)
    assert source.status == RunStatus.SUCCEEDED, source.error
    fork = durable.fork(source.id, from_step="second", by="ops", new_run_id="f-1")
    assert fork.id == "f-1" and fork.forked_from_id == source.id
    again = durable.fork(source.id, from_step="second", by="ops", new_run_id="f-1")
    assert again.id == "f-1" and again.steps.count() == 1
    with pytest.raises(KeyConflict, match="fork run id 'f-1'") as caught:
        durable.fork(source.id, from_step="first", by="ops", new_run_id="f-1")
    assert caught.value.differs == "from_step"
    with pytest.raises(ValueError, match="new_run_id 'bad id' is not valid"):
        durable.fork(source.id, from_step="second", new_run_id="bad id")


def test_a_child_id_replayed_with_another_input_fails_the_parent_naming_it():
    """A replay asks for child 'a' with another input than it was started with: the
    recorded handle is not handed back as if it were that child."""
    run = durable.start("tests.children.parent", {"items": [{"n": 1, "id": "a"}]})
    assert drive(run.id).status == RunStatus.WAITING
    # executed again (as after a lost worker), the parent now asks 'a' for n=2
    changed_input = codec.encode({"items": [{"n": 2, "id": "a"}]})
    Run.objects.filter(pk=run.id).update(status=RunStatus.PENDING, input=changed_input)
    root = drive(run.id)
    assert root.status == RunStatus.FAILED
    assert "child_id 'a' was already used with a different input" in root.error["message"]
    assert Run.objects.filter(parent_run=run).count() == 1


def test_a_child_of_the_run_made_with_other_input_is_a_conflict_naming_the_child_id():
    run = durable.start("tests.children.parent", {"items": [{"n": 2, "id": "a"}]})
    early = durable.start("tests.children.leaf", {"n": 3, "id": "a"}, run_id=f"{run.id}.a")
    Run.objects.filter(pk=early.id).update(parent_run=run)
    root = drive(run.id)
    assert root.status == RunStatus.FAILED
    assert "child_id 'a' was already used with a different input" in root.error["message"]
    assert list(Run.objects.filter(parent_run=run).values_list("id", flat=True)) == [early.id]
