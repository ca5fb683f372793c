"""HTTP/1.1 chunked transfer decoding as an incremental state machine, without I/O.

Feed it whatever one socket read returned; it gives back every body byte that read completed. Reading the socket
once per wakeup instead of once per chunk lets the proxy forward a burst of tokens with one write, and bytes of a
chunk that has not fully arrived go out at once instead of waiting for its end.

Why not h11 or httptools: a general parser hands back one event per chunk (one per token here), the per-read cost
upstream.py's docstring measures against httpx (which parses with h11); this decoder is the part of that client that
keeps a burst of tokens to one write.
"""

from __future__ import annotations

import re
from enum import Enum

MAX_LINE = 4096
HEX_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


class _State(Enum):
    SIZE = "size"
    DATA = "data"
    DATA_END = "data_end"
    TRAILER = "trailer"
    DONE = "done"


class ChunkedDecoder:
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._state = _State.SIZE
        self._remaining = 0
        self.leftover = b""
        """Bytes that arrived after the body's end (none from a well-behaved server)."""

    @property
    def finished(self) -> bool:
        return self._state is _State.DONE

    def feed(self, data: bytes) -> bytes:
        """The body bytes `data` completes, in order; raises ValueError on framing that is not chunked HTTP/1.1."""
        if self._state is _State.DONE:
            self.leftover += data
            return b""
        buffer = self._buffer
        buffer += data
        body = bytearray()
        position = 0
        while self._state is not _State.DONE:
            if self._state is _State.DATA:
                take = min(self._remaining, len(buffer) - position)
                if take == 0:
                    break
                body += buffer[position : position + take]
                position += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = _State.DATA_END
                continue
            if self._state is _State.DATA_END:
                if len(buffer) - position < 2:
                    break
                if buffer[position : position + 2] != b"\r\n":
                    raise ValueError("a chunk's data is not followed by CRLF")
                position += 2
                self._state = _State.SIZE
                continue
            end = buffer.find(b"\r\n", position)
            if end < 0:
                if len(buffer) - position > MAX_LINE:
                    raise ValueError(f"a chunk-size or trailer line is over {MAX_LINE} bytes")
                break
            line = bytes(buffer[position:end])
            position = end + 2
            if self._state is _State.SIZE:
                self._start_chunk(line)
            elif not line:
                self._state = _State.DONE
        if self._state is _State.DONE:
            self.leftover = bytes(buffer[position:])
            position = len(buffer)
        del buffer[:position]
        return bytes(body)

    def _start_chunk(self, line: bytes) -> None:
        size_text = line.split(b";", 1)[0].strip()
        if not HEX_SIZE.fullmatch(size_text):
            raise ValueError(f"not a chunk-size line: {line[:100]!r}")
        size = int(size_text, 16)
        if size == 0:
            self._state = _State.TRAILER
        else:
            self._remaining = size
            self._state = _State.DATA
