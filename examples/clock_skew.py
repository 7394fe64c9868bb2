"""A worker whose wall clock is off: the clock-step fault of the chaos audit and tests.

``install(path)`` makes ``django.utils.timezone.now()`` -- the wall clock the engine and
Django read -- this machine's clock plus the seconds written in the file at ``path``
(re-read every 0.2 s, so a test or the chaos loop steps the clock of a running worker by
writing a new offset). Monotonic clocks are left alone, as when NTP, a resumed VM or an
operator steps a host's clock. Installed before the worker serves anything:

    python -m examples.clock_skew OFFSET_FILE -A config worker ...

runs ``celery`` with that clock. (libfaketime would move the C library's clock too, but
its ``clock_nanosleep`` fails with EINVAL when monotonic time is not faked, and faking it
hangs Python's timed waits.)
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

#: seconds between two reads of the offset file
REREAD_SECONDS = 0.2


def read_offset(path: Path) -> float:
    """The offset in seconds written in ``path`` (``"+3600"``, ``"-90.5"``); 0 if none."""
    try:
        return float(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0.0


def install(path: str | Path) -> None:
    """Skew ``django.utils.timezone.now`` in this process by the offset in ``path``."""
    from django.utils import timezone

    file = Path(path)
    real_now = timezone.now
    lock = threading.Lock()
    state = {"offset": read_offset(file), "read_at": time.monotonic()}

    def offset() -> float:
        mono = time.monotonic()
        if mono - state["read_at"] >= REREAD_SECONDS:
            with lock:
                state["offset"] = read_offset(file)
                state["read_at"] = mono
        return state["offset"]

    def skewed_now() -> datetime:
        return real_now() + timedelta(seconds=offset())

    timezone.now = skewed_now


def main() -> None:
    """``python -m examples.clock_skew OFFSET_FILE CELERY-ARGS...``: a skewed worker."""
    path, *argv = sys.argv[1:]
    install(path)
    sys.argv = ["celery", *argv]
    from celery.__main__ import main as celery

    celery()


if __name__ == "__main__":
    main()
