"""The LangGraph contrib's tests run only where LangGraph is importable.

Under ``pip install -e '.[test]'`` (``make test``, CI) it always is: the ``test`` extra
lists the ``langgraph`` extra's packages.
"""

from __future__ import annotations

import importlib.util

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("langgraph") is None:  # pragma: no cover - lean installs only
    collect_ignore_glob.append("test_*.py")
