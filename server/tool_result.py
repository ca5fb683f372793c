"""A rollout's result in the forms the server answers with.

Over MCP (`mcp_tool_result`): a `RolloutAnswer` (summary, typed) whatever the size, the whole result by reference
(`server.result_store`, linked as an HTTP route and as MCP resources), inline too when small (see wire/answer.py
for the bound and why). Over OpenEnv's sessions (`/ws`, `/step`; `session_tool_result`): the same answer once, the
result by reference unless tiny. Every path carries one copy of the result, packed, and gzip'd where it is large.

The MCP answer is built off the event loop by its caller (`asyncio.to_thread`): a result with its turns' tokens is
megabytes of JSON to encode and compress.
"""

from __future__ import annotations

import logging
from typing import Any

from fastmcp.tools import ToolResult
from mcp_types import ResourceLink, TextContent

from opencode_env.server.result_store import ResultStore, Stored
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

SERVER_NAME = "opencode_env"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
RESULT_MIME = "application/json"
log = logging.getLogger("opencode_env.server")
SESSION_INLINE_MAX_BYTES = 16 * 1024
"""OpenEnv's sessions carry a result inline only up to this (a failed or token-less run); above it by reference only,
where it travels gzip'd: ~26-39 B per sampled token against ~54-79 inline (bench.answer_paths)."""


def rollout_answer(result: RolloutResult, store: ResultStore, base_url: str | None = "") -> tuple[RolloutAnswer, bytes]:
    """The answer's summary with the result kept by reference, and the result's JSON. `base_url` None: the server
    has no HTTP route (stdio), so the reference has no URL. A store that cannot keep it (a full or broken disk) does
    not lose a finished rollout: the result is then inline whatever its size, and the answer has no reference."""
    result_json = result.model_dump_json().encode()
    try:
        stored = store.put(result_json)
    except OSError:
        log.exception("the results store at %s could not keep a result: it is answered inline", store.directory)
        stored = None
    ref = None if stored is None else _reference(stored, store.retention_s, base_url)
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
        result=result if ref is None or len(result_json) <= INLINE_MAX_BYTES else None,
    )
    return answer, result_json


def _reference(stored: Stored, retention_s: float, base_url: str | None) -> ResultRef:
    path = f"{RESULT_PATH}/{stored.id}"
    parts = max(1, -(-stored.gzip_bytes // PART_BYTES))
    return ResultRef(
        id=stored.id,
        url=None if base_url is None else base_url.rstrip("/") + path,
        path=path,
        resources=[resource_uri(stored.id, part) for part in range(parts)],
        json_bytes=stored.json_bytes,
        gzip_bytes=stored.gzip_bytes,
        sha256=stored.sha256,
        retention_s=retention_s,
        expires_at=round(stored.expires_at, 3),
    )


def answer_text(answer: RolloutAnswer, result: RolloutResult) -> str:
    ref = answer.result_ref
    if ref is None:
        where = "the full RolloutResult was not kept"
    else:
        route = f"GET {ref.url} with the server's bearer token, or " if ref.url is not None else ""
        where = (
            f"full RolloutResult ({ref.json_bytes:,} bytes of JSON, {ref.gzip_bytes:,} gzip'd): {route}"
            f"resources/read {', '.join(ref.resources)} (gzip parts, in order); kept {ref.retention_s:.0f} s"
        )
    inline = "; it is also inline in structuredContent.result" if answer.result is not None else ""
    task = f"task:       {result.task_id}\n" if result.task_id else ""
    return f"{task}{result_summary(result)}\ncoverage:   {answer.coverage}\n{where}{inline}"


def mcp_tool_result(
    result: RolloutResult, store: ResultStore, text: ResultText = "summary", base_url: str | None = ""
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
                uri=ref.url if ref.url and ref.url.startswith("http") else ref.resources[0],
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


def session_tool_result(answer: ToolResult) -> dict[str, Any]:
    """For OpenEnv sessions (`/ws`, `/step`): the same `RolloutAnswer` as over MCP, once, as `data` (what OpenEnv's
    clients return from `call_tool`), the whole result by reference (`result_ref`: GET its `path` on the server's
    URL, gzip'd, packed): inline only when its JSON is at most SESSION_INLINE_MAX_BYTES, so that a frame stays small
    whatever the rollout (a 38 MB result used to make a 114 MB frame, over OpenEnv's 100 MB limit) and a result's
    bytes travel compressed. The text block is the summary (or a small result's JSON, when asked)."""
    structured = dict(answer.structured_content or {})
    ref = structured.get("result_ref") or {}
    if structured.get("result") is not None and ref.get("json_bytes", 0) > SESSION_INLINE_MAX_BYTES:
        structured["result"] = None
    texts = [block.text for block in answer.content if isinstance(block, TextContent)]
    pointer = f"the whole result: GET {ref.get('path')}"
    text = texts[0] if texts and len(texts[0]) <= SESSION_INLINE_MAX_BYTES else pointer
    return {
        "content": [{"type": "text", "text": text, "annotations": None, "meta": None}],
        "structured_content": None,
        "meta": {SERVER_INFO_META: {"name": SERVER_NAME, "version": VERSION}},
        "data": structured,
        "is_error": False,
    }
