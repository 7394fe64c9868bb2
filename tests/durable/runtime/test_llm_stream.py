"""Streamed LLM calls put together (durable/runtime/llm_stream.py): the chunks of a
``chat.completion.chunk`` stream become the dict ``ctx.llm`` records without streaming,
and the events of the run's stream (docs/streaming.md)."""

from __future__ import annotations

import json

import httpx
import pytest

from durable.exceptions import ModelRecoverableError
from durable.runtime import llm
from durable.runtime.llm_stream import Assembly, chat_stream


def chunk(delta=None, finish=None, usage=None, choices=True):
    data = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m-1",
        "system_fingerprint": "fp",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else [],
    }
    if usage is not None:
        data["usage"] = usage
    return data


USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


def assemble(chunks):
    assembly = Assembly()
    events = [e for c in chunks for e in assembly.add(c)]
    events += assembly.end_tool_calls()
    return llm.parse_response(assembly.response()), events


def test_content_deltas_are_joined_and_the_usage_chunk_is_kept():
    reply, events = assemble(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo, "}),
            chunk({"content": "world"}),
            chunk({}, finish="stop"),
            chunk(usage=USAGE, choices=False),
        ]
    )
    assert reply == {
        "content": "Hello, world",
        "refusal": None,
        "tool_calls": [],
        "finish_reason": "stop",
        "model": "m-1",
        "usage": USAGE,
        "scripted": False,
    }
    assert events == [("token", {"delta": d}) for d in ("Hel", "lo, ", "world")]


def test_tool_calls_split_across_chunks_are_put_together_by_their_index():
    """Two calls: id and name only in their first fragment, the arguments in pieces,
    the second call's fragments interleaved with the first's."""
    reply, events = assemble(
        [
            chunk({"role": "assistant", "content": None}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "c0",
                            "type": "function",
                            "function": {"name": "search", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": "ot'}}]}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "refund", "arguments": '{"amo'},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ters"}'}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": 'unt": 5}'}}]}),
            chunk({}, finish="tool_calls"),
            chunk(usage=USAGE, choices=False),
        ]
    )
    assert reply["tool_calls"] == [
        {"id": "c0", "name": "search", "arguments": {"q": "otters"}},
        {"id": "c1", "name": "refund", "arguments": {"amount": 5}},
    ]
    assert reply["content"] is None and reply["finish_reason"] == "tool_calls"
    assert reply["usage"] == USAGE
    kinds = [(k, d.get("index")) for k, d in events]
    assert kinds == [
        ("tool_call_started", 0),
        ("tool_call_delta", 0),
        ("tool_call_started", 1),
        ("tool_call_delta", 1),
        ("tool_call_delta", 0),
        ("tool_call_delta", 1),
        ("tool_call_ended", 0),
        ("tool_call_ended", 1),
    ]
    assert events[-1][1] == {"index": 1, "id": "c1", "name": "refund", "arguments": '{"amount": 5}'}


def test_a_stream_without_usage_counts_zero_and_malformed_arguments_are_model_recoverable():
    assembly = Assembly()
    for c in [
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c0", "function": {"name": "f", "arguments": '{"a": '}}
                ]
            }
        ),
        chunk({}, finish="tool_calls"),
    ]:
        assembly.add(c)
    with pytest.raises(ModelRecoverableError) as caught:
        llm.parse_response(assembly.response())
    assert caught.value.details["tool"] == "f"
    assert caught.value.details["usage"] == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
    }


SUPPORT = [
    {"role": "system", "content": "durable-script: support"},
    {
        "role": "user",
        "content": "Customer: Ann <ann@example.com>\n"
        "Message: I was charged twice, ch_42 for $12.50",
    },
]


@pytest.mark.parametrize("script", ["echo", "support"])
def test_a_streamed_reply_is_the_reply_the_same_request_gets_unstreamed(streaming_llm, script):
    """Content (echo) and four tool calls (support) from the scripted model, which
    streams as the OpenAI API does: the assembled dict equals ``llm.chat``'s."""
    messages = [{**SUPPORT[0], "content": f"durable-script: {script}"}, SUPPORT[1]]
    events = []
    streamed = chat_stream(messages, emit=lambda kind, data: events.append((kind, data)))
    assert streamed == llm.chat(messages)
    assert streamed["usage"]["total_tokens"] > 0
    if script == "echo":
        assert "".join(d["delta"] for k, d in events if k == "token") == streamed["content"]
        assert len(events) > 5  # word by word
    else:
        ended = [d for k, d in events if k == "tool_call_ended"]
        assert [json.loads(d["arguments"]) for d in ended] == [
            c["arguments"] for c in streamed["tool_calls"]
        ]


def test_the_scripted_model_streams_sse_chunks_a_usage_chunk_when_asked_and_done(streaming_llm):
    url = streaming_llm.env["OPENAI_BASE_URL"] + "/chat/completions"
    body = {"model": "scripted", "messages": SUPPORT[1:], "stream": True}
    for include_usage in (False, True):
        answer = httpx.post(url, json={**body, "stream_options": {"include_usage": include_usage}})
        assert answer.headers["content-type"] == "text/event-stream"
        lines = [x for x in answer.text.split("\n") if x]
        assert all(x.startswith("data: ") for x in lines)
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(x[6:]) for x in lines[:-1]]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        with_usage = [c for c in chunks if c.get("usage")]
        assert len(with_usage) == (1 if include_usage else 0)
        if include_usage:
            assert with_usage[0]["choices"] == [] and chunks[-1] is with_usage[0]
