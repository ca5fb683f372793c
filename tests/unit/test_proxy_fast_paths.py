"""The proxy's per-token fast paths give what the general paths give: the decoder holds back no body byte a read
brought, and the fold's shortcuts (one-line events, the end marker, alternatives) record the same values."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from opencode_env.proxy.capture import _event_data, fold_stream
from opencode_env.proxy.dechunk import ChunkedDecoder


def framed(pieces: list[bytes]) -> tuple[bytes, list[int]]:
    """The chunked stream of `pieces`, and for each body byte its offset in that stream."""
    stream, offsets = bytearray(), []
    for piece in pieces:
        stream += f"{len(piece):x}\r\n".encode()
        offsets.extend(range(len(stream), len(stream) + len(piece)))
        stream += piece + b"\r\n"
    return bytes(stream + b"0\r\n\r\n"), offsets


@given(
    pieces=st.lists(st.binary(min_size=1, max_size=200), max_size=10),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=30),
)
def test_every_read_gives_out_at_once_every_body_byte_it_brought(pieces: list[bytes], cuts: list[int]) -> None:
    stream, offsets = framed(pieces)
    body = b"".join(pieces)
    decoder, given_out = ChunkedDecoder(), b""
    edges = sorted({min(cut, len(stream)) for cut in cuts} | {len(stream)})
    start = 0
    for edge in edges:
        given_out += decoder.feed(stream[start:edge])
        start = edge
        arrived = sum(1 for offset in offsets if offset < edge)
        assert given_out == body[:arrived]
    assert decoder.finished


def test_a_token_that_arrives_alone_is_given_out_by_its_own_read() -> None:
    tokens = [f'data: {{"n": {n}}}\n\n'.encode() for n in range(5)]
    stream, _ = framed(tokens)
    decoder, position = ChunkedDecoder(), 0
    for token in tokens:
        frame = len(f"{len(token):x}\r\n") + len(token) + 2
        assert decoder.feed(stream[position : position + frame]) == token
        position += frame
    assert decoder.feed(stream[position:]) == b""
    assert decoder.finished


LINES = st.lists(st.sampled_from([b"data: {}", b"data:{}", b"data:  x", b": comment", b"event: e", b"", b"data"]))


@given(LINES)
def test_an_events_data_is_its_data_lines_joined(lines: list[bytes]) -> None:
    event = b"\n".join(lines)
    expected = b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))
    assert _event_data(event) == expected


def test_the_end_marker_with_spaces_still_ends_the_stream_and_a_json_event_never_does() -> None:
    assert fold_stream(b"data:  [DONE]  \n\n").done
    assert not fold_stream(b'data: {"done": "[DONE]"}\n\n').done


def test_alternatives_keep_their_text_value_and_id_whatever_their_json_type() -> None:
    entry = {
        "token": "a",
        "logprob": -1,
        "top_logprobs": [
            {"token": "token_id:42", "logprob": None},
            {"token": 7, "logprob": -0.5},
            {"token": "token_id:x", "logprob": 0},
            {"logprob": -2.25},
        ],
    }
    chunk = {"choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [entry]}}]}
    fold = fold_stream(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
    assert fold.logprobs == [-1.0]
    assert type(fold.logprobs[0]) is float
    (top,) = fold.top_logprobs
    assert top[0][0] == "token_id:42"
    assert math.isnan(top[0][1])
    assert top[0][2] == 42
    assert top[1:] == [("7", -0.5, None), ("token_id:x", 0.0, None), ("", -2.25, None)]
    assert all(type(value) is float for _, value, _ in top)
    assert fold.first_token_offset is not None
