"""Standard MCP sessions per caller: one tenant opening sessions cannot take the server's whole session cap
(OPENCODE_ENV_MCP_SESSIONS) from the others. The MCP SDK keeps the owner of each open session (the principal that
opened it, our caller); a caller's share is what it owns there plus the sessions it is opening right now (counted
before the SDK admits them, so a burst of concurrent openings cannot slip past). The operator is not counted."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from opencode_env.viewer.rows import Caller


@dataclass
class SessionQuota:
    per_caller: int
    owners: Callable[[], Iterable[str]]
    """The caller id of each open session's owner."""
    _opening: Counter[str] = field(default_factory=Counter)

    @contextlib.contextmanager
    def opening(self, caller: Caller | None) -> Iterator[bool]:
        """Whether `caller` may open one more session; while the block runs, the opening counts as one of its."""
        if caller is None or caller.operator:
            yield True
            return
        held = sum(1 for owner in self.owners() if owner == caller.id) + self._opening[caller.id]
        if held >= self.per_caller:
            yield False
            return
        self._opening[caller.id] += 1
        try:
            yield True
        finally:
            self._opening[caller.id] -= 1
            if not self._opening[caller.id]:
                del self._opening[caller.id]
