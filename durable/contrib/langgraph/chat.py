"""LangChain chat models inside the nodes of a graph workflow, recorded as LLM steps.

``durable_chat_model(model)`` wraps a LangChain chat model (``BaseChatModel``: any
``langchain_*`` provider, or a fake in tests). Its ``invoke(messages)`` inside a node
of a :func:`~durable.contrib.langgraph.graph_workflow` is a Durable LLM step
``<node>.llm`` (``<node>.llm#2``, ...), as :func:`~durable.contrib.langgraph.call_model`
is: the node stops (a LangGraph interrupt), the run calls the wrapped model in the step
(request, reply, tokens recorded; tokens count against the run's ``max_tokens``; retried
under the LLM retry policy) and the node runs again, getting the recorded ``AIMessage``.
A crash, a retry of the super-step or the node's own re-run never asks the model again.

The model is found by name in the worker: wrap it where the graph is built (a module
the workers import), under a name unique in the process (``name=``, else the model's
``model_name``/``model`` field, else its class name).
"""

from __future__ import annotations

import json
import threading
from typing import Any

#: the key that marks an interrupt raised by :meth:`DurableChatModel.invoke`
CHAT_MARKER = "__durable_chat__"

_models: dict[str, Any] = {}
_lock = threading.Lock()


class DurableChatModel:
    """A LangChain chat model whose ``invoke`` inside a graph node is an LLM step."""

    def __init__(self, model: Any, name: str) -> None:
        self.model = model
        self.name = name

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """``model.invoke(input, **kwargs)`` as a recorded LLM step; returns the
        ``AIMessage``. ``input``: what LangChain takes (a string, messages, ``(role,
        text)`` tuples, a prompt value); ``kwargs`` must be JSON (``stop=[...]``).
        ``config`` is ignored (the step runs outside the node's callbacks). Outside a
        node of a graph workflow it raises LangGraph's ``RuntimeError``."""
        from langchain_core.messages import convert_to_messages, messages_to_dict
        from langgraph.types import interrupt

        to_messages = getattr(input, "to_messages", None)
        if callable(to_messages):
            messages = to_messages()
        else:
            messages = convert_to_messages(input if isinstance(input, list) else [input])
        try:
            json.dumps(kwargs)
        except TypeError as exc:
            raise ValueError(
                f"{self.name}.invoke: keyword arguments must be JSON ({exc})"
            ) from None
        from durable.contrib.langgraph.streaming import chat_metadata

        request = {
            "model": self.name,
            "messages": messages_to_dict(messages),
            "kwargs": kwargs,
            "metadata": chat_metadata(self.model),  # what a streamed reply says it is
        }
        reply = interrupt({CHAT_MARKER: request})
        if not isinstance(reply, dict) or "message" not in reply:
            raise RuntimeError(f"chat model {self.name!r}: {reply!r}")
        return _message(reply["message"])

    def __repr__(self) -> str:
        return f"durable_chat_model({self.model!r}, name={self.name!r})"


def durable_chat_model(model: Any, *, name: str | None = None) -> DurableChatModel:
    """Wrap the LangChain chat model ``model`` so that its ``invoke`` in a node of a
    graph workflow is a Durable LLM step, asked once (see the module's docstring).

    ``name``: how the step finds the model in the worker process (and the step's
    model); the default is the model's ``model_name`` or ``model`` field, else its class
    name. Raises ``ValueError`` when another model is already wrapped under that name
    (pass ``name=``), or for a ``model`` without ``invoke``.
    """
    if not callable(getattr(model, "invoke", None)):
        raise ValueError(f"durable_chat_model: {model!r} is not a chat model (no invoke)")
    if name is None:
        found = getattr(model, "model_name", None) or getattr(model, "model", None)
        name = found if isinstance(found, str) and found else type(model).__name__
    with _lock:
        other = _models.get(name)
        if other is not None and other is not model:
            raise ValueError(
                f"durable_chat_model: another model is wrapped as {name!r}; pass name= to "
                "tell them apart (the step finds its model by name)"
            )
        _models[name] = model
    return DurableChatModel(model, name)


def _message(data: dict[str, Any]) -> Any:
    from langchain_core.messages import messages_from_dict

    return messages_from_dict([data])[0]


def chat_step(ctx: Any, step_id: str, request: dict[str, Any], *, stream: bool = False) -> Any:
    """The LLM step of one :meth:`DurableChatModel.invoke`: its recorded reply, or the
    wrapped model's, recorded (as ``ctx.llm`` records a chat completion). ``stream``: the
    graph streams ``messages``: the model's ``stream`` is asked instead of ``invoke`` and
    its chunks go to the run's stream (the same record)."""
    from durable.exceptions import PermanentError

    name = request["model"]
    model = _models.get(name)

    def ask() -> dict[str, Any]:
        from langchain_core.messages import messages_from_dict

        assert model is not None  # make_fn refused a missing one
        messages = messages_from_dict(request["messages"])
        if stream:
            from durable.contrib.langgraph.streaming import streamed_reply

            started = {"metadata": request.get("metadata") or {}}
            with ctx._step_stream(step_id, model=name, started=started) as out:
                answer = streamed_reply(model, messages, request["kwargs"] or {}, out.emit)
                record = _record(answer, name)
                out.end(finish_reason=record["finish_reason"], usage=record["usage"])
            return record
        return _record(model.invoke(messages, **(request["kwargs"] or {})), name)

    def make_fn(call: Any, limits: Any) -> Any:
        if model is None:  # raised before the model is asked: the run fails, saying why
            raise PermanentError(
                f"no chat model {name!r} in this worker: call durable_chat_model(...) where "
                "the graph is built, in a module the workers import"
            )
        return ask

    stored = {"model": name, "messages": request["messages"], "kwargs": request.get("kwargs")}
    return ctx._llm_step(step_id, stored, make_fn, durability=None, where=f"{name}.invoke")


def _record(answer: Any, name: str) -> dict[str, Any]:
    """The step's record of the model's reply ``answer`` (an ``AIMessage``)."""
    from langchain_core.messages import message_to_dict

    usage = getattr(answer, "usage_metadata", None) or {}
    meta = getattr(answer, "response_metadata", None) or {}
    content = answer.content if isinstance(answer.content, str) else str(answer.text)
    return {
        "content": content,
        "tool_calls": [
            {"id": c.get("id"), "name": c["name"], "arguments": json.dumps(c.get("args"))}
            for c in getattr(answer, "tool_calls", None) or []
        ],
        "usage": {
            "prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
        },
        "model": meta.get("model_name") or name,
        "finish_reason": meta.get("finish_reason"),
        "cost_usd": None,
        "message": json.loads(json.dumps(message_to_dict(answer), default=repr)),
    }
