"""A turn's record: what it knows while its request is on the way, its fields from a fold, and the JSONL writer.

The writer appends and flushes one line per record, so a killed agent still leaves every finished turn; prompts
and messages are compacted by reference to earlier turns (capture.TraceCompactor). The host reads these lines with
opencode_env/wire/turn.py (TurnRecord and its siblings): a change here must change those too.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from opencode_env.proxy.capture import Fold, TraceCompactor
from opencode_env.proxy.delivery import Relayed
from opencode_env.proxy.token_in import Ticket


@dataclass
class Pending:
    """A request on its way: what was sent, and what the record already knows."""

    turn: int
    started: float
    sent: dict[str, Any]
    record: dict[str, Any]
    ticket: Ticket | None = None


REFUSED_LINES = 100
"""Refused calls written one line each; past this many, only their count (at each drain): a caller that is refused
in a loop cannot grow the trace."""
CLOSING_RESERVE = 4096
"""Bytes of a bounded trace kept for the lines that close it (the budget line, the refused and dropped totals)."""


class TraceWriter:
    """Appends one JSON line per record and flushes it, so a killed agent still leaves every finished turn.

    With `max_bytes`, the file never passes it: once a turn would take it past (less CLOSING_RESERVE), no later turn
    is recorded (a later one may refer to the one left out); one `budget` line says so at once, its `dropped` the
    running count, and the last one the whole (at each drain). The calls are still relayed to the agent."""

    def __init__(self, path: str, max_bytes: int = 0) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._compactor = TraceCompactor()
        self._max_bytes = max_bytes
        self.size = os.fstat(self._fd).st_size
        self.turns_written = 0
        self.completion_tokens_written = 0
        self.refused = 0
        self.dropped = 0
        self._totals_written = (0, 0)

    def write_refused(self, reason: str, client: str) -> None:
        """A call refused before it reached the model (never a turn): `count` is the running total."""
        self.refused += 1
        if self.refused <= REFUSED_LINES:
            self._write([{"type": "refused", "count": self.refused, "reason": reason, "client": client[:100]}])

    def write_refused_total(self) -> None:
        """The closing totals, at each drain: refused calls past the lines that named them, turns left out."""
        if self._totals_written == (self.refused, self.dropped):
            return
        if self.refused > REFUSED_LINES:
            self._write([{"type": "refused", "count": self.refused}], closing=True)
        if self.dropped > 1:
            self._write([self._budget_line()], closing=True)
        self._totals_written = (self.refused, self.dropped)

    def write_turn(self, pending: Pending, fold: Fold | None) -> None:
        if self.dropped:
            self._drop()
            return
        record = pending.record
        prompt_ids = fold.prompt_token_ids if fold else []
        completion_ids = fold.ids() if fold else []
        request, prompt, blob = self._compactor.compact(pending.turn, pending.sent, prompt_ids, completion_ids)
        lines = [{"type": "tools", "sha256": blob[0], "tools": blob[1]}] if blob is not None else []
        if not self._write([*lines, {"type": "turn", **record, "request": request, **prompt}]):
            self._drop()
            return
        self.turns_written += 1
        self.completion_tokens_written += len(fold.tokens) if fold else 0

    def write_undelivered(self, relayed: Relayed) -> None:
        detail = f"the agent's connection closed before it had read the whole response ({relayed.size} bytes relayed)"
        self._write([{"type": "delivery", "turn": relayed.turn, "outcome": "undelivered", "detail": detail}])

    def _drop(self) -> None:
        self.dropped += 1
        if self.dropped == 1:
            self._write([self._budget_line()], closing=True)

    def _budget_line(self) -> dict[str, Any]:
        return {"type": "budget", "limit": self._max_bytes, "dropped": self.dropped}

    def _write(self, lines: list[dict[str, Any]], *, closing: bool = False) -> bool:
        """Written whole (all `lines` in one write) when they fit the budget (a closing line may use the reserve),
        else not at all."""
        encoded = b"".join(_encoded(line) + b"\n" for line in lines)
        if self._max_bytes:
            room = self._max_bytes - self.size - (0 if closing else CLOSING_RESERVE)
            if len(encoded) > room:
                return False
        os.write(self._fd, encoded)
        self.size += len(encoded)
        return True

    def close(self) -> None:
        os.close(self._fd)


def _encoded(line: dict[str, Any]) -> bytes:
    try:
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(line, separators=(",", ":")).encode()


def fold_outcome(fold: Fold, streamed: bool) -> tuple[str, str | None]:
    if fold.error:
        return "upstream_error", fold.error
    if streamed and not fold.done:
        return "upstream_disconnected", "the upstream stream ended without [DONE]"
    return "complete", None


def fold_record(fold: Fold, started: float, arrivals: list[tuple[int, float]]) -> dict[str, Any]:
    ended = arrivals[-1][1] if arrivals else time.monotonic()
    ttft = None
    if fold.first_token_offset is not None:
        ttft = next((at for size, at in arrivals if size >= fold.first_token_offset), ended) - started
    return {
        "finish_reason": fold.finish_reason,
        "completion_tokens": fold.tokens,
        "completion_token_ids": fold.ids(),
        "per_token_logps": fold.logprobs,
        "top_logprobs": fold.top_logprobs,
        "response": fold.message(),
        "usage": fold.usage,
        "token_id_source": fold.token_id_source(),
        "aligned": fold.aligned(),
        "latency_s": round(ended - started, 6),
        "ttft_s": None if ttft is None else round(ttft, 6),
    }
