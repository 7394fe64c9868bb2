"""Sample workflows, discovered automatically because ``examples`` is an installed app.

``examples.hello`` is the run that ``make up`` (``manage.py durable_demo``) starts: two
memoized steps and one read-only tool call, fast and deterministic, so a fresh checkout
shows a completed run with its steps in the admin and the dashboard.
"""

from __future__ import annotations

from typing import Any

import durable

GREETINGS = {"en": "Hello", "fr": "Bonjour", "de": "Hallo", "es": "Hola", "it": "Ciao"}


@durable.tool(name="examples.lookup_greeting", safety="read_only")
def lookup_greeting(language: str = "en") -> dict[str, str]:
    """Look up the greeting word for a language (read-only: safe to repeat)."""
    code = (language or "en").strip().lower()[:2]
    if code not in GREETINGS:
        code = "en"
    return {"language": code, "greeting": GREETINGS[code]}


def normalize_name(name: Any) -> str:
    """Trim and title-case the name; an empty name becomes "world"."""
    text = " ".join(str(name or "").split())
    return text.title() if text else "world"


def compose(greeting: str, name: str) -> str:
    return f"{greeting}, {name}!"


@durable.workflow(name="examples.hello", version="1")
def hello(ctx, data):
    """Greet someone: normalize the name, look up a greeting (a tool), compose the message."""
    data = data or {}
    name = ctx.step("normalize_name", normalize_name, data.get("name"))
    found = ctx.call_tool("examples.lookup_greeting", {"language": data.get("language", "en")})
    message = ctx.step("compose", compose, found["greeting"], name)
    return {"message": message, "language": found["language"]}
