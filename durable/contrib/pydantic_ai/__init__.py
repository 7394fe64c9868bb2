"""PydanticAI agents as Durable workflows: every model request and tool call is a step.

Invariant: a run of a :class:`DurableAgent` replays to the same state after a crash.
Model requests go through a wrapped ``Model`` whose ``request`` is one ``ctx.step``
recording the ``ModelResponse`` in PydanticAI's own serialisation
(``ModelMessagesTypeAdapter``), and tool calls through wrapped toolsets whose
``call_tool`` is one step (a ``@durable.tool`` is ``ctx.call_tool``, with its safety
class, ledger and approval), so no model request is paid twice and no tool repeated.
Tools run one at a time (``parallel_execution_mode('sequential')``): the order of the
steps is then the order of the calls, the same on every replay. Approvals use
PydanticAI's deferred tools: a run that ends with ``DeferredToolRequests`` waits for
a decision in the inbox and continues with ``DeferredToolResults`` (``ToolApproved``
with the edited arguments, ``ToolDenied`` with the reason), as PydanticAI expects.
A streamed request writes the run's stream live and records the same response; the
run's ``event_stream_handler`` gets PydanticAI's events (live, or derived from the
record on a replay), and ``DurableAgent.run_stream`` follows a run from outside in
PydanticAI's shapes (``stream_text()``, ``get_output()``). Mirrors
``pydantic_ai.durable_exec`` (``TemporalAgent``, ``DBOSAgent``); needs the
``durable[pydantic-ai]`` extra, and the core never imports this module.
"""

from __future__ import annotations

from durable.contrib._bridge import current_idempotency_key
from durable.contrib.pydantic_ai._agent import DurableAgent, DurableAgentResult
from durable.contrib.pydantic_ai._follow import AsyncStreamedRun, StreamedRun
from durable.contrib.pydantic_ai._options import STEP_SETTINGS_KEY, StepSettings
from durable.contrib.pydantic_ai._steps import DurableModel, DurableToolset
from durable.contrib.pydantic_ai._tools import DURABLE_TOOL_KEY, durable_tool

__all__ = [
    "AsyncStreamedRun",
    "DURABLE_TOOL_KEY",
    "DurableAgent",
    "DurableAgentResult",
    "DurableModel",
    "DurableToolset",
    "STEP_SETTINGS_KEY",
    "StepSettings",
    "StreamedRun",
    "current_idempotency_key",
    "durable_tool",
]
