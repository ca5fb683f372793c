"""A rollout's result in the forms the server answers with.

Over MCP (`mcp_tool_result`): a `RolloutAnswer` (summary, typed) whatever the size, the whole result by reference
(`server.result_store`, linked as an HTTP route and as MCP resources), inline too when small (see wire/answer.py
for the bound and why). Over OpenEnv's sessions (`/ws`, `/step`, OpenEnv's JSON-RPC; `session_tool_result`): the
whole result, whose clients take messages up to 100 MB.

Both are built off the event loop by their callers (`asyncio.to_thread`): a result with its turns' tokens is
megabytes of JSON to encode. The observation's text is the result encoded by orjson: `python -m
bench.answer_encoding` measured it at 0.08x / 0.14x the standard library's `json.dumps`.
"""

from __future__ import annotations

import gzip
from typing import Any

import orjson
from fastmcp.tools import ToolResult
from mcp_types import ResourceLink, TextContent

from opencode_env.training.sequences import sequences_coverage
from opencode_env.wire import VERSION, ResultText, RolloutResult, result_summary
from opencode_env.wire.answer import (
    ANSWER_LIST_MAX,
    INLINE_MAX_BYTES,
    PART_BYTES,
    RESULT_PATH,
    ResultRef,
    RolloutAnswer,
    resource_uri,
)
from server.result_store import ResultStore

SERVER_NAME = "opencode_env"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
RESULT_MIME = "application/json"


def rollout_answer(result: RolloutResult, store: ResultStore, base_url: str = "") -> tuple[RolloutAnswer, bytes]:
    """The answer's summary with the result kept by reference, and the result's JSON."""
    result_json = result.model_dump_json().encode()
    stored = store.put(result_json)
    path = f"{RESULT_PATH}/{stored.id}"
    parts = max(1, -(-stored.gzip_bytes // PART_BYTES))
    ref = ResultRef(
        id=stored.id,
        url=base_url.rstrip("/") + path,
        path=path,
        resources=[resource_uri(stored.id, part) for part in range(parts)],
        json_bytes=stored.json_bytes,
        gzip_bytes=stored.gzip_bytes,
        sha256=stored.sha256,
        retention_s=store.retention_s,
        expires_at=round(stored.expires_at, 3),
    )
    answer = RolloutAnswer(
        task_id=result.task_id,
        status=result.status,
        reward=result.reward,
        reward_source=result.reward_source,
        grade_isolation=result.grade_isolation,
        error=result.error,
        failed_phase=result.failed_phase,
        backend=result.backend,
        sandbox_id=result.sandbox_id,
        wall_s=result.wall_s,
        usage=result.usage,
        timings=result.timings,
        turns=len(result.proxy_turns),
        sampled_tokens=sum(
            len(turn.completion_token_ids) or len(turn.completion_tokens) for turn in result.proxy_turns
        ),
        warnings=result.warnings,
        coverage=sequences_coverage(result).text(),
        integrity=result.integrity[:ANSWER_LIST_MAX],
        integrity_total=len(result.integrity),
        test_outcomes=result.test_outcomes[:ANSWER_LIST_MAX],
        test_outcomes_total=len(result.test_outcomes),
        schema_version=result.schema_version,
        result_ref=ref,
        result=result if len(result_json) <= INLINE_MAX_BYTES else None,
    )
    return answer, result_json


def answer_text(answer: RolloutAnswer, result: RolloutResult) -> str:
    ref = answer.result_ref
    where = (
        f"full RolloutResult ({ref.json_bytes:,} bytes of JSON, {ref.gzip_bytes:,} gzip'd): GET {ref.url} with the "
        f"server's bearer token, or resources/read {', '.join(ref.resources)} (gzip parts, in order); kept "
        f"{ref.retention_s:.0f} s"
        if ref is not None
        else "the full RolloutResult was not kept"
    )
    inline = "; it is also inline in structuredContent.result" if answer.result is not None else ""
    task = f"task:       {result.task_id}\n" if result.task_id else ""
    return f"{task}{result_summary(result)}\ncoverage:   {answer.coverage}\n{where}{inline}"


def mcp_tool_result(
    result: RolloutResult, store: ResultStore, text: ResultText = "summary", base_url: str = ""
) -> ToolResult:
    """For the MCP transports: the answer in the structured content; its text a short summary with where the whole
    result is (a chat model's context is not filled with token arrays), or the JSON when asked and small."""
    answer, result_json = rollout_answer(result, store, base_url)
    block = answer_text(answer, result)
    if text == "json" and answer.result is not None:
        block = result_json.decode()
    content: list[Any] = [TextContent(type="text", text=block)]
    ref = answer.result_ref
    if ref is not None:
        content.append(
            ResourceLink(
                type="resource_link",
                uri=ref.url if ref.url.startswith("http") else ref.resources[0],
                name="rollout-result",
                description=f"The whole RolloutResult (gzip-encoded JSON), kept {ref.retention_s:.0f} s",
                mimeType=RESULT_MIME,
                size=ref.json_bytes,
            )
        )
        content += [
            ResourceLink(
                type="resource_link",
                uri=uri,
                name=f"rollout-result-part-{part}",
                description=f"Part {part + 1} of {len(ref.resources)} of the gzip stream of the RolloutResult JSON",
                mimeType="application/gzip",
            )
            for part, uri in enumerate(ref.resources)
        ]
    return ToolResult(content=content, structured_content=answer.model_dump(mode="json"))


def whole_result_data(answer: ToolResult, store: ResultStore) -> Any:
    """The whole result (a JSON object) an MCP answer stands for: inline, or read back by its reference."""
    structured = answer.structured_content or {}
    if structured.get("result") is not None:
        return structured["result"]
    ref = (structured.get("result_ref") or {}).get("id", "")
    stream = store.gzip_of(ref)
    if stream is None:
        raise LookupError(f"the result {ref[:8]}... is no longer kept")
    return orjson.loads(gzip.decompress(stream))


def session_tool_result(data: Any) -> dict[str, Any]:
    """For OpenEnv sessions (`/ws`, `/step`): the whole result as an observation's `result` carries it, in the
    shape OpenEnv's clients read: `data` the result as a JSON object (as FastMCP's client gives it), and the text
    block the whole result as JSON (programs, not chat models, call here)."""
    text = orjson.dumps(data).decode()
    return {
        "content": [{"type": "text", "text": text, "annotations": None, "meta": None}],
        "structured_content": data,
        "meta": {SERVER_INFO_META: {"name": SERVER_NAME, "version": VERSION}},
        "data": data,
        "is_error": False,
    }
