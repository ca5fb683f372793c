"""A rollout's result as a few lines a person (or a chat model that called the tool) reads: the CLI's summary and
the MCP tool result's text block, which carries this instead of the whole result (that is in structured content)."""

from __future__ import annotations

from opencode_env.wire.grading import findings_summary
from opencode_env.wire.models import RolloutResult

WHERE_THE_REST_IS = (
    "the full RolloutResult (every turn's tokens and logprobs, commands, files) is this tool result's structured "
    "content; call with result_text='json' to have it as this text too"
)


def result_summary(result: RolloutResult) -> str:
    timings = result.timings.model_dump()
    phases = ", ".join(f"{name[:-2]} {value:.2f}s" for name, value in timings.items() if value is not None)
    tools = ", ".join(f"{call.tool}({call.status})" for call in result.tool_calls) or "none"
    lines = [
        f"status:     {result.status}" + (f" in {result.failed_phase}: {result.error}" if result.error else ""),
        f"reward:     {result.reward} ({result.reward_source})",
        f"turns:      {len(result.proxy_turns)} captured, {result.usage.llm_calls} LLM calls, "
        f"{result.usage.prompt_tokens} prompt + {result.usage.completion_tokens} completion tokens",
        f"tool calls: {tools}",
        "verify:     " + ", ".join(f"exit {r.exit_code}" for r in result.verify_results),
        f"timings:    {phases}; wall {result.wall_s:.2f}s",
        f"sandbox:    {result.backend} {result.sandbox_id}, OpenCode {result.opencode_version}",
    ]
    if result.test_outcomes:
        passed = sum(1 for test in result.test_outcomes if test.outcome == "passed")
        lines.insert(5, f"tests:      {passed}/{len(result.test_outcomes)} expected ids passed")
    if result.integrity:
        lines.insert(5, f"integrity:  {findings_summary(result.integrity)}")
    return "\n".join(lines)


def tool_text(result: RolloutResult) -> str:
    """The MCP tool result's text block: the summary, the task's id and where the rest is."""
    task = f"task:       {result.task_id}\n" if result.task_id else ""
    return f"{task}{result_summary(result)}\n{WHERE_THE_REST_IS}"
