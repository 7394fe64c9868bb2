"""The API never imports the dashboard: both are web apps over the same read layer
(``durable.queries``) and the same permissions (``approvals.access``, ``approvals.roles``),
siblings in docs/architecture.md#layers. Parsed with ``ast``, never imported."""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "api"


def imported_apps(source: str) -> set[str]:
    """The top-level packages that ``source`` imports, anywhere in it (absolute imports)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return found


def test_the_checker_sees_every_import_form():
    source = (
        "import dashboard.views\n"
        "from durable.queries import runs\n"
        "def later():\n"
        "    from dashboard import selectors\n"
    )
    assert imported_apps(source) == {"dashboard", "durable"}
    assert imported_apps("from . import runs\n") == set()


def test_no_module_of_the_api_imports_the_dashboard():
    offenders = sorted(
        path.relative_to(API.parent).as_posix()
        for path in API.rglob("*.py")
        if "dashboard" in imported_apps(path.read_text(encoding="utf-8"))
    )
    assert offenders == [], f"these API modules import the dashboard: {offenders}"
