"""Dispatch is a backend named by ``DURABLE['DISPATCH']``: aliases, dotted paths, the
system check, and the engine's and the sweeper's hints going through the backend."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import ClassVar

import pytest
from django.utils import timezone

import durable
from durable.checks import check_durable
from durable.dispatch import (
    MAX_COUNTDOWN_SECONDS,
    Dispatcher,
    ManualDispatcher,
    dispatch_now,
    dispatch_on_commit,
    get_dispatcher,
)
from durable.exceptions import DurableConfigurationError
from durable.models import Run
from durable.worker.sweeper import sweep
from durable.worker.tasks import CeleryDispatcher
from tests import workflows  # noqa: F401  (registers tests.add_twice)

pytestmark = pytest.mark.django_db


class Recording(Dispatcher):
    """Keeps what it was asked to send."""

    sent: ClassVar[list[tuple[str, float | None]]] = []

    def send(self, run_id: str, countdown: float | None) -> None:
        Recording.sent.append((run_id, countdown))


class Broken(Dispatcher):
    def send(self, run_id: str, countdown: float | None) -> None:
        raise ConnectionError("broker down")


class NotADispatcher:
    pass


@pytest.fixture
def recording(settings):
    Recording.sent = []
    settings.DURABLE = {**settings.DURABLE, "DISPATCH": f"{__name__}.Recording"}
    return Recording.sent


def use(settings, value) -> None:
    settings.DURABLE = {**settings.DURABLE, "DISPATCH": value}


def dispatch_errors() -> list:
    return [m for m in check_durable() if m.id == "durable.E002"]


def test_aliases_and_dotted_paths_name_a_backend_loaded_once(settings):
    use(settings, "manual")
    assert type(get_dispatcher()) is ManualDispatcher
    assert get_dispatcher() is get_dispatcher()
    use(settings, "celery")
    assert type(get_dispatcher()) is CeleryDispatcher
    use(settings, "durable.worker.tasks.CeleryDispatcher")
    assert type(get_dispatcher()) is CeleryDispatcher
    use(settings, f"{__name__}.Recording")
    assert type(get_dispatcher()) is Recording


def test_a_bad_setting_is_a_system_check_error_naming_setting_and_value(settings):
    use(settings, "manual")
    assert dispatch_errors() == []
    use(settings, f"{__name__}.Recording")
    assert dispatch_errors() == []
    for bad in ("rabbit", "durable.nowhere.Dispatcher", f"{__name__}.NotADispatcher", 42):
        use(settings, bad)
        [error] = dispatch_errors()
        assert "DURABLE['DISPATCH']" in error.msg and repr(bad) in error.msg
        with pytest.raises(DurableConfigurationError):
            get_dispatcher()


def test_a_start_is_sent_through_the_backend_on_commit(
    recording, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        run = durable.start("tests.add_twice", {"a": 1, "b": 2})
        assert recording == []  # not before the commit
    assert recording == [(run.id, None)]


def test_dispatch_marks_the_run_and_leaves_far_countdowns_to_the_sweeper(
    recording, django_capture_on_commit_callbacks
):
    run = durable.start("tests.add_twice", {"a": 1, "b": 2})
    Run.objects.filter(pk=run.id).update(dispatched_at=None)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_on_commit(run.id, countdown=MAX_COUNTDOWN_SECONDS + 1)
    assert recording == [] and Run.objects.get(pk=run.id).dispatched_at is None
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_on_commit(run.id, countdown=2.0)
    assert recording == [(run.id, 2.0)]
    assert Run.objects.get(pk=run.id).dispatched_at is not None


def test_dispatch_marks_the_time_by_the_shared_clock(
    recording, django_capture_on_commit_callbacks, monkeypatch
):
    """The sweeper compares ``dispatched_at`` with the shared clock (durable/clock.py):
    written by this host's wall clock, an hour ahead, a lost dispatch of a child started
    there stayed "recent" for an hour and the run was never sent again (the chaos audit
    with a worker's clock stepped an hour)."""
    from durable import clock

    run = durable.start("tests.add_twice", {"a": 1, "b": 2})
    shared = timezone.now() - timedelta(minutes=7)
    monkeypatch.setattr(clock, "now", lambda: shared)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_on_commit(run.id)
    assert Run.objects.get(pk=run.id).dispatched_at == shared


def test_the_manual_backend_sends_and_marks_nothing(django_capture_on_commit_callbacks):
    run = durable.start("tests.add_twice", {"a": 1, "b": 2})
    Run.objects.filter(pk=run.id).update(dispatched_at=None)
    with django_capture_on_commit_callbacks() as callbacks:
        dispatch_on_commit(run.id)
    assert callbacks == [] and Run.objects.get(pk=run.id).dispatched_at is None


def test_the_sweeper_redispatches_through_the_backend(
    recording, django_capture_on_commit_callbacks
):
    run = durable.start("tests.add_twice", {"a": 1, "b": 2})
    Run.objects.filter(pk=run.id).update(dispatched_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        result = sweep()
    assert result["run_ids"] == [run.id]
    assert recording == [(run.id, None)]


def test_dispatch_now_sends_at_once(recording):
    dispatch_now("some-run", countdown=1.5)
    assert recording == [("some-run", 1.5)]


def test_a_failed_send_is_logged_not_raised(settings, caplog, django_capture_on_commit_callbacks):
    use(settings, f"{__name__}.Broken")
    with caplog.at_level(logging.ERROR, logger="durable.dispatch"):
        dispatch_now("some-run")
        with django_capture_on_commit_callbacks(execute=True):
            run = durable.start("tests.add_twice", {"a": 1, "b": 2})
    assert Run.objects.filter(pk=run.id).exists()
    sent = [r for r in caplog.records if "could not send run" in r.getMessage()]
    assert [r.args[0] for r in sent] == ["some-run", run.id]


def test_a_pending_run_is_dispatched_again_at_growing_intervals(
    recording, django_capture_on_commit_callbacks
):
    """Each dispatch of a pending run waits as long as the run had waited before it (at
    most 10 x REDISPATCH_AFTER_SECONDS): a backlog's queued messages are not copied every
    30 s, and a lost message is still sent again."""
    from durable.worker.sweeper import REDISPATCH_BACKOFF_CAP

    run = durable.start("tests.add_twice", {"a": 1, "b": 2})
    now = timezone.now()

    def swept(created_ago: float, dispatched_ago: float) -> bool:
        Run.objects.filter(pk=run.id).update(
            created_at=now - timedelta(seconds=created_ago),
            dispatched_at=now - timedelta(seconds=dispatched_ago),
        )
        recording.clear()
        with django_capture_on_commit_callbacks(execute=True):
            return run.id in sweep(now=now)["run_ids"]

    after = 30.0
    assert swept(created_ago=31, dispatched_ago=31)  # the first: after 30 s
    assert not swept(created_ago=100, dispatched_ago=40)  # had waited 60 s before it
    assert swept(created_ago=100, dispatched_ago=61)
    cap = after * REDISPATCH_BACKOFF_CAP
    assert not swept(created_ago=7200, dispatched_ago=cap - 1)  # waited 2 h: the cap
    assert swept(created_ago=7200, dispatched_ago=cap + 1)
