"""Real rollouts that several tests of a module read: each runs once (for the first test that asks for it) and is
checked for leaks right after (`leak_check`, what `no_leaks` checks after a test). A real OpenCode run costs
6.5-14 s of CPU, so tests that only read a result, or attacks that cannot mask each other, share one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from opencode_env.sandbox.base import SandboxBackend
from opencode_env.scripted.script import Script
from tests.helpers import Outcome, rollout


@dataclass(frozen=True)
class Plan:
    script: Script
    fields: Mapping[str, object] = field(default_factory=dict)


class SharedRollouts:
    """The module's shared rollouts by name, run on demand and kept for the module."""

    def __init__(self, backend: SandboxBackend, plans: Mapping[str, Plan], leak_check: Callable[[], None]) -> None:
        self._backend = backend
        self._plans = plans
        self._leak_check = leak_check
        self._outcomes: dict[str, Outcome] = {}
        self._failures: dict[str, Exception] = {}

    async def get(self, name: str) -> Outcome:
        """The named rollout's outcome; a rollout that failed fails each test that reads it, without running again."""
        if name in self._failures:
            raise RuntimeError(f"the shared rollout {name!r} failed in an earlier test") from self._failures[name]
        if name not in self._outcomes:
            try:
                self._outcomes[name] = await self._run(name)
            except Exception as error:
                self._failures[name] = error
                raise
        return self._outcomes[name]

    async def _run(self, name: str) -> Outcome:
        plan = self._plans[name]
        outcome = await rollout(self._backend, plan.script, **plan.fields)
        self._leak_check()
        return outcome
