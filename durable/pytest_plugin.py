"""Durable's pytest plugin: fixtures for testing your workflows (docs/testing-agents.md).

Installed with the package (the ``pytest11`` entry point ``durable``), so every pytest
run of a project that has Durable has them; pytest-django provides the database.
Their names start with ``durable_`` so they never hide a project's own fixtures:

- ``durable_env``: a :class:`~durable.testing.env.DurableEnv` on the test database
  (transactional: commits are real, as a worker's are): start and execute runs
  in-process, skip time, crash a worker at a step, signal, reconcile, and read every
  tool call with its idempotency key;
- ``durable_llm``: a :class:`~durable.testing.llm.ScriptedLLM` answering ``ctx.llm``.

The approvals app adds ``durable_approvals`` (``approvals.testing``). This module imports
nothing of Django or the engine until a fixture is used: pytest loads it before Django
is set up.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from durable.testing.env import DurableEnv
    from durable.testing.llm import ScriptedLLM


@pytest.fixture
def durable_env(transactional_db: None) -> Iterator[DurableEnv]:
    """An in-process worker, sweeper and beat with a clock that skips time
    (:class:`durable.testing.env.DurableEnv`), for the test."""
    from durable.testing.env import DurableEnv

    with DurableEnv() as env:
        yield env


@pytest.fixture
def durable_llm() -> Iterator[ScriptedLLM]:
    """A scripted model for ``ctx.llm`` (:class:`durable.testing.llm.ScriptedLLM`),
    for the test: queue replies with ``.reply(...)``, read ``.requests``."""
    from durable.testing.llm import ScriptedLLM

    llm = ScriptedLLM().install()
    try:
        yield llm
    finally:
        llm.uninstall()
