"""What the /web page lists and who may see it: a run's row, the server that ran it, the caller asking, and the
`RunList` protocol the page's routes read through (the server's `server.runs.Runs` is one).

The page owns these shapes; the server fills them. So the viewer imports nothing of the server, and the server
composes the page's router with what it has (its run list, its way to start a run, its way to tell callers apart).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from opencode_env.wire import Phase, RolloutRequest, RolloutStatus


class RunsFull(Exception):
    """Every slot for the page's own rollouts holds one still running."""


@dataclass(frozen=True)
class Caller:
    """Who sent a request, as the server's access rule tells them apart: `id` owns the runs it starts; an
    `operator` sees every run, a caller only its own."""

    id: str
    operator: bool = False

    def may_see(self, view: RunView) -> bool:
        return self.operator or (bool(view.owner) and view.owner == self.id)


OPERATOR = Caller(id="operator", operator=True)
"""The operator's credential, and everyone on a server that cannot tell callers apart (no token: only its own
machine is served; or a network the operator declared trusted)."""


class ServerOrigin(BaseModel):
    """The server that ran a rollout, as that server recorded it in the rollout's row: set by `Runs` when the rollout
    begins, from the server's own process, never from anything of the rollout's (its request, result or sandbox)."""

    instance: str = Field(description="Random per server process: two servers never share one.")
    address: str = Field(description="host:port the server listens on; 'stdio' for the MCP server over stdio.")
    pid: int
    started_at: float = Field(description="When the server started (Unix time).")

    @classmethod
    def this_process(cls, address: str) -> ServerOrigin:
        return cls(instance=uuid.uuid4().hex, address=address, pid=os.getpid(), started_at=time.time())

    def ran(self, view: RunView) -> bool:
        """Whether `view` is this server's to list: run by this process, or by an earlier server at this address (the
        same server restarted); a row saved before servers recorded themselves is no one's."""
        origin = view.server
        return origin is not None and (origin.instance == self.instance or origin.address == self.address)


class ProgressEvent(BaseModel):
    phase: Phase
    message: str
    at_s: float = Field(description="Seconds since the run started.")


class RunView(BaseModel):
    """What the page shows of one run (never the request's key, never the whole result)."""

    id: str
    task_id: str
    instruction_head: str
    state: Literal["running", "finished", "crashed"]
    phase: Phase | None = Field(None, description="The phase reached; once finished, the one that failed, if any.")
    message: str = Field("", description="The last progress message; once finished, how the rollout ended.")
    events: list[ProgressEvent] = Field(default_factory=list)
    started_at: float
    wall_s: float | None = None
    status: RolloutStatus | None = None
    failed_phase: Phase | None = None
    reward: float | None = None
    error: str | None = None
    server: ServerOrigin | None = Field(None, description="The server that ran it (None: a row of an older version).")
    owner: str = Field(
        "", description="The caller that started it ('': a row of an older version, which only the operator sees)."
    )


class OtherServers(BaseModel):
    """What the results directory holds that this server does not list: other servers' rows, by address."""

    rows: int = 0
    addresses: dict[str, int] = Field(default_factory=dict, description="Rows per other server's address.")
    unknown: int = Field(0, description="Rows saved by an older version, which did not record its server.")


class RunList(Protocol):
    """The server's rollouts as the page reads them; every read names the caller, who sees only what it may."""

    @property
    def kept(self) -> int:
        """How many finished runs are listed."""
        ...

    @property
    def origin(self) -> ServerOrigin: ...

    def views(self, caller: Caller) -> list[RunView]:
        """The caller's runs, newest first."""
        ...

    def view(self, run_id: str, caller: Caller) -> RunView | None: ...

    async def result_json(self, run_id: str, caller: Caller) -> bytes | None: ...

    async def others(self) -> OtherServers: ...


StartRun = Callable[[RolloutRequest, Caller], RunView]
"""Starts one of the page's own rollouts for a caller (it owns the run); RunsFull when the page runs all it may."""
