"""The capture proxy against a real vLLM: a multi-turn tool-calling chat sent the way OpenCode sends it, through the
proxy with token-in off and then on, and each mode's trace checked against the server's own routes.

    uv run python -m bench.vllm_check --base-url http://127.0.0.1:8000 --model NAME [--turns 6] [--max-tokens 256]

`--base-url` is the server's root or its /v1. Each turn is a streaming chat completion in OpenCode's shape (tools,
tool_choice auto, usage asked for, the session in x-session-id); the assistant's reply as OpenCode sends it back
(its content and tool calls, not its reasoning) and a made-up tool result are appended for the next turn. A reply
with no tool call (a random-weights model) is given a made-up one, so the history keeps OpenCode's shape. Per mode,
from the proxy's JSONL trace read as a rollout reads it (parse_trace, then a RolloutResult): each turn's prompt
source and token-in fallback; completion ids and logprobs against the server's usage; the completion ids through
/detokenize and back through /tokenize; the prompt ids against /tokenize of the same messages and tools; whether
the prompt extends the previous turn's prompt + completion; the repo's training sequences, forks and coverage; and
what the repo's TokenIn would send on each continued turn, planned with this server's /tokenize. Printed, never
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from opencode_env.proxy.capture import Fold, fold_stream
from opencode_env.proxy.token_in import TokenIn
from opencode_env.rollout.proxy_session import Trace
from opencode_env.testing.proxy_process import running_proxy
from opencode_env.training.sequences import training_sequences, training_summary
from opencode_env.training.steps import training_steps
from opencode_env.wire import RolloutResult, RolloutTurn, common_prefix_length

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
            "name": "read",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"filePath": {"type": "string"}}, "required": ["filePath"]},
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
TURN_LOG_LINE = re.compile(r" turn \d+ \S+ \S+ \S+ tokens=\d+$")
TOKEN_ID_TEXT = re.compile(r"token_id:(\d+)\Z")
USER_AGENT = "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14 (bench.vllm_check)"


@dataclass
class Server:
    """The model server's root (where vLLM serves /tokenize) and the model, reached directly, not via the proxy."""

    root: str
    model: str
    client: httpx.Client

    def get(self, path: str) -> tuple[int, Any]:
        return _answer(self.client.get(f"{self.root}{path}"))

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return _answer(self.client.post(f"{self.root}{path}", json=body))

    def tokenize(self, body: dict[str, Any]) -> list[int] | str:
        status, answer = self.post("/tokenize", {"model": self.model, **body})
        if status == 200 and isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            return list(answer["tokens"])
        return f"/tokenize answered {status}: {str(answer)[:200]}"

    def detokenize(self, ids: list[int]) -> str | None:
        status, answer = self.post("/detokenize", {"model": self.model, "tokens": ids})
        return answer.get("prompt") if status == 200 and isinstance(answer, dict) else None


def _answer(response: httpx.Response) -> tuple[int, Any]:
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def probe_routes(server: Server) -> None:
    """Which of the routes capture and token-in use the server has, and what it answers."""
    status, models = server.get("/v1/models")
    names = [entry.get("id") for entry in models.get("data", [])] if isinstance(models, dict) else models
    print(f"GET  /v1/models: {status} {names}")
    chat = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}
    ids = server.tokenize(chat)
    print(f"POST /tokenize (messages): {ids if isinstance(ids, str) else f'200, {len(ids)} ids {ids[:12]}...'}")
    text = server.detokenize(ids) if isinstance(ids, list) else None
    print(f"POST /detokenize: {'200, ' + repr(text) if text is not None else 'no answer'}")
    token_ids = ids if isinstance(ids, list) else [0]
    probes = {
        "/v1/chat/completions/tokens": {
            "model": server.model,
            "messages": chat["messages"],
            "tokens": token_ids,
            "max_tokens": 1,
        },
        "/inference/v1/generate": {"model": server.model, "token_ids": token_ids, "sampling_params": {"max_tokens": 1}},
        "/v1/chat/completions/render": {"model": server.model, "messages": chat["messages"]},
    }
    for path, body in probes.items():
        status, answer = server.post(path, body)
        print(f"POST {path}: {status} {json.dumps(answer)[:300]}")


def made_up_result(name: str, arguments: str, turn: int) -> str:
    return f"(made-up result of {name} {arguments[:60]}, turn {turn})\nhello.py\nREADME.md"


def assistant_message(fold: Fold, turn: int) -> tuple[dict[str, Any], bool]:
    """The reply as OpenCode appends it (content and tool calls, no reasoning); a made-up call if it made none."""
    calls = [
        {
            "id": call["id"] or f"call_{turn}_{index}",
            "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]},
        }
        for index, call in enumerate(fold.tool_calls[key] for key in sorted(fold.tool_calls))
    ]
    if calls:
        return {"role": "assistant", "content": "".join(fold.content), "tool_calls": calls}, False
    arguments = json.dumps({"command": "ls", "description": "List files"})
    call = {"id": f"call_{turn}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    return {"role": "assistant", "content": "".join(fold.content), "tool_calls": [call]}, True


def converse(url: str, model: str, turns: int, session: str) -> list[str]:
    """Send `turns` calls the way OpenCode does, each with the history so far; returns a note per turn."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    headers = {"x-session-id": session, "x-session-affinity": session, "user-agent": USER_AGENT}
    notes = []
    with httpx.Client(timeout=600, headers={"authorization": "Bearer bench"}) as client:
        for turn in range(turns):
            body = {
                "model": model,
                "messages": messages,
                "tools": TOOLS,
                "tool_choice": "auto",
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            started = time.perf_counter()
            with client.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as response:
                raw = response.read()
            if response.status_code != 200:
                notes.append(f"HTTP {response.status_code}: {raw[:300]!r}; stopped")
                break
            fold = fold_stream(raw)
            reply, made_up = assistant_message(fold, turn)
            messages.append(reply)
            for call in reply["tool_calls"]:
                function = call["function"]
                result = made_up_result(function["name"], function["arguments"], turn)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            named = ", ".join(call["function"]["name"] for call in reply["tool_calls"])
            notes.append(
                f"{time.perf_counter() - started:.1f}s, finish {fold.finish_reason}, "
                f"{'made-up tool call' if made_up else 'tool calls'} {named}"
            )
    return notes


def run_mode(server: Server, args: argparse.Namespace, key: str, *, token_in: bool) -> tuple[Trace, list[str], str]:
    """One conversation through a fresh proxy; the trace as a rollout reads it, the notes, the proxy's log."""
    proxy_args = [
        "--endpoint-kind",
        "vllm",
        "--model-override",
        server.model,
        "--max-tokens-cap",
        str(args.max_tokens),
        "--top-logprobs",
        str(args.top_logprobs),
        "--sampling",
        args.sampling,
    ]
    if token_in:
        proxy_args.append("--token-in")
    session = f"ses_vllm_check_{'token_in' if token_in else 'chat'}"
    with (
        tempfile.TemporaryDirectory() as scratch,
        running_proxy(f"{server.root}/v1", Path(scratch), *proxy_args, key=key) as proxy,
    ):
        notes = converse(proxy.url, server.model, args.turns, session)
        trace = proxy.wait_for_turns(len(notes), timeout_s=60)
        log = proxy.log_path.read_text()
        if args.trace_dir:
            kept = Path(args.trace_dir) / f"{session}.jsonl"
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(proxy.trace_path, kept)
            print(f"\ntrace kept in {kept}")
    return trace, notes, log


def sent_request(result: RolloutResult, index: int) -> dict[str, Any]:
    """The request the proxy sent upstream for `proxy_turns[index]`, rebuilt whole from the compact trace."""
    turn = result.proxy_turns[index]
    request = dict(turn.request)
    request["messages"] = result.turn_messages(index)
    if turn.tools_sha256:
        request["tools"] = result.request_tools.get(turn.tools_sha256, [])
    return request


def tokenize_body(request: dict[str, Any]) -> dict[str, Any]:
    body = {"messages": request["messages"], "add_generation_prompt": True}
    body.update({name: request[name] for name in ("tools", "chat_template_kwargs") if request.get(name) is not None})
    return body


@dataclass
class TurnCheck:
    turn: RolloutTurn
    against_tokenize: str
    detokenized: str
    retokenized: str
    extends: str


def check_turn(server: Server, result: RolloutResult, index: int) -> TurnCheck:
    turn = result.proxy_turns[index]
    rendered = server.tokenize(tokenize_body(sent_request(result, index)))
    if isinstance(rendered, str):
        against = rendered
    elif rendered == turn.prompt_token_ids:
        against = "same"
    else:
        at = common_prefix_length(rendered, turn.prompt_token_ids)
        against = f"differ at {at} ({len(rendered)} vs {len(turn.prompt_token_ids)})"
    ids = turn.completion_token_ids
    text = server.detokenize(ids) if ids else None
    if text is None:
        detokenized = retokenized = "-"
    else:
        detokenized = _against_token_texts(text, turn)
        again = server.tokenize({"prompt": text, "add_special_tokens": False})
        if isinstance(again, str):
            retokenized = again
        else:
            retokenized = "same" if again == ids else f"differ at {common_prefix_length(again, ids)}"
    extends = "-"
    if index > 0:
        previous = result.proxy_turns[index - 1]
        before = previous.prompt_token_ids + previous.completion_token_ids
        shared = common_prefix_length(before, turn.prompt_token_ids)
        extends = "yes" if shared == len(before) else f"no, at {shared}: {_ids_at(server, before, turn, shared)}"
    return TurnCheck(turn, against, detokenized, retokenized, extends)


def _against_token_texts(text: str, turn: RolloutTurn) -> str:
    """The detokenized ids against the token texts the server streamed (ids, with --return-tokens-as-token-ids)."""
    named = [TOKEN_ID_TEXT.match(token) for token in turn.completion_tokens]
    if named and all(named):
        same = [int(match.group(1)) for match in named if match] == turn.completion_token_ids
        return "token texts are ids: same" if same else "token texts are other ids"
    joined = "".join(turn.completion_tokens)
    return "same" if text == joined else f"differs from the token texts at {_first_difference(text, joined)}"


def _first_difference(a: str, b: str) -> int:
    return next((index for index, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _ids_at(server: Server, before: list[int], turn: RolloutTurn, position: int) -> str:
    """What the previous turn's ids and this prompt hold where they part."""

    def shown(ids: list[int]) -> str:
        if position >= len(ids):
            return "(end)"
        return repr(server.detokenize(ids[position : position + 3]))

    return f"previous {shown(before)} vs prompt {shown(turn.prompt_token_ids)}"


def plan_token_in(server: Server, result: RolloutResult) -> list[str]:
    """What the repo's TokenIn would send on each turn, planned against this server's /tokenize, settled with the
    engine's ids as the proxy settles them; compared with the prompt the chat template gave."""

    async def tokenize(body: dict[str, Any]) -> list[int] | str:
        return await asyncio.to_thread(server.tokenize, {key: value for key, value in body.items() if key != "model"})

    async def plan_all() -> list[str]:
        planner, lines = TokenIn(), []
        for index, turn in enumerate(result.proxy_turns):
            sent = sent_request(result, index)
            ticket = planner.ticket(sent, "session", turn.kind)
            if isinstance(ticket, str):
                lines.append(f"turn {turn.turn}: no ticket ({ticket})")
                continue
            plan = await planner.plan(ticket, sent, tokenize)
            if plan.prompt_ids is None:
                lines.append(f"turn {turn.turn}: chat route ({plan.fallback})")
            else:
                lines.append(f"turn {turn.turn}: {_compare_plan(plan.prompt_ids, result, index)}")
            if turn.outcome == "complete" and turn.aligned:
                planner.settle(ticket, turn.prompt_token_ids, turn.completion_token_ids, turn.finish_reason)
            else:
                planner.forget(ticket)
        return lines

    return asyncio.run(plan_all())


def _compare_plan(planned: list[int], result: RolloutResult, index: int) -> str:
    previous, turn = result.proxy_turns[index - 1], result.proxy_turns[index]
    carried = len(previous.prompt_token_ids) + len(previous.completion_token_ids)
    new = planned[carried:]
    rendered = turn.prompt_token_ids
    if planned == rendered:
        return f"{len(planned)} ids = the chat template's prompt"
    tail = "ends with the same new ids" if rendered[-len(new) :] == new else "does not end with them"
    return (
        f"{len(planned)} ids ({carried} carried + {len(new)} new); the chat template's {len(rendered)} parts from "
        f"them at {common_prefix_length(planned, rendered)} and {tail}"
    )


def report(server: Server, name: str, trace: Trace, notes: list[str], log: str) -> None:
    result = RolloutResult(proxy_turns=trace.turns, request_tools=trace.tools)
    print(f"\n=== {name}: {len(notes)} turns sent, {len(trace.turns)} recorded")
    for number, note in enumerate(notes):
        print(f"  sent {number}: {note}")
    for problem in trace.problems:
        print(f"  trace problem: {problem}")
    checks = [check_turn(server, result, index) for index in range(len(result.proxy_turns))]
    header = f"  {'turn':>4} {'source':<13} {'finish':<10} {'prompt':>6} {'=usage':>6} {'ids':>4} {'lps':>4}"
    print(f"{header} {'usage':>5} {'aligned':<7} prompt vs /tokenize | detokenize | re-tokenize | extends previous")
    for check in checks:
        turn = check.turn
        print(
            f"  {turn.turn:>4} {turn.prompt_source:<13} {turn.finish_reason or '-':<10} {len(turn.prompt_token_ids):>6}"
            f" {turn.usage.prompt_tokens or 0:>6} {len(turn.completion_token_ids):>4} {len(turn.per_token_logps):>4}"
            f" {turn.usage.completion_tokens or 0:>5} {turn.aligned!s:<7} {check.against_tokenize} |"
            f" {check.detokenized} | {check.retokenized} | {check.extends}"
        )
    for turn in result.proxy_turns:
        if turn.token_in_fallback or turn.outcome != "complete":
            print(f"  turn {turn.turn}: {turn.outcome}; token_in_fallback: {turn.token_in_fallback}")
    _totals(result, checks)
    found = training_sequences(result)
    steps = training_steps(result)
    print(f"  training sequences: {len(found.sequences)}, turns per sequence {[s.turns for s in found.sequences]}")
    print(f"  steps: {len(steps)} ({sum(step.usable for step in steps)} usable)")
    for line in training_summary(result, found).text().splitlines():
        print(f"  | {line}")
    print("  token-in plan (the repo's TokenIn, this server's /tokenize):")
    for line in plan_token_in(server, result):
        print(f"    {line}")
    tail = [line for line in log.splitlines() if not TURN_LOG_LINE.search(line)][-5:]
    if tail:
        print("  proxy log (other than turn lines): " + " / ".join(tail)[:600])


def _totals(result: RolloutResult, checks: list[TurnCheck]) -> None:
    turns = result.proxy_turns
    recorded = sum(len(turn.completion_token_ids) for turn in turns)
    logprobs = sum(len(turn.per_token_logps) for turn in turns)
    usage = sum(turn.usage.completion_tokens or 0 for turn in turns)
    prompt_usage = sum(turn.usage.prompt_tokens == len(turn.prompt_token_ids) for turn in turns)
    continued = checks[1:]
    print(
        f"  completion tokens: {recorded} ids, {logprobs} logprobs recorded vs {usage} in the server's usage; "
        f"{sum(turn.aligned for turn in turns)} of {len(turns)} turns aligned; prompt ids = usage.prompt_tokens in "
        f"{prompt_usage} of {len(turns)}"
    )
    print(
        f"  prompt ids = /tokenize of the same messages: {sum(c.against_tokenize == 'same' for c in checks)} of "
        f"{len(checks)}; detokenize = token texts: {sum(c.detokenized.endswith('same') for c in checks)}; "
        f"re-tokenize = ids: {sum(c.retokenized == 'same' for c in checks)}; extends the previous turn: "
        f"{sum(c.extends == 'yes' for c in continued)} of {len(continued)}"
    )
    sources: dict[str, int] = {}
    for turn in turns:
        sources[turn.prompt_source] = sources.get(turn.prompt_source, 0) + 1
    print(f"  prompt_source: {sources}")


def server_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the vLLM server, e.g. http://127.0.0.1:8000 (or .../v1)")
    parser.add_argument("--model", required=True, help="the served model name (GET /v1/models)")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=256, help="the proxy's --max-tokens-cap")
    parser.add_argument("--top-logprobs", type=int, default=5)
    parser.add_argument("--sampling", default="{}", help="JSON passed to the proxy's --sampling")
    parser.add_argument("--api-key-env", default="VLLM_API_KEY", help="env var holding the server's key, if any")
    parser.add_argument("--trace-dir", default="", help="keep each mode's trace.jsonl here")
    parser.add_argument("--modes", nargs="+", choices=["off", "on"], default=["off", "on"], help="token-in modes")
    args = parser.parse_args()
    key = os.environ.get(args.api_key_env, "")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(timeout=300, headers=headers) as client:
        server = Server(server_root(args.base_url), args.model, client)
        print(f"server {server.root}, model {server.model}, {args.turns} turns per mode")
        probe_routes(server)
        for mode in args.modes:
            trace, notes, log = run_mode(server, args, key, token_in=mode == "on")
            report(server, f"token_in {mode}", trace, notes, log)


if __name__ == "__main__":
    main()
