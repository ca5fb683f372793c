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


class TraceWriter:
    """Appends one JSON line per record and flushes it, so a killed agent still leaves every finished turn."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._compactor = TraceCompactor()
        self.turns_written = 0
        self.completion_tokens_written = 0
        self.refused = 0

    def write_refused(self, reason: str, client: str) -> None:
        """A call refused before it reached the model (never a turn): `count` is the running total."""
        self.refused += 1
        if self.refused <= REFUSED_LINES:
            self._write({"type": "refused", "count": self.refused, "reason": reason, "client": client[:100]})

    def write_refused_total(self) -> None:
        if self.refused > REFUSED_LINES:
            self._write({"type": "refused", "count": self.refused})

    def write_turn(self, pending: Pending, fold: Fold | None) -> None:
        record = pending.record
        prompt_ids = fold.prompt_token_ids if fold else []
        completion_ids = fold.ids() if fold else []
        request, prompt, blob = self._compactor.compact(pending.turn, pending.sent, prompt_ids, completion_ids)
        if blob is not None:
            self._write({"type": "tools", "sha256": blob[0], "tools": blob[1]})
        self._write({"type": "turn", **record, "request": request, **prompt})
        self.turns_written += 1
        self.completion_tokens_written += len(fold.tokens) if fold else 0

    def write_undelivered(self, relayed: Relayed) -> None:
        detail = f"the agent's connection closed before it had read the whole response ({relayed.size} bytes relayed)"
        self._write({"type": "delivery", "turn": relayed.turn, "outcome": "undelivered", "detail": detail})

    def _write(self, line: dict[str, Any]) -> None:
        try:
            encoded = json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()
        except UnicodeEncodeError:
            encoded = json.dumps(line, separators=(",", ":")).encode()
        os.write(self._fd, encoded + b"\n")

    def close(self) -> None:
        os.close(self._fd)


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
