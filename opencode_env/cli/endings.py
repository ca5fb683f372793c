"""How a command ends when it is told to: SIGTERM (`kill`), SIGINT (Ctrl-C) and SIGHUP (a closed terminal) cancel
the command's coroutine, so the pipeline's own `finally` closes the sandbox (no mount, directory or process left),
and the command then writes what was captured so far and prints one line, never a traceback.

A second signal while the first ending is cleaning up is noted and otherwise ignored: cutting the cleanup short is
what leaves mounts behind."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opencode_env.wire import Phase

T = TypeVar("T")

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class Ending:
    """The signal that ended a command (None: it ran to its end) and the last phase it reported."""

    received: signal.Signals | None = None
    phase: Phase | None = None
    repeated: list[signal.Signals] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
        return 128 + int(self.received) if self.received is not None else 0

    def describe(self) -> str:
        during = f" during {self.phase}" if self.phase else ""
        name = self.received.name if self.received is not None else "nothing"
        return f"ended by {name}{during}"


def run_until_signalled(coroutine: Coroutine[Any, Any, T], ending: Ending) -> T | None:
    """`asyncio.run(coroutine)`, where the first ending signal cancels it; None when a signal ended it."""

    async def guarded() -> T | None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()

        def on_signal(received: signal.Signals) -> None:
            if ending.received is None:
                ending.received = received
                task.cancel()
            else:
                ending.repeated.append(received)

        for number in ENDING_SIGNALS:
            loop.add_signal_handler(number, on_signal, number)
        try:
            return await coroutine
        except asyncio.CancelledError:
            if ending.received is None:
                raise
            return None
        finally:
            for number in ENDING_SIGNALS:
                loop.remove_signal_handler(number)

    return asyncio.run(guarded())


def say(line: str) -> None:
    """One line on stderr; a closed terminal (the SIGHUP ending) cannot take it, and the result is on disk by then."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        return
