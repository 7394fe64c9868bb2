"""The model of a durable OpenAI Agents run: each request (whole or streamed) a step.

Invariant: ``get_response`` and ``stream_response`` record the same ``ModelResponse``
JSON (:func:`_dump`: output items as the Responses API wrote them, usage, response id),
so a run recorded one way replays the other; a replay asks no model and writes nothing
to the run's stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Protocol

from agents import Model, ModelProvider, ModelResponse, Usage
from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter

from durable.contrib.openai_agents._stream import Relay, merge, replayed_events
from durable.exceptions import PermanentError
from durable.types import ModelRecoverable


class _Session(Protocol):
    """What a model needs of its run (``_steps._Session``)."""

    ctx: Any

    async def step(self, step_id: str, body: Any, retry: Any = None) -> Any: ...

    def run_body(self, make: Callable[[], Awaitable[Any]]) -> Any: ...


_OUTPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)

#: the run whose agent task this is (set on the agent's loop, inherited by its tasks)
#: (a ``_steps._Session``)
_running: ContextVar[Any] = ContextVar("durable_oai_run", default=None)
#: inside a step's body: the run's plain model provider (for a guardrail's own Runner.run)
_in_step: ContextVar[Any] = ContextVar("durable_oai_step", default=None)


def _dump(response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    return {
        # as the API wrote them (the openai client's to_dict): by alias, only the fields
        # set. Dumped by name, ResponseFunctionToolCall's ``async_`` (alias ``async``)
        # came back as an unknown extra, which the SDK refuses to copy (an approval inside
        # an agent used as a tool) and which the next request's input items carried
        "output": [
            item.model_dump(mode="json", by_alias=True, exclude_unset=True)
            for item in response.output
        ],
        "usage": {
            "requests": usage.requests,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        },
        "response_id": response.response_id,
    }


def _load(data: dict[str, Any]) -> ModelResponse:
    return ModelResponse(
        # by name too: records written before the dump was by alias
        output=[
            _OUTPUT_ITEM.validate_python(item, by_alias=True, by_name=True)
            for item in data["output"]
        ],
        usage=Usage(**data["usage"]),
        response_id=data.get("response_id"),
    )


class DurableModel(Model):
    """A model whose ``get_response`` and ``stream_response`` are each a durable step
    recording the ``ModelResponse`` (the same record: a run recorded streamed replays
    unstreamed and the other way round). A streamed request writes the run's stream live
    (``_stream.Relay``); its replay yields the record's events (``_stream.replayed_events``)
    and writes nothing."""

    def __init__(self, model: Model, session: _Session) -> None:
        self.model = model
        self._session = session

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        model = self.model
        session = self._session
        if _in_step.get() is not None:  # inside a step's body, which records the call
            return await model.get_response(*args, **kwargs)

        def body() -> dict[str, Any]:
            return _dump(session.run_body(lambda: model.get_response(*args, **kwargs)))

        return _loaded(await session.step("model", body))

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        model = self.model
        session = self._session
        if _in_step.get() is not None:  # inside a step's body, which records the call
            async for event in model.stream_response(*args, **kwargs):
                yield event
            return
        live: asyncio.Queue[Any] = asyncio.Queue()
        ctx = session.ctx

        def body(*, idempotency_key: str) -> dict[str, Any]:
            step_id = idempotency_key[len(ctx.run_id) + 1 :]
            with ctx._step_stream(step_id, model=_model_name(model)) as out:
                relay = Relay(out.emit)

                async def call() -> ModelResponse:
                    try:
                        async for event in model.stream_response(*args, **kwargs):
                            relay.add(event)
                            live.put_nowait(event)
                    except NotImplementedError as exc:  # a failure for good: not retried
                        raise PermanentError(
                            f"step {step_id!r}: the model {_model_name(model)!r} cannot "
                            "stream (its stream_response raised NotImplementedError): "
                            "register the agent without stream=True, or give it a model "
                            "that streams"
                        ) from exc
                    return relay.response()

                response = session.run_body(call)
                out.end(**relay.ended())
            return _dump(response)

        step = asyncio.ensure_future(session.step("model", body))
        seen = [False]
        async for event in merge(step, live, seen):
            yield event
        response = _loaded(step.result())
        if not seen[0]:  # a replay: the record's events, nothing written
            for event in replayed_events(response):
                yield event


def _loaded(record: Any) -> ModelResponse:
    if isinstance(record, ModelRecoverable):  # a 400/422: the request was refused
        raise PermanentError(f"the model refused the request: {record.message}")
    return _load(record)


def _model_name(model: Model) -> str:
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else type(model).__name__


class _DurableProvider(ModelProvider):
    """The models of ``provider``, each call a step."""

    def __init__(self, provider: ModelProvider, session: _Session) -> None:
        self.provider = provider
        self._session = session

    def get_model(self, model_name: str | None) -> Model:
        model = self.provider.get_model(model_name)
        return model if isinstance(model, DurableModel) else DurableModel(model, self._session)
