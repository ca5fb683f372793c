"""Progress inside the agent phase: as the proxy records model calls, the rollout reports how many and how many
tokens the model sampled so far; the last report matches what the result holds.

Both tests read one rollout (a module fixture): a write, a bash step that waits and an answer. Counting the calls holds
for any script; naming the last tool needs this one: the bash step waits for the report it is there to be seen in (its
`sleep` is ended from the host once that report came, however long the machine took), not for a time."""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash, say, write
from opencode_env.wire import RolloutResult


@dataclass
class Reported:
    result: RolloutResult
    reports: list[tuple[str, str]]


WAIT_S = 90
"""The bash step's own bound: it ends sooner as soon as the report it waits for came (the agent's limit is 120 s)."""


def _end_sleeps(argument: str) -> int:
    """SIGTERM to every `sleep ARGUMENT` on the machine (the argument carries this run's own random digits)."""
    ended = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[:2] == [
                b"sleep",
                argument.encode(),
            ]:
                os.kill(int(entry.name), signal.SIGTERM)
                ended += 1
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return ended


async def _release_when(seen: asyncio.Event, argument: str) -> None:
    """Once the awaited report came, end the bash step's sleep (it may not have started yet: OpenCode runs the tool
    after the proxy recorded the call that asked for it)."""
    await seen.wait()
    deadline = time.monotonic() + WAIT_S
    while True:
        if _end_sleeps(argument) or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.05)


def _awaited(text: str) -> bool:
    return text.startswith("2 model calls recorded") and "; last tool: write (" in text


@pytest.fixture(scope="module")
async def reported(backend: LocalBackend, leak_check: Callable[[], None]) -> Reported:
    argument = f"{WAIT_S}.{secrets.randbelow(10**6):06d}"
    script = Script(
        steps=[write("/home/user/workdir/a.txt", "a\n"), bash(f"sleep {argument}; echo waited", "Wait"), say("ok")]
    )
    reports: list[tuple[str, str]] = []
    seen = asyncio.Event()

    def progress(phase: str, text: str) -> None:
        reports.append((phase, text))
        if _awaited(text):
            seen.set()

    with ScriptedModelServer(script) as model:
        release = asyncio.ensure_future(_release_when(seen, argument))
        try:
            result = await run_rollout(demo_request(model.base_url, verify=[]), backend, progress=progress)
        finally:
            release.cancel()
            await asyncio.gather(release, return_exceptions=True)
    leak_check()
    return Reported(result, reports)


def test_the_agent_phase_reports_each_model_call(reported: Reported) -> None:
    result, reports = reported.result, reported.reports
    assert result.status == "completed", result.error
    during = [text for phase, text in reports if phase == "agent" and "model call" in text]
    calls = len(result.proxy_turns)
    tokens = sum(len(turn.completion_tokens) for turn in result.proxy_turns)
    assert during, reports
    assert during[-1].startswith(f"{calls} model calls recorded, {tokens} tokens sampled")
    counts = [int(text.split()[0]) for text in during]
    assert counts == sorted(counts), during
    for before, after in itertools.pairwise(during):
        if before.split()[0] == after.split()[0]:
            assert "last tool:" not in before, "a count repeats only to name the tool"
            assert "last tool:" in after, "a count repeats only to name the tool"


def test_the_progress_names_the_last_tool_opencode_finished(reported: Reported) -> None:
    assert reported.result.status == "completed", reported.result.error
    texts = [text for _, text in reported.reports]
    assert any(_awaited(text) for text in texts), texts
