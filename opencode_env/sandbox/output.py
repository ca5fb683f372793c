"""Bounded capture of a command's output: the head and the tail are kept, the middle is dropped and counted."""

from __future__ import annotations


class BoundedOutput:
    def __init__(self, limit: int) -> None:
        self._half = max(limit // 2, 1)
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._half - len(self._head)
        if room > 0:
            self._head.extend(data[:room])
            data = data[room:]
        if data:
            self._tail.extend(data)
            if len(self._tail) > self._half:
                del self._tail[: len(self._tail) - self._half]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + len(self._tail)

    def text(self) -> str:
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        if not self.truncated:
            return head + tail
        dropped = self.total - len(self._head) - len(self._tail)
        return f"{head}\n[... {dropped} bytes dropped ...]\n{tail}"


def tail_text(data: bytes, limit: int) -> str:
    return data[-limit:].decode("utf-8", errors="replace")
