"""Streamed model calls against the chunk shapes real providers send (docs/streaming.md),
each drawn from a public bug report in a tool that assembles the same streams.

The model here is not the scripted one: ``provider`` serves a given list of
``chat.completion.chunk`` dicts as server-sent events (optionally cut into byte pieces
at awkward places) through ``httpx.MockTransport``, to the ``openai`` client that
``ctx.llm(stream=True)`` uses, so each case goes through the whole path: the client's
SSE parsing, the assembly (``durable/runtime/llm_stream.py``), the stream writer and the
step's record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

import durable
from durable.models import RunStatus, Step, StreamEvent
from durable.runtime import llm
from durable.testing import drive
from tests import stream_workflows  # noqa: F401  (registers the workflows)

# transactional: the stream's writer commits from a thread of its own, as in a worker
pytestmark = pytest.mark.django_db(transaction=True)

USAGE = {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}


def chunk(delta: Any = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with a first choice (``delta`` ``None``: no delta
    key at all, as Azure's content-filter annotations have)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    return {
        "id": "chatcmpl-7",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m-real",
        "choices": [choice],
        **extra,
    }


def usage_chunk(usage: dict[str, int] = USAGE) -> dict[str, Any]:
    return {
        "id": "chatcmpl-7",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m-real",
        "choices": [],
        "usage": usage,
    }


def sse_bytes(chunks: list[dict[str, Any]]) -> bytes:
    lines = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


@pytest.fixture
def provider(monkeypatch) -> Callable[..., list[dict[str, Any]]]:
    """``provider(chunks, pieces=None)``: the model's next streamed answers are these
    chunks; ``pieces`` cuts the body's bytes into the pieces the client reads (a
    function of the bytes). Returns the list of requests it got (their JSON)."""
    requests: list[dict[str, Any]] = []
    answers: list[tuple[list[dict[str, Any]], Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(json.loads(request.content))
        chunks, pieces = answers.pop(0) if len(answers) > 1 else answers[0]
        body = sse_bytes(chunks)
        parts = pieces(body) if pieces else [body]
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=iter(parts)
        )

    client = openai.OpenAI(
        base_url="http://provider.test/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    monkeypatch.setattr(llm, "client", lambda timeout=60.0: client)

    def serve(chunks, pieces=None):
        answers.append((chunks, pieces))
        return requests

    return serve


def run_chat(message: str = "hi") -> Any:
    run = drive(durable.start("stream.chat", {"message": message}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def events_of(run_id: str) -> list[StreamEvent]:
    return list(StreamEvent.objects.filter(run_id=run_id).order_by("seq"))


def call_start(index: Any, call_id: str, name: str, arguments: str = "") -> dict[str, Any]:
    fragment: dict[str, Any] = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    if index is not None:
        fragment["index"] = index
    return {"tool_calls": [fragment]}


def call_args(index: Any, arguments: str) -> dict[str, Any]:
    fragment: dict[str, Any] = {"function": {"arguments": arguments}}
    if index is not None:
        fragment["index"] = index
    return {"tool_calls": [fragment]}


def test_argument_fragments_without_an_index_continue_the_call_they_follow(provider):
    """Gemini's OpenAI-compatible stream (and other compatible servers) leave
    ``tool_calls[].index`` out of every fragment, the follow-up argument fragments too:
    https://github.com/openai/openai-python/pull/3246 (fixes openai-python#2806),
    https://github.com/AstrBotDevs/AstrBot/pull/6692. A fragment with neither id nor name
    continues the call before it; it is not a new nameless call."""
    provider(
        [
            chunk({"role": "assistant", "content": None}),
            chunk(call_start(None, "call_a", "get_weather")),
            chunk(call_args(None, '{"city": ')),
            chunk(call_args(None, '"Oslo"}')),
            chunk({}, finish="tool_calls"),
            usage_chunk(),
        ]
    )
    run = run_chat()
    reply = run.output_value()
    assert reply["tool_calls"] == [
        {"id": "call_a", "name": "get_weather", "arguments": {"city": "Oslo"}}
    ]
    events = events_of(run.id)
    assert [e.data["name"] for e in events if e.kind == "tool_call_started"] == ["get_weather"]
    (ended,) = [e.data for e in events if e.kind == "tool_call_ended"]
    assert ended == {
        "index": 0,
        "id": "call_a",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
    }


def test_parallel_calls_that_all_say_index_0_are_kept_apart_by_their_ids(provider):
    """Ollama streams every call of a parallel batch with ``index: 0`` (and Gemini
    proxies did the same): assembling by index alone glues them into one call whose
    arguments are ``{..}{..}``, not JSON.
    https://github.com/huggingface/smolagents/pull/1958,
    https://github.com/LibreChat-AI/agents/pull/260 (ollama/ollama#15457),
    https://github.com/su-kaka/gcli2api/pull/406. A fragment for an index whose call
    already has another id is a new call; the fragments after it, with no id, are its."""
    provider(
        [
            chunk(call_start(0, "call_1", "get_weather", '{"city": "Paris"}')),
            chunk(call_start(0, "call_2", "get_weather", '{"city": ')),
            chunk(call_args(0, '"Rome"}')),
            chunk(call_start(0, "call_3", "get_time", '{"tz": "CET"}')),
            chunk({}, finish="tool_calls"),
            usage_chunk(),
        ]
    )
    run = run_chat()
    assert run.output_value()["tool_calls"] == [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}},
        {"id": "call_2", "name": "get_weather", "arguments": {"city": "Rome"}},
        {"id": "call_3", "name": "get_time", "arguments": {"tz": "CET"}},
    ]
    events = events_of(run.id)
    started = [(e.data["id"], e.data["name"]) for e in events if e.kind == "tool_call_started"]
    assert started == [("call_1", "get_weather"), ("call_2", "get_weather"), ("call_3", "get_time")]
    ended = [e.data for e in events if e.kind == "tool_call_ended"]
    assert [json.loads(d["arguments"]) for d in ended] == [
        {"city": "Paris"},
        {"city": "Rome"},
        {"tz": "CET"},
    ]
    assert len({d["index"] for d in ended}) == 3  # a reader keys the calls by index


def test_a_name_and_id_repeated_in_every_fragment_are_not_doubled(provider):
    """Fireworks and Kimi send the whole tool name (and id) again in every fragment;
    appending it gave ``browser_navigatebrowser_navigate``:
    https://github.com/NousResearch/hermes-agent/pull/8094,
    https://github.com/continuedev/continue/pull/5849."""
    provider(
        [
            chunk(call_start(0, "call_x", "browser_navigate", '{"url": ')),
            chunk(call_start(0, "call_x", "browser_navigate", '"https://a.example"}')),
            chunk({}, finish="tool_calls"),
            usage_chunk(),
        ]
    )
    run = run_chat()
    assert run.output_value()["tool_calls"] == [
        {"id": "call_x", "name": "browser_navigate", "arguments": {"url": "https://a.example"}}
    ]
    events = events_of(run.id)
    assert [e.kind for e in events].count("tool_call_started") == 1
    (ended,) = [e.data for e in events if e.kind == "tool_call_ended"]
    assert ended["name"] == "browser_navigate" and ended["id"] == "call_x"


def test_azure_content_filter_annotations_and_a_filtered_end_are_recorded_as_such(provider):
    """Azure OpenAI streams a first chunk with ``choices: []``, ``id: ""``, ``model: ""``
    and ``prompt_filter_results``, choices that carry ``content_filter_results`` and no
    ``delta``, and may end with ``finish_reason: "content_filter"``:
    https://github.com/AbanteAI/archive-old-cli-mentat/issues/429,
    https://github.com/microsoft/autogen/issues/6465,
    https://github.com/langchain-ai/langchain/issues/18977. The reply is the text that
    came, its end says it was filtered, and the model and id are the real ones."""
    annotation = {"hate": {"filtered": False, "severity": "safe"}}
    provider(
        [
            {
                "id": "",
                "object": "",
                "created": 0,
                "model": "",
                "choices": [],
                "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
            },
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Here is"}, content_filter_results=annotation),
            chunk({"content": " part"}),
            {
                "id": "",
                "object": "",
                "created": 0,
                "model": "",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": None,
                        "content_filter_results": annotation,
                        "content_filter_offsets": {"check_offset": 0, "start_offset": 0},
                    }
                ],
            },
            chunk({}, finish="content_filter"),
            usage_chunk(),
        ]
    )
    run = run_chat()
    reply = run.output_value()
    assert reply["content"] == "Here is part"
    assert reply["finish_reason"] == "content_filter" and reply["model"] == "m-real"
    events = events_of(run.id)
    assert events[-1].kind == "step_ended"
    assert events[-1].data["finish_reason"] == "content_filter"
    assert "".join(e.data["delta"] for e in events if e.kind == "token") == "Here is part"


def test_usage_sent_with_every_chunk_is_counted_once_as_its_last_total(provider):
    """vLLM/SGLang ``continuous_usage_stats`` and Gemini put a cumulative ``usage`` on
    every chunk; summing them overcounted the run's tokens and cost:
    https://github.com/docker/docker-agent/pull/1855,
    https://github.com/open-webui/open-webui/issues/29064,
    https://github.com/InsForge/InsForge/issues/2015."""
    running = [
        {"prompt_tokens": 9, "completion_tokens": n, "total_tokens": 9 + n} for n in (1, 2, 3)
    ]
    provider(
        [
            chunk({"content": "one"}, usage=running[0]),
            chunk({"content": " two"}, usage=running[1]),
            chunk({"content": " three"}, finish="stop", usage=running[2]),
            usage_chunk(running[2]),
        ]
    )
    run = run_chat()
    assert run.output_value()["usage"] == running[2]
    assert run.tokens_used == 12
    assert events_of(run.id)[-1].data["usage"] == running[2]


def test_multibyte_text_cut_mid_character_on_the_wire_arrives_whole(provider):
    """Network reads cut a UTF-8 character (CJK, emoji) in the middle; decoding each
    read alone turned it into U+FFFD: https://github.com/ollama/ollama-js/issues/255,
    https://github.com/lobehub/lobehub/pull/18805,
    https://github.com/danielmiessler/Fabric/pull/2203. Here the body is read three
    bytes at a time, so every multi-byte character is split across reads."""
    words = ["你好", "世界 ", "🌍", " naïve ", "😀😀"]
    provider(
        [chunk({"content": w}) for w in words] + [chunk({}, finish="stop"), usage_chunk()],
        pieces=lambda body: [body[i : i + 3] for i in range(0, len(body), 3)],
    )
    run = run_chat()
    text = "".join(words)
    assert run.output_value()["content"] == text
    streamed = "".join(e.data["delta"] for e in events_of(run.id) if e.kind == "token")
    assert streamed == text and "\ufffd" not in streamed


def test_a_nul_character_in_a_token_does_not_break_the_stream_or_the_record(provider):
    """PostgreSQL's ``jsonb`` refuses ``\\u0000`` ("unsupported Unicode escape
    sequence"), and models do emit NUL: a checkpoint or event with it failed to save:
    https://github.com/Autumn-27/ARTEX/issues/112,
    https://github.com/SciPhi-AI/R2R/issues/1264. The record keeps the text; the
    stream has it with NUL as the four characters ``\\x00`` (its events are stored as
    any storable JSON, durable/values/fields.py), and nothing after the NUL is lost."""
    provider(
        [
            chunk({"content": "before\x00"}),
            chunk({"content": " after"}),
            chunk({}, finish="stop"),
            usage_chunk(),
        ]
    )
    run = run_chat()
    content = run.output_value()["content"]
    assert content == "before\x00 after"
    events = events_of(run.id)
    streamed = "".join(e.data["delta"] for e in events if e.kind == "token")
    assert streamed == "before\\x00 after"
    assert events[-1].kind == "step_ended" and events[-1].data["finish_reason"] == "stop"


def test_a_streamed_refusal_reaches_the_reader_and_the_record(provider):
    """OpenAI streams a refusal in ``delta.refusal`` (structured outputs, safety), not in
    ``delta.content``; clients that read only content dropped it and showed nothing:
    https://github.com/langchain-ai/langchain/issues/39747,
    https://github.com/langchain4j/langchain4j/pull/5814,
    https://github.com/MacPaw/OpenAI/pull/408."""
    provider(
        [
            chunk({"role": "assistant", "content": None, "refusal": ""}),
            chunk({"refusal": "I'm sorry, I can't "}),
            chunk({"refusal": "help with that."}),
            chunk({}, finish="stop"),
            usage_chunk(),
        ]
    )
    run = run_chat()
    refusal = "I'm sorry, I can't help with that."
    assert run.output_value().get("refusal") == refusal
    refused = [e for e in events_of(run.id) if e.kind == "refusal"]
    assert "".join(e.data["delta"] for e in refused) == refusal
    assert not [e for e in events_of(run.id) if e.kind == "token"]


def test_the_request_asks_for_a_stream_with_usage_and_is_recorded_once(provider):
    """The harness itself: one streamed request (``stream_options.include_usage``, as
    docs/streaming.md says), one step recording the reply."""
    requests = provider([chunk({"content": "ok"}, finish="stop"), usage_chunk()])
    run = run_chat()
    assert len(requests) == 1
    assert requests[0]["stream"] is True
    assert requests[0]["stream_options"] == {"include_usage": True}
    (step,) = Step.objects.filter(run=run)
    assert step.output_value()["content"] == "ok"
