"""The built-in scripted model's launcher: `model="scripted"` (the one `opencode-env demo` uses) as the policy, so a
newcomer runs any task end to end, from the CLI, the server or Python, with no model server and no key. The rule
that picks it (rollout/endpoints.py) calls `builtin_scripted_url`; the pipeline imports this module, never the test
doubles beside it, and nothing here imports the pipeline.

A request naming model "scripted" with no base_url (and no operator URL for its endpoint) gets this process's own
scripted model, started on loopback on first use and kept for the process's life. Its built-in behaviour: the agent
lists the work dir with its bash tool, then answers that it is done (two captured turns, the capture proxy and
OpenCode's whole loop exercised; the task is not solved). `opencode-env run --model scripted --script FILE` plays a
script of one's own instead (see docs/scripted-model.md). Loopback is reachable from the local backend's sandboxes
only (a cloud sandbox cannot reach this machine)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from opencode_env.scripted.script import Script, bash, say

BUILTIN_MODEL = "scripted"
"""The model name a request gives for the built-in scripted model, and the one it serves (any other is a 404)."""

if TYPE_CHECKING:
    from opencode_env.scripted.model import ScriptedModelServer


def builtin_script() -> Script:
    return Script(
        steps=[
            bash("ls -la", "List the work dir"),
            say("I looked at the work dir. This is the built-in scripted model: it does not solve tasks."),
        ]
    )


def solving_script(solve_sh: str) -> Script:
    """A Harbor task's solution/solve.sh played by the agent through its bash tool: the whole pipeline (capture,
    verify, reward) on one's own task, with a reward that says whether the task and its tests fit together."""
    return Script(steps=[bash(solve_sh, "Run the task's solution/solve.sh"), say("I ran the task's solution.")])


class _ScriptedModels:
    """One scripted model per process, started on first use (a thread serving loopback); never a cost otherwise."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: ScriptedModelServer | None = None

    def base_url(self) -> str:
        with self._lock:
            if self._server is None:
                from opencode_env.scripted.model import ScriptedModelServer  # its web stack, on first use

                server = ScriptedModelServer(builtin_script(), model_name=BUILTIN_MODEL)
                server.__enter__()
                self._server = server
            return self._server.base_url


_MODELS = _ScriptedModels()


def builtin_scripted_url() -> str:
    """The base URL of this process's built-in scripted model (started now if it is not yet)."""
    return _MODELS.base_url()
