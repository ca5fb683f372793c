"""The capture proxy's files are bounded: a flood of large calls through the real proxy ends its record at the
bound, keeps every turn before it, says how many it left out, and still relays every call; the kernel holds the
bound for any file the proxy writes; on the local backend both files count against the rollout's disk."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_env.rollout.collect_phase import budget_warning
from opencode_env.sandbox.base import PROXY_TRACE_READ_BYTES, ResourceLimits, SandboxSpec, proxy_file_bytes
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash, say, write
from opencode_env.testing.proxy_process import running_proxy
from opencode_env.wire import parse_trace
from tests.helpers import rollout
from tests.integration.test_proxy_http import VLLM, body, post

BOUND = 4 * 2**20
CALL_BYTES = 1_000_000


async def test_a_flood_of_large_calls_ends_the_record_at_its_bound_and_keeps_the_turns_before_it(
    tmp_path: Path,
) -> None:
    """Twenty 1 MB calls, each new (nothing to compact by reference), through a proxy bounded at 4 MiB: every call
    is answered; the trace stays under the bound, holds the first turns whole and a budget line counting the rest."""
    calls = 20
    script = Script(steps=[say(f"answer {index}") for index in range(calls)])
    with (
        ScriptedModelServer(script) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--max-file-bytes", str(BOUND)) as proxy,
    ):
        statuses = []
        for index in range(calls):
            messages = [{"role": "user", "content": f"{index} " + "x" * CALL_BYTES}]
            response, _raw = await post(proxy.url, body(messages=messages))
            statuses.append(response.status_code)
        proxy.wait_for(lambda trace: trace.budget is not None)
    trace = parse_trace(proxy.trace_path.read_text())
    assert statuses == [200] * calls
    assert len(model.exchanges) == calls
    size = proxy.trace_path.stat().st_size
    assert size <= BOUND
    assert trace.problems == []
    kept = [turn.response["content"] for turn in trace.turns]
    assert kept == [f"answer {index}" for index in range(len(kept))]
    assert 2 <= len(kept) <= 4
    assert trace.budget is not None
    assert trace.budget.limit == BOUND
    assert trace.budget.dropped == calls - len(kept)
    lines = [json.loads(line) for line in proxy.trace_path.read_bytes().splitlines()]
    assert [line["dropped"] for line in lines if line["type"] == "budget"] == [1, calls - len(kept)]
    assert "4.0 MiB" in budget_warning(trace.budget)


async def test_the_last_budget_line_at_a_drain_counts_every_call_left_out(tmp_path: Path) -> None:
    script = Script(steps=[say("a"), say("b"), say("c")])
    with (
        ScriptedModelServer(script) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--max-file-bytes", str(BOUND)) as proxy,
    ):
        for index in range(3):
            messages = [{"role": "user", "content": f"{index} " + "y" * (3 * CALL_BYTES)}]
            await post(proxy.url, body(messages=messages))
        proxy.wait_for(lambda trace: trace.budget is not None)
        proxy.process.terminate()
        proxy.process.wait(timeout=15)
    trace = parse_trace(proxy.trace_path.read_text())
    assert [turn.response["content"] for turn in trace.turns] == ["a"]
    assert trace.budget is not None
    assert trace.budget.dropped == 2
    assert proxy.trace_path.stat().st_size <= BOUND


def test_no_file_the_proxy_writes_passes_the_bound_whoever_writes_it(tmp_path: Path) -> None:
    """The kernel's bound, below the writer's: a write past it fails (EFBIG), the process lives on."""
    target = tmp_path / "log"
    program = (
        "import os, sys\n"
        "from opencode_env.proxy.__main__ import bound_files\n"
        "bound_files(4096)\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
        "print(os.write(fd, b'x' * 4000), os.write(fd, b'y' * 200))\n"
        "try:\n    os.write(fd, b'z')\nexcept OSError as error:\n    print(error.errno)\n"
    )
    done = subprocess.run([sys.executable, "-c", program, str(target)], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["4000", "96", str(errno.EFBIG)]
    assert target.stat().st_size == 4096


def test_each_file_gets_a_sixteenth_of_the_disk_within_what_the_host_reads() -> None:
    assert proxy_file_bytes(64) == 4 * 2**20
    assert proxy_file_bytes(8) == 2 * 2**20
    assert proxy_file_bytes(1_048_576) == PROXY_TRACE_READ_BYTES


async def test_the_proxys_files_count_against_the_rollouts_disk(backend: LocalBackend) -> None:
    """A 64 MiB rollout's tree holds 64 MiB less the proxy's two files (4 MiB each)."""
    sandbox = await backend.create(SandboxSpec(limits=ResourceLimits(disk_mb=64)))
    try:
        shown = await sandbox.run("df -B1 --output=size /home/user | tail -1", timeout_s=30)
    finally:
        await sandbox.close()
    assert sandbox.enforcement["disk"] == "loop ext4"
    assert int(shown.stdout) <= 64 * 2**20 - 2 * proxy_file_bytes(64)


@pytest.mark.timeout(600)
async def test_a_rollout_keeps_the_turns_before_the_bound_and_says_what_it_left_out(
    backend: LocalBackend, no_leaks: None
) -> None:
    """The real OpenCode: a 64 MiB rollout (4 MiB per proxy file) whose third call answers with a 3 MB file to
    write: that call and the one after it are relayed (the file is written, the task passes) but not recorded; the
    two turns before are kept, and a warning names the bound and the calls left out."""
    script = Script(
        steps=[
            write("/home/user/workdir/add.py", "def add(a, b):\n    return a + b\n"),
            bash("cd /home/user/workdir && python3 -c 'from add import add; print(add(2, 3))'"),
            write("/home/user/workdir/big.txt", "y" * 3_000_000),
            say("done"),
        ]
    )
    outcome = await rollout(backend, script, disk_mb=64, agent_timeout_s=400.0)
    result = outcome.result
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert len(outcome.exchanges) == 4
    assert [turn.turn for turn in result.proxy_turns] == [0, 1]
    assert result.usage.llm_calls == 2
    bound = [warning for warning in result.warnings if "capture proxy's trace reached its bound" in warning]
    assert len(bound) == 1
    assert "4.0 MiB" in bound[0]
    assert "the 2 model calls after it" in bound[0]
    assert result.files_extra or "big.txt" in result.files
