"""What ``interrupt()`` returns in a graph workflow: the inbox decision as the value the
graph expects (see docs/langgraph.md#interrupts-are-waits).

A kind says it: ``"approve"`` (``True``/``False``), ``"edit"`` (the edited value),
``"answer"`` (the approver's answer), ``"edit:<field>"`` / ``"answer:<field>"`` (a field
of them), ``"decision"`` (Durable's decision dict, the behaviour of workflows registered
without ``resume=``). The workflow declares it (``graph_workflow(..., resume=...)``) or
the interrupt does (:func:`ask`, or the ``"durable_resume"`` key of a dict value); an
interrupt no declaration covers, or two that disagree, is refused, never guessed.
"""

from __future__ import annotations

from typing import Any

from langgraph.types import interrupt

from durable.exceptions import PermanentError

__all__ = ["RESUME_KEY", "RESUME_KINDS", "ask"]

#: the key of a dict interrupt value that says what ``interrupt()`` returns
RESUME_KEY = "durable_resume"
#: what ``interrupt()`` may return: the approval as a bool, the edited value, the
#: approver's answer, or Durable's decision dict (the behaviour before ``resume=``)
RESUME_KINDS = ("approve", "edit", "answer", "decision")


def ask(value: Any, resume: str) -> Any:
    """``interrupt(value)`` that returns what ``resume`` says (one of :data:`RESUME_KINDS`).

    ``"approve"``: ``True`` when the approver approves, ``False`` when they reject.
    ``"edit"``: the value as the approver edited it (the value unchanged when they
    approve without editing or reject). ``"answer"``: the approver's answer (``None``
    when they reject or approve without answering). ``"edit:<field>"`` and
    ``"answer:<field>"``: that field of the (edited) dict value. ``"decision"``: Durable's decision
    dict. A dict ``value`` is shown to approvers as is, another value as ``{"value":
    value}`` (an edit or answer of it is the edited ``"value"``). Raises ``ValueError``
    for another ``resume``; outside a graph, what ``interrupt`` raises.
    """
    if not valid_kind(resume):
        raise ValueError(f"ask(resume={resume!r}): resume must be one of {RESUME_KINDS}")
    details = dict(value) if isinstance(value, dict) else {"value": value}
    return interrupt({**details, RESUME_KEY: resume})


def valid_kind(kind: Any) -> bool:
    """``approve``, ``decision``, ``edit``, ``answer``, or ``edit:<field>``/``answer:<field>``."""
    if not isinstance(kind, str):
        return False
    base, _, field = kind.partition(":")
    return kind in RESUME_KINDS or (base in ("edit", "answer") and bool(field))


def _resume_kind(pending: dict[str, Any], declared: str | dict[str, str] | None) -> str:
    """What this interrupt's ``interrupt()`` returns; refuses an ambiguous mapping."""
    value = pending["value"]
    node = pending.get("node") or "graph"
    own = value.get(RESUME_KEY) if isinstance(value, dict) else None
    if own is not None and not valid_kind(own):
        raise PermanentError(
            f"the interrupt of node {node!r} says {RESUME_KEY}={own!r}: it must be one of "
            f"{RESUME_KINDS}"
        )
    graph_kind = declared.get(node) if isinstance(declared, dict) else declared
    if own is not None and graph_kind is not None and own != graph_kind:
        raise PermanentError(
            f"the interrupt of node {node!r} says {RESUME_KEY}={own!r} but the workflow "
            f"says resume={graph_kind!r}: say it once, in one place"
        )
    kind = own or graph_kind
    if kind is None:
        if declared is None:
            return "decision"  # registered without resume=: the dict, as before
        raise PermanentError(
            f"the interrupt of node {node!r} does not say what interrupt() returns: give "
            f"the node a kind in graph_workflow(..., resume={{{node!r}: ...}}) or the "
            f"interrupt value a {RESUME_KEY!r} key, one of {RESUME_KINDS}"
        )
    return kind


def human(
    pending: dict[str, Any], key: str, approvers: str | None, resume: str | dict[str, str] | None
) -> tuple[dict[str, Any], str, dict[str, Any], bool]:
    """A human interrupt: its approval request, its resume kind, its details, wrapped."""
    value = pending["value"]
    kind = _resume_kind(pending, resume)
    if isinstance(value, dict) and RESUME_KEY in value:
        details = {k: v for k, v in value.items() if k != RESUME_KEY}
        # ask() wraps a value that is not a dict as {"value": ...}
        wrapped = set(details) == {"value"}
    else:
        wrapped = not isinstance(value, dict)
        details = {"value": value} if wrapped else value
    request = {
        "key": key,
        "title": _title(pending),
        "payload": details,
        "approvers": approvers,
        "allow_edit": kind != "approve",
    }
    return request, kind, details, wrapped


def resume_value(decision: Any, kind: str, details: dict[str, Any], wrapped: bool) -> Any:
    """What ``interrupt()`` returns for ``decision`` under ``kind``."""
    answer = decision.edited
    if wrapped and isinstance(answer, dict) and set(answer) == {"value"}:
        answer = answer["value"]
    if kind == "approve":
        return decision.approved
    base, _, field = kind.partition(":")
    shown = details["value"] if wrapped else details
    if base == "edit":
        edited = decision.approved and decision.edited is not None
        result = answer if edited else shown
        if not field:
            return result
        fallback = shown.get(field) if isinstance(shown, dict) else None
        return result.get(field, fallback) if isinstance(result, dict) else fallback
    if base == "answer":
        if not decision.approved or answer is None:
            return None
        return answer.get(field) if field and isinstance(answer, dict) else answer
    return {
        "approved": decision.approved,
        "answer": answer,
        "comment": decision.comment,
        "decided_by": list(decision.decided_by),
    }


def _title(pending: dict[str, Any]) -> str:
    value = pending["value"]
    text = None
    if isinstance(value, dict):
        text = value.get("title") or value.get("question")
        if text is None and isinstance(value.get("value"), str):
            text = value["value"]  # ask() with a text
    elif isinstance(value, str):
        text = value
    node = pending.get("node") or "graph"
    return f"{node}: {str(text or 'asks for a decision')[:180]}"


#: LangGraph's static breakpoints: refused (the driver would run past them)
BREAKPOINTS = ("interrupt_before", "interrupt_after")


def refuse_breakpoints(where: str, graph: Any) -> None:
    """Raise if ``graph`` was compiled with ``interrupt_before=``/``interrupt_after=``.

    The driver stops after every super-step and resumes with ``invoke(None)``, which is
    also how LangGraph continues past a static breakpoint: the run would go on without
    anyone deciding. Refused, not silently ignored.
    """
    from durable.exceptions import DurableConfigurationError

    for option in BREAKPOINTS:
        nodes = getattr(graph, f"{option}_nodes", None)
        if nodes:
            raise DurableConfigurationError(breakpoint_message(where, option, nodes))


def breakpoint_message(where: str, option: str, nodes: Any) -> str:
    return (
        f"{where}: {option}={nodes!r} (LangGraph's static breakpoints) is not supported "
        "on Durable: the run would go past it without stopping. Call interrupt() inside "
        "the node instead: it waits in the inbox as an approval and resumes on the answer"
    )
