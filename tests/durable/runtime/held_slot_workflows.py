"""Workflows and tools of tests/durable/runtime/test_held_slots.py: limited calls whose
try times out while the body (or the provider) goes on.

Importing this module registers them. ``PROVIDER`` is the scripted provider both the
tool and the LLM server below report to: the requests in flight, the most at once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import durable
from durable import RetryPolicy
from examples._http import Request, Response, Router

#: a short backoff: the retry's admission, not its delay, is what is tested
RETRY = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)


class Provider:
    """A scripted provider: the first request takes ``slow`` seconds (its answer time,
    which is the scenario), the later ones answer at once; it records how many requests
    it was serving at once."""

    def __init__(self, slow: float) -> None:
        self.slow = slow
        self.lock = threading.Lock()
        self.requests = 0
        self.in_flight = 0
        self.peak = 0
        self.ended = threading.Event()  # the first request has been answered

    def serve(self) -> None:
        with self.lock:
            self.requests += 1
            first = self.requests == 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            if first:
                time.sleep(self.slow)
        finally:
            with self.lock:
                self.in_flight -= 1
            if first:
                self.ended.set()


PROVIDER = Provider(0.0)


def llm_router() -> Router:
    """An OpenAI-compatible ``/v1/chat/completions`` answering through ``PROVIDER``."""
    router = Router()

    @router.route("POST", "/v1/chat/completions")
    def complete(request: Request) -> Response:
        PROVIDER.serve()
        return Response(
            200,
            {
                "id": "chatcmpl-held",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request.json().get("model", ""),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "answered"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            },
        )

    return router


@durable.tool(safety="read_only", concurrency=1, timeout=0.2, retry=RETRY)
def held_lookup(label: str) -> str:
    """A tool of concurrency 1 whose provider is ``PROVIDER``."""
    PROVIDER.serve()
    return f"{label}-done"


@durable.workflow(name="held.tool", version="1")
def tool_flow(ctx, data):
    return ctx.call_tool("held_lookup", {"label": "x"})


@durable.workflow(name="held.llm", version="1")
def llm_flow(ctx, data):
    """S32: a model of concurrency 1, a try that times out after 0.3 s, a retry."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    return ctx.llm(messages, model="held-model", timeout=0.3, retry=RETRY)["content"]


#: a retry far enough to be stored (the lease given back), over INPROCESS_RETRY_MAX_SECONDS
STORED = RetryPolicy(max_attempts=2, initial_interval=30.0, jitter=False)


def _outlives(seconds: float) -> str:
    """A plain step body that outlives its timeout; ``PROVIDER.ended`` when it ends."""
    PROVIDER.slow = seconds
    PROVIDER.serve()
    return "late"


@durable.workflow(name="held.lease", version="1", max_concurrent_runs=1)
def lease_flow(ctx, data):
    """A step whose try times out after 0.2 s while its body takes 0.8 s; its retry is
    stored (``"retry"``) or there is none (``"fail"``): either gives the lease back."""
    policy = STORED if data["then"] == "retry" else RetryPolicy(max_attempts=1)
    return ctx.step("slow", _outlives, 0.8, retry=policy, timeout=0.2)
