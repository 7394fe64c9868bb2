"""Sending "look at run X now" hints to workers. Messages are hints; the database decides.

The transport is a backend, chosen by dotted path in ``DURABLE['DISPATCH']`` as
``django.tasks`` chooses its backend: the engine calls :func:`dispatch_on_commit` and
:func:`dispatch_now` and never imports a transport, so no engine module depends on Celery
(``durable.worker.tasks.CeleryDispatcher`` depends on the engine, not the other way round).
A send that fails is logged, never raised: the sweeper dispatches the run again.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.signals import setting_changed
from django.db import transaction
from django.dispatch import receiver
from django.utils.module_loading import import_string

from durable import conf
from durable.exceptions import DurableConfigurationError

logger = logging.getLogger("durable.dispatch")

#: a delayed hint further out than this (seconds) is not sent: brokers hold delayed
#: messages in worker memory, so long timers and retries are left to the sweeper
MAX_COUNTDOWN_SECONDS = 300.0

#: short names for the built-in backends, accepted in ``DURABLE['DISPATCH']``
ALIASES = {
    "celery": "durable.worker.tasks.CeleryDispatcher",
    "manual": "durable.dispatch.ManualDispatcher",
}


class Dispatcher:
    """A transport for dispatch hints. Subclass it and name the subclass's dotted path in
    ``DURABLE['DISPATCH']``; it is instantiated once, without arguments."""

    #: False for a backend that sends nothing (runs are driven by hand): dispatching
    #: then neither sends nor records ``Run.dispatched_at``
    delivers: bool = True

    def send(self, run_id: str, countdown: float | None) -> None:
        """Ask a worker to execute ``run_id``, after ``countdown`` seconds if given."""
        raise NotImplementedError


class ManualDispatcher(Dispatcher):
    """Sends nothing: tests and scripts execute runs themselves (``durable.testing.drive``)."""

    delivers = False

    def send(self, run_id: str, countdown: float | None) -> None:
        pass


# backends by setting value (a setting assigned without ``setting_changed`` still takes
# effect); emptied whenever DURABLE (or settings) change
_backend_cache: dict[str, Dispatcher] = {}


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "DURABLE":
        _backend_cache.clear()


def load_dispatcher(value: Any) -> Dispatcher:
    """Instantiate the backend a ``DURABLE['DISPATCH']`` value names (a dotted path or an
    alias). Raises :class:`~durable.exceptions.DurableConfigurationError` naming the
    setting when the value is not a string, does not import, or is not a
    :class:`Dispatcher` subclass (``durable.checks`` reports the same at start-up)."""
    if not isinstance(value, str):
        raise DurableConfigurationError(
            f"DURABLE['DISPATCH'] = {value!r}: a dotted path to a Dispatcher class is "
            f"expected, or one of {', '.join(map(repr, ALIASES))}"
        )
    path = ALIASES.get(value, value)
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise DurableConfigurationError(
            f"DURABLE['DISPATCH'] = {value!r} does not import: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Dispatcher)):
        raise DurableConfigurationError(
            f"DURABLE['DISPATCH'] = {value!r} is not a subclass of durable.dispatch.Dispatcher"
        )
    return cls()


def get_dispatcher() -> Dispatcher:
    """The backend named by ``DURABLE['DISPATCH']``, loaded on first use and cached."""
    value = conf.get("DISPATCH")
    backend = _backend_cache.get(value) if isinstance(value, str) else None
    if backend is None:
        backend = _backend_cache[value] = load_dispatcher(value)
    return backend


def _send(backend: Dispatcher, run_id: str, countdown: float | None) -> None:
    try:
        backend.send(run_id, countdown)
    except Exception:  # noqa: BLE001 - the sweeper re-dispatches; never lose the caller's work
        logger.exception(
            "durable: could not send run %s to the broker; the sweeper will dispatch it again",
            run_id,
        )


def dispatch_now(run_id: str, *, countdown: float | None = None) -> None:
    """Send the hint for ``run_id`` at once, not on commit: for a caller whose changes to
    the run are already committed. Records nothing; a failed send is logged."""
    backend = get_dispatcher()
    if backend.delivers:
        _send(backend, run_id, countdown)


def dispatch_on_commit(run_id: str, *, countdown: float | None = None, mark: bool = True) -> None:
    """Ask a worker to execute ``run_id`` once the current transaction commits.

    ``countdown``: seconds to wait before the worker looks (a retry's or timer's due
    time); beyond ``MAX_COUNTDOWN_SECONDS`` nothing is sent and the sweeper dispatches
    the run when it is due. ``mark``: record ``dispatched_at`` (pass False when the
    caller already set it). With a backend that does not deliver (``"manual"``) nothing
    is sent or recorded (tests drive execution).
    """
    backend = get_dispatcher()
    if not backend.delivers:
        return
    if countdown is not None and countdown > MAX_COUNTDOWN_SECONDS:
        return
    if mark:
        from durable import clock
        from durable.models.runs import Run

        # the sweeper judges a lost dispatch by the shared clock: a worker host whose own
        # clock is ahead must not write a dispatch time that stays "recent" for an hour
        Run.objects.filter(pk=run_id).update(dispatched_at=clock.now())
    transaction.on_commit(lambda: _send(backend, run_id, countdown))
