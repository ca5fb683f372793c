"""examples/ run as users run them: a real server on loopback, the example as a subprocess with the scripted model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp import Client

from opencode_env.client.client import parse_result
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.wire import SCHEMA_VERSION
from tests.server_app import app_for
from tests.stand_in import StandInRollouts, recorded_result, stand_in_server

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def server_url(backend: LocalBackend) -> Iterator[str]:
    server = ThreadedServer(app_for(backend))
    server.start()
    yield server.url
    server.stop()


def run_example(name: str, server_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--server", server_url, "--scripted", *args],
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )


@pytest.mark.timeout(600)
def test_quickstart(server_url: str, no_leaks: None) -> None:
    done = run_example("quickstart.py", server_url)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "completed 1.0 3"
    assert lines[1].startswith("first turn: ")
    assert "sequences:  1\n" in done.stdout
    assert "aligned:    yes" in done.stdout


SERVERLESS = ("quickstart.py", "grpo_group.py")


@pytest.fixture(scope="module")
def without_a_server() -> dict[str, tuple[int, str]]:
    """Each example's exit code and stderr against a port nobody listens on. Both run at once: a client waits ~15 s
    for a server that may still be starting before it gives up, and that wait needs no CPU."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{probe.getsockname()[1]}"
    command = ["--server", nobody, "--scripted"]
    running = {
        name: subprocess.Popen(
            [sys.executable, str(EXAMPLES / name), *command],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in SERVERLESS
    }
    stderr = {name: process.communicate(timeout=500)[1] for name, process in running.items()}
    return {name: (process.returncode, stderr[name]) for name, process in running.items()}


@pytest.mark.parametrize("example", SERVERLESS)
def test_an_example_without_a_server_says_how_to_start_one(
    example: str, without_a_server: dict[str, tuple[int, str]]
) -> None:
    returncode, stderr = without_a_server[example]
    assert returncode == 2
    assert "Start one with `opencode-env serve`" in stderr
    assert "Traceback" not in stderr


@pytest.mark.timeout(600)
def test_grpo_group(server_url: str, no_leaks: None) -> None:
    # A group of two (the smallest GRPO group) runs the example's every line; each more rollout adds only its cost.
    done = run_example("grpo_group.py", server_url, "--size", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    rollouts = [line for line in done.stdout.splitlines() if line.startswith("rollout ")]
    assert len(rollouts) == 2
    for line in rollouts:
        assert "completed" in line
        assert "reward 1.0" in line
        assert "sequences 2" in line
        assert "(template_drift)" in line
    assert "TRL batch: 2 rows" in done.stdout
    assert "rewards seen by TRL: [1.0, 1.0]" in done.stdout


@pytest.mark.timeout(900)
def test_trl_grpo_step_when_trl_is_installed(opencode_binary: Path) -> None:
    pytest.importorskip("trl", reason="the optional group: uv sync --group trl")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "trl_grpo.py")],
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
        env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "one GRPO step on 2 rollouts: weights moved by" in done.stdout
    assert "'rewards/rollout_reward/mean': 0.5" in done.stdout
    assert "agent tokens (100.0%) in 2 rows" in done.stdout


async def test_the_server_sends_the_compact_shape_and_the_client_rebuilds_every_prompt() -> None:
    """The shape is the server's answer path, not the agent's: a stand-in rollout answers with a recorded real
    result (whose prompts each extend the one before, as OpenCode's do), and every prompt comes back token for token."""
    recorded = recorded_result()
    with stand_in_server(StandInRollouts(recorded)) as url:
        async with Client(f"{url}/mcp/stream") as client:
            answer = await client.call_tool(
                "run_rollout", demo_request("http://127.0.0.1:9/v1").model_dump(mode="json")
            )
    assert answer.structured_content is not None
    wire = answer.structured_content["result"]
    assert wire["schema_version"] == SCHEMA_VERSION == 6
    assert [turn["prompt_base"] is not None for turn in wire["proxy_turns"]] == [False, True, True]
    assert all(turn["prompt_token_ids"] == [] for turn in wire["proxy_turns"][1:])
    result = parse_result(wire)
    assert [turn.prompt_token_ids for turn in result.proxy_turns] == [t.prompt_token_ids for t in recorded.proxy_turns]
    assert all(len(turn.prompt_token_ids) > 3000 for turn in result.proxy_turns)
