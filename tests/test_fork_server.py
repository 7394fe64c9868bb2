"""The fork server's preloads (examples/procs.py) leave a worker free to set itself up:
no Django settings read, no Twisted reactor installed, before the worker's own
environment is in place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_preloaded_modules_read_no_settings_and_install_no_reactor():
    code = (
        "import importlib, os, sys\n"
        "os.environ.pop('DJANGO_SETTINGS_MODULE', None)\n"
        "from examples.procs import PRELOAD\n"
        "for name in PRELOAD: importlib.import_module(name)\n"
        "from django.conf import settings\n"
        "print(settings.configured, 'twisted.internet.reactor' in sys.modules)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
