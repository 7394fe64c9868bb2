"""The client calls in a bare ``python script.py``: a clear error that names the fix.

``import durable`` and the decorators work without Django; a call that reaches the runs
(``durable.start`` and the others) needs the project set up. Django's own error there
(``AppRegistryNotReady: Apps aren't loaded yet``, or ``ImproperlyConfigured`` about
``INSTALLED_APPS``) names neither the call nor the fix (a new user's trial ran the
README's example that way)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import durable

@durable.workflow(name="bare.hello", version="1")
def hello(ctx, data):
    return ctx.step("greet", lambda: "hi")

try:
    durable.{call}
except durable.DurableConfigurationError as exc:
    print("REFUSED:", exc)
"""


@pytest.mark.parametrize(
    ("call", "name"),
    [
        ('start("bare.hello", {})', "start"),
        ('get_run("r-1")', "get_run"),
        ('result("r-1", timeout=0)', "result"),
        ('signal("r-1", "go")', "signal"),
        ('cancel("r-1")', "cancel"),
    ],
)
@pytest.mark.parametrize("settings_module", [None, "config.settings"])
def test_a_client_call_outside_django_says_what_to_do(call, name, settings_module):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(REPO)
    if settings_module:
        env["DJANGO_SETTINGS_MODULE"] = settings_module
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(call=call)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"REFUSED: durable.{name}() needs the Django project set up" in done.stdout
    why = "django.setup() was not called" if settings_module else "DJANGO_SETTINGS_MODULE is not"
    assert why in done.stdout and "manage.py shell" in done.stdout
