"""The SSE parser on streams cut at every possible byte, and the chunk interpretation."""

from __future__ import annotations

import json

import pytest

from gridbench.harness.sse import SSEEvent, SSEParser, StreamChunk, parse_chunk, plain_delta_has_text

VLLM_STREAM = (
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"reasoning":"Let me"}}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Caf\xc3\xa9 \xe2\x98\x95"}}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)


def parse_all(chunks: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    events = [e for chunk in chunks for e in parser.feed(chunk)]
    return events + parser.finish()


def splits(data: bytes) -> list[list[bytes]]:
    """The stream whole, byte by byte, and cut in two at every position."""
    return [[data], [data[i : i + 1] for i in range(len(data))]] + [
        [data[:i], data[i:]] for i in range(len(data))
    ]


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_every_cut_of_a_stream_gives_the_same_events(line_end):
    data = VLLM_STREAM.replace(b"\n", line_end)
    expected = parse_all([data])
    assert len(expected) == 6 and expected[-1] == SSEEvent(None, "[DONE]")
    assert json.loads(expected[2].data)["choices"][0]["delta"]["content"] == "Café ☕"
    for chunks in splits(data):
        assert parse_all(chunks) == expected
    one_event_each = [event + line_end * 2 for event in data.split(line_end * 2) if event]
    assert parse_all(one_event_each) == expected  # the usual reads: one whole event each


@pytest.mark.parametrize(
    ("stream", "events"),
    [
        pytest.param(b"data: [DONE]\n\n", [SSEEvent(None, "[DONE]")], id="done"),
        pytest.param(b"data:[DONE]\n\n", [SSEEvent(None, "[DONE]")], id="done-without-space"),
        pytest.param(b"data:  two spaces\n\n", [SSEEvent(None, " two spaces")], id="only-one-space-stripped"),
        pytest.param(b": keep-alive\n\ndata: x\n\n", [SSEEvent(None, "x")], id="comment"),
        pytest.param(b"data: a\ndata: b\n\n", [SSEEvent(None, "a\nb")], id="multi-line-data"),
        pytest.param(b"event: error\ndata: {}\n\n", [SSEEvent("error", "{}")], id="named-event"),
        pytest.param(
            b'error: {"code":500,"message":"boom"}\n\n',
            [SSEEvent("error", '{"code":500,"message":"boom"}')],
            id="llamacpp-error-line",
        ),
        pytest.param(b"id: 7\nretry: 10\n\n", [], id="fields-without-data"),
        pytest.param(b"\n\n\n", [], id="blank-lines"),
        pytest.param(b"data: last without blank line", [SSEEvent(None, "last without blank line")], id="eof"),
        pytest.param(
            b"data: x\n\nevent: orphan\n\ndata: y\n\n",
            [SSEEvent(None, "x"), SSEEvent(None, "y")],
            id="event-without-data-resets",
        ),
        pytest.param(b"data: \xff\xfe\n\n", [SSEEvent(None, "\ufffd\ufffd")], id="invalid-utf8"),
        pytest.param(b"data\n\n", [SSEEvent(None, "")], id="field-without-colon"),
    ],
)
def test_edge_cases(stream, events):
    for chunks in splits(stream):
        assert parse_all(chunks) == events


@pytest.mark.parametrize(
    ("data", "event", "chunk"),
    [
        pytest.param("[DONE]", None, StreamChunk(done=True), id="done"),
        pytest.param(
            '{"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}',
            None,
            StreamChunk(text="hi"),
            id="content",
        ),
        pytest.param(
            '{"choices":[{"delta":{"reasoning_content":"hmm"}}]}',
            None,
            StreamChunk(text="hmm"),
            id="reasoning_content",
        ),
        pytest.param(
            '{"choices":[{"delta":{"reasoning":"so"}}]}', None, StreamChunk(text="so"), id="reasoning"
        ),
        pytest.param(
            '{"choices":[{"delta":{"role":"assistant","content":null}}]}', None, StreamChunk(), id="role-only"
        ),
        pytest.param('{"choices":[{"delta":{"content":""}}]}', None, StreamChunk(), id="empty-content"),
        pytest.param(
            '{"choices":[{"delta":{},"finish_reason":"stop"}]}',
            None,
            StreamChunk(finish_reason="stop"),
            id="finish",
        ),
        pytest.param(
            '{"choices":[],"usage":{"completion_tokens":512,"prompt_tokens":9}}',
            None,
            StreamChunk(
                completion_tokens=512, counts=(("usage.completion_tokens", 512), ("usage.prompt_tokens", 9))
            ),
            id="usage",
        ),
        pytest.param('{"choices":[],"usage":null}', None, StreamChunk(), id="usage-null"),
        pytest.param(
            '{"error":{"message":"out of memory","type":"InternalServerError","code":500}}',
            None,
            StreamChunk(error="500: out of memory"),
            id="openai-error-object",
        ),
        pytest.param(
            '{"code":500,"message":"slot unavailable","type":"server_error"}',
            "error",
            StreamChunk(error="500: slot unavailable"),
            id="llamacpp-error-event",
        ),
        pytest.param("not json", "error", StreamChunk(error="not json"), id="error-event-plain-text"),
        pytest.param("garbage {", None, StreamChunk(ignored="not JSON: 'garbage {'"), id="non-json"),
        pytest.param("[1, 2]", None, StreamChunk(ignored="not a JSON object: '[1, 2]'"), id="json-array"),
    ],
)
def test_parse_chunk(data, event, chunk):
    assert parse_chunk(SSEEvent(event, data)) == chunk


PLAIN_DELTA_CASES = [
    # vLLM's and llama.cpp's token chunks, with and without spaces after the colons
    '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
    '"choices":[{"index":0,"delta":{"content":" t1"},"logprobs":null,"finish_reason":null}]}',
    '{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"x"}}],"created":1,"id":"c",'
    '"model":"m","object":"chat.completion.chunk","timings":{"predicted_n":3}}',
    '{"choices": [{"delta": {"content": "spaced"}, "finish_reason": null}]}',
    '{"choices":[{"delta":{"content":"\\"quoted\\" \\\\"}}]}',
    '{"choices":[{"delta":{"content":"says \\"usage\\": none"}}]}',
    '{"choices":[{"delta":{"role":"assistant","content":""}}]}',
    '{"choices":[{"delta":{"role":"assistant","content":null}}]}',
    '{"choices":[{"delta":{"reasoning_content":"hmm"}}]}',
    '{"choices":[{"delta":{"content":"","reasoning":"so"}}]}',
    '{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\\"content\\":\\"x\\"}"}}]}}]}',
    '{"choices":[{"delta":{"content":"usage"}}]}',  # a token that names a marker: full parse
    '{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}',
    '{"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":4}}',
    '{"choices":[],"usage":{"completion_tokens":4}}',
    '{"error":{"message":"boom"},"choices":[{"delta":{"content":"a"}}]}',
    "[DONE]",
    "garbage {",
]


@pytest.mark.parametrize("data", PLAIN_DELTA_CASES)
@pytest.mark.parametrize("event", [None, "error"])
def test_the_plain_delta_shortcut_agrees_with_the_full_parse(data, event):
    """Where it answers, the shortcut says what parse_chunk says and there is nothing else
    in the event (no finish reason, usage, error or end marker); else it defers."""
    plain = plain_delta_has_text(SSEEvent(event, data))
    full = parse_chunk(SSEEvent(event, data))
    if plain is not None:
        assert full == StreamChunk(text=full.text) and plain == full.has_text


def test_the_plain_delta_shortcut_answers_for_token_chunks():
    answered = [plain_delta_has_text(SSEEvent(None, data)) for data in PLAIN_DELTA_CASES[:10]]
    assert answered == [True, True, True, True, True, False, False, True, True, False]
