"""The repository stands alone: its documents are in ``docs/``, and every link to them holds.

A docstring or comment that points to a document outside the repository (a shared
design folder, a scenario list) is one a new maintainer cannot open, so none may: a
reference names a section of ``docs/`` (``docs/architecture.md#leases``) or a test.
Every ``docs/<page>.md#<anchor>`` link in a ``.py``, ``.md`` or ``.html`` file must
name a page that exists and a heading on it (GitHub's anchors), so renaming a heading
without its links fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve()

#: folders that are not the project's files
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "var", "build", "dist", "site"}
SUFFIXES = {".py", ".md", ".html"}


#: names of documents outside the repository (matched case-sensitively: the repository's
#: own pages are lower-case, ``docs/architecture.md`` and ``docs/conventions.md``)
OUTSIDE = re.compile(
    r"\.\./shared|shared/design|\bSCENARIOS\b|\bARCHITECTURE\b|\bCONVENTIONS\b"
    r"|\bSTRUCTURE\.md\b"
)
#: outside ``docs/``, a page of ``docs/`` is named with its folder
BARE_PAGE = re.compile(r"(?<![\w/.-])(?:architecture|conventions)\.md\b", re.IGNORECASE)
#: ``docs/<page>.md`` with an optional ``#anchor``, not part of a longer path
DOCS_LINK = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md)(?:#([\w-]+))?")
#: inside ``docs/``: markdown links to a sibling page or to a heading of the same page
RELATIVE_LINK = re.compile(r"\]\((?:([\w-]+\.md))?(?:#([\w-]+))?\)")

REQUIRED_SECTIONS = (
    "Layers",
    "The run state machine",
    "Leases",
    "Checkpoints",
    "Replay",
    "The operation ledger",
    "Waits",
    "Dispatch",
    "Failures and retries",
    "Values",
    "Module map",
)


def project_files(root: Path) -> Iterator[Path]:
    """The ``.py``, ``.md`` and ``.html`` files of the project under ``root``."""
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if any(p in SKIP_DIRS or p.endswith(".egg-info") for p in parts[:-1]):
            continue
        if path.suffix in SUFFIXES and path.is_file() and path.resolve() != SELF:
            yield path


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: ``"Planned, not built"`` -> ``planned-not-built``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(
        r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL
    )  # no headings inside code blocks
    headings = re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE)
    return {slug(m.group(1)) for m in headings}


def outside_references(root: Path) -> list[str]:
    """``path:line: text`` of every reference to a document outside the repository."""
    found = []
    for path in project_files(root):
        rel = path.relative_to(root).as_posix()
        in_docs = rel.startswith("docs/")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line) or (not in_docs and BARE_PAGE.search(line)):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def broken_links(root: Path) -> list[str]:
    """``path:line: link (why)`` of every link to a missing ``docs/`` page or heading."""
    docs = root / "docs"
    cache: dict[Path, set[str]] = {}
    broken = []

    def check(rel: str, number: int, page: Path, anchor: str | None, link: str) -> None:
        if not page.is_file():
            broken.append(f"{rel}:{number}: {link} (no such page)")
        elif anchor and anchor not in cache.setdefault(page, anchors(page)):
            broken.append(
                f"{rel}:{number}: {link} (no heading with that anchor on "
                f"{page.relative_to(root).as_posix()})"
            )

    for path in project_files(root):
        rel = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in DOCS_LINK.finditer(line):
                check(rel, number, docs / m.group(1), m.group(2), m.group(0))
            if rel.startswith("docs/") and path.suffix == ".md":
                for m in RELATIVE_LINK.finditer(line):
                    if m.group(1) or m.group(2):
                        target = path.parent / m.group(1) if m.group(1) else path
                        check(rel, number, target, m.group(2), m.group(0))
    return broken


def test_no_file_points_to_a_document_outside_the_repository():
    found = outside_references(ROOT)
    assert not found, (
        "these lines point to documents outside the repository; link a "
        "section of docs/ or name the test instead:\n" + "\n".join(found)
    )


def test_every_link_to_docs_names_an_existing_page_and_heading():
    broken = broken_links(ROOT)
    assert not broken, "broken links to docs/:\n" + "\n".join(broken)


#: a tutorial whose code is a test file run in CI: page -> the test file it shows
TUTORIALS = {"docs/testing-agents.md": "tests/examples/test_testing_agents.py"}
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


@pytest.mark.parametrize(("page", "tests"), sorted(TUTORIALS.items()))
def test_a_tutorials_code_is_the_test_file_that_runs_it(page, tests):
    """Every Python block of the page is a part of the test file, verbatim: the page
    cannot show code that CI does not run."""
    source = (ROOT / tests).read_text(encoding="utf-8")
    blocks = PYTHON_BLOCK.findall((ROOT / page).read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    assert [block for block in blocks if block not in source] == []


def test_architecture_has_the_sections_code_links_to():
    have = anchors(ROOT / "docs" / "architecture.md")
    missing = [s for s in REQUIRED_SECTIONS if slug(s) not in have]
    assert not missing, f"docs/architecture.md misses the sections {missing}"


def test_readme_links_the_design_documents_near_the_top():
    top = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## ", 2)[:2]
    assert "docs/architecture.md" in "\n".join(top)
    assert "docs/conventions.md" in "\n".join(top)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Layers", "layers"),
        ("The run state machine", "the-run-state-machine"),
        ("Planned, not built", "planned-not-built"),
        ("`make check` and CI", "make-check-and-ci"),
        ("Who asked, and where signals went", "who-asked-and-where-signals-went"),
    ],
)
def test_slug_matches_githubs_anchors(heading, anchor):
    assert slug(heading) == anchor


def test_the_checks_catch_what_they_are_for(tmp_path):
    """Both checks fail on a planted reference and a planted broken link."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text("# Architecture\n\n## Leases\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        '"""Leases (docs/architecture.md#leases), see ../shared/ARCHITECTURE.md."""\n'
        "# SCENARIOS S01\n"
        "# docs/architecture.md#heartbeats and docs/missing.md\n"
        "# see architecture.md\n"
    )
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "x.py").write_text("# ../shared/CONVENTIONS.md\n")

    found = outside_references(tmp_path)
    assert [f.split(":")[1] for f in found] == ["1", "2", "4"]
    broken = broken_links(tmp_path)
    assert len(broken) == 2
    assert "docs/architecture.md#heartbeats (no heading" in broken[0]
    assert "docs/missing.md (no such page)" in broken[1]
