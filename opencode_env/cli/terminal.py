"""What the CLI prints reaches the operator's terminal as text, never as terminal commands: task-supplied text (a
build step's line, a task id, an error quoting a Dockerfile) may hold escape sequences that clear the screen, set the
window title or rewrite earlier lines. The CLI's stderr (its progress, logs and errors) is always escaped, and so is
its stdout when that is a terminal; stdout to a pipe or a file (export's JSONL, view's page) is data and stays
exact."""

from __future__ import annotations

import re
import sys
from typing import TextIO

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 but tab and newline, DEL, C1 (U+009B is a one-character CSI to some terminals), and the bidirectional
controls that reorder what is shown."""


def escape_controls(text: str) -> str:
    """`text` with every control character shown as its escape (ESC as \\x1b, U+202E as \\u202e)."""
    return _CONTROL.sub(_escaped, text)


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


class EscapingStream:
    """A text stream that writes through `escape_controls`; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(escape_controls(text))
        return len(text)

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def guard_terminal() -> None:
    """Escape control characters in what the CLI prints from here on (stderr always; stdout on a terminal)."""
    if not isinstance(sys.stderr, EscapingStream):
        sys.stderr = EscapingStream(sys.stderr)
    if not isinstance(sys.stdout, EscapingStream) and sys.stdout.isatty():
        sys.stdout = EscapingStream(sys.stdout)
