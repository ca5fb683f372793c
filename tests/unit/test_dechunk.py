"""The proxy's chunked decoder: any way the socket splits a chunked body, the same body comes out, in order."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opencode_env.proxy.dechunk import ChunkedDecoder


def chunked(pieces: list[bytes], trailer: bytes = b"") -> bytes:
    framed = b"".join(f"{len(p):x};ext=1\r\n".encode() + p + b"\r\n" for p in pieces if p)
    return framed + b"0\r\n" + trailer + b"\r\n"


def decode(stream: bytes, cuts: list[int]) -> tuple[bytes, ChunkedDecoder, list[bytes]]:
    decoder = ChunkedDecoder()
    edges = [0, *sorted({min(cut, len(stream)) for cut in cuts}), len(stream)]
    outputs = [decoder.feed(stream[start:end]) for start, end in itertools.pairwise(edges)]
    return b"".join(outputs), decoder, outputs


@given(
    pieces=st.lists(st.binary(min_size=0, max_size=300), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=40),
    trailer=st.sampled_from([b"", b"x-trailer: 1\r\n"]),
)
def test_every_split_gives_the_whole_body_and_the_end(pieces: list[bytes], cuts: list[int], trailer: bytes) -> None:
    body, decoder, _ = decode(chunked(pieces, trailer), cuts)
    assert body == b"".join(pieces)
    assert decoder.finished
    assert decoder.leftover == b""


def test_a_read_of_many_chunks_is_one_piece_and_a_partial_chunk_goes_out_at_once() -> None:
    stream = chunked([b"data: a\n\n", b"data: b\n\n", b"data: c\n\n"])
    _, _, outputs = decode(stream, [])
    assert outputs == [b"data: a\n\ndata: b\n\ndata: c\n\n"]
    _, decoder, outputs = decode(chunked([b"0123456789"]), [len(b"a;ext=1\r\n") + 3])
    assert outputs == [b"012", b"3456789"]
    assert decoder.finished


def test_bytes_after_the_end_are_kept_apart() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(chunked([b"abc"]) + b"HTTP/1.1 200 OK\r\n") == b"abc"
    assert decoder.finished
    assert decoder.leftover == b"HTTP/1.1 200 OK\r\n"


@pytest.mark.parametrize(
    "stream",
    [b"zz\r\nabc\r\n", b"-3\r\nabc\r\n", b"1_0\r\n", b"3\r\nabcXY0\r\n\r\n", b"0x3\r\nabc\r\n", b"f" * 5000],
    ids=["not hex", "negative", "underscore", "no CRLF after data", "0x prefix", "endless size line"],
)
def test_framing_that_is_not_chunked_http_is_an_error(stream: bytes) -> None:
    with pytest.raises(ValueError, match="chunk"):
        ChunkedDecoder().feed(stream)
