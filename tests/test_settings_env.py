"""Numbers in the environment (config/settings.py): a bad value stops the start with an
error naming the variable and the value -- not a bare ValueError from deep in Django's
start-up -- and an empty one means the default."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

SETTINGS = Path(__file__).resolve().parent.parent / "config" / "settings.py"


def load(monkeypatch, tmp_path, **env: str) -> dict:
    monkeypatch.setenv("DURABLE_VAR_DIR", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS))


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DURABLE_MAX_PAYLOAD_BYTES", "1MB", "is not a whole number"),
        ("DATABASE_CONN_MAX_AGE", "60s", "is not a whole number"),
        ("EMAIL_PORT", "25.5", "is not a whole number"),
        ("DJANGO_SECURE_HSTS_SECONDS", "a year", "is not a whole number"),
        ("DURABLE_LEASE_SECONDS", "thirty", "is not a number"),
        ("DURABLE_LEASE_SECONDS", "nan", "must be a finite number"),
        ("DURABLE_RETENTION_SECONDS", "inf", "must be a finite number"),
        ("DURABLE_RETENTION_SECONDS_BY_WORKFLOW", "billing=week", "is not a number"),
    ],
)
def test_a_bad_number_names_its_variable_and_value(monkeypatch, tmp_path, name, value, says):
    with pytest.raises(ImproperlyConfigured) as err:
        load(monkeypatch, tmp_path, **{name: value})
    bad = value.partition("=")[2] or value  # a mapping names the entry and its value
    assert name in str(err.value) and repr(bad) in str(err.value) and says in str(err.value)


def test_numbers_are_read_and_empty_means_the_default(monkeypatch, tmp_path):
    found = load(
        monkeypatch,
        tmp_path,
        DURABLE_MAX_PAYLOAD_BYTES=" 2048 ",
        DURABLE_LEASE_SECONDS="12.5",
        EMAIL_PORT="",
        DURABLE_RETENTION_SECONDS_BY_WORKFLOW="billing=86400,audit=forever",
    )
    assert found["DURABLE"]["MAX_PAYLOAD_BYTES"] == 2048
    assert found["DURABLE"]["LEASE_SECONDS"] == 12.5
    assert found["EMAIL_PORT"] == 1025
    assert found["DURABLE"]["RETENTION_SECONDS_BY_WORKFLOW"] == {"billing": 86400.0, "audit": None}
