"""Fail fast on a dead upstream: after a few consecutive calls that could not connect, or a longer run of 5xx
answers, the proxy answers the agent with a neutral 400, which OpenCode does not retry (it would otherwise retry
each call for about a minute). Any successful call closes the breaker again."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Breaker:
    max_unreachable: int
    max_server_errors: int
    unreachable: int = 0
    server_errors: int = 0

    def succeeded(self) -> None:
        self.unreachable = self.server_errors = 0

    def could_not_connect(self) -> str | None:
        """Count a call that could not reach the upstream; the reason to stop the agent once the limit is hit."""
        self.unreachable += 1
        if self.unreachable >= self.max_unreachable:
            return f"the model endpoint is unreachable ({self.unreachable} consecutive calls could not connect)"
        return None

    def server_error(self) -> str | None:
        """Count a 5xx answer; the reason to stop the agent once the (longer) limit is hit."""
        self.server_errors += 1
        if self.server_errors >= self.max_server_errors:
            return f"the model endpoint keeps failing ({self.server_errors} consecutive 5xx answers)"
        return None
