"""The vocabularies are types, each defined once (``durable/vocabulary.py``).

Safety classes and failure classifications have one definition that the models, the
registry, the retry machinery and the exceptions share; every trace event the engine,
the services and the approvals write names an ``EventKind`` member.
"""

from __future__ import annotations

import ast
from pathlib import Path

from durable import exceptions, models, registry, retry
from durable.vocabulary import Classification, Safety

ROOT = Path(__file__).resolve().parents[3]


def test_one_definition_of_safety_and_classification():
    assert models.Safety is Safety and models.Classification is Classification
    assert registry.SAFETY_CLASSES == tuple(Safety.values)
    assert [retry.TRANSIENT, retry.MODEL_RECOVERABLE, retry.PERMANENT, retry.AMBIGUOUS] == [
        Classification.TRANSIENT,
        Classification.MODEL_RECOVERABLE,
        Classification.PERMANENT,
        Classification.AMBIGUOUS,
    ]
    # plain strings: they are written into JSON error documents
    assert {type(c) for c in (retry.TRANSIENT, retry.PERMANENT, retry.AMBIGUOUS)} == {str}
    classes = [
        exceptions.DurableError,
        exceptions.TransientError,
        exceptions.ModelRecoverableError,
        exceptions.PermanentError,
        exceptions.AmbiguousOutcomeError,
    ]
    assert {c.classification for c in classes} <= set(Classification.values)
    assert all(type(c.classification) is str for c in classes)


def _event_kinds(tree: ast.AST) -> list[tuple[int, str]]:
    """The ``kind=`` of every TraceEvent written, as source text."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name in ("TraceEvent", "TraceEvent.objects.create"):
            found += [
                (node.lineno, ast.unparse(kw.value)) for kw in node.keywords if kw.arg == "kind"
            ]
        elif name == "record_event" and len(node.args) >= 2:  # the services' helper
            found.append((node.lineno, ast.unparse(node.args[1])))
    return found


def test_every_trace_event_names_an_event_kind():
    bad, seen = {}, 0
    for package in ("durable", "approvals"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel:
                continue
            kinds = _event_kinds(ast.parse(path.read_text(), filename=rel))
            seen += len(kinds)
            wrong = [
                (line, k) for line, k in kinds if k != "kind" and not k.startswith("EventKind")
            ]
            if wrong:
                bad[rel] = wrong
    assert bad == {}
    assert seen > 25  # the walk finds them
