"""Wire types: the one source of truth for a rollout's request, result, turns and command results.

Field names of `RolloutRequest`, `RolloutResult`, `RolloutTurn` and `CommandResult` that existing clients read are
kept as they are; everything added is optional with a safe default. Results are parsed leniently (unknown fields
are ignored), so an older client reads a newer server's result.

The wire shape of a result (schema_version 3; a result without `schema_version` is version 1; version 3 added
`task`, `warnings` and each turn's session, parent session and prompt source, all optional, so every earlier
result still parses):
- In Python, `RolloutTurn.prompt_token_ids` always holds the turn's whole prompt.
- On the wire, a turn whose prompt starts with an earlier turn's ids carries `prompt_base: {turn, count}` and
  `prompt_suffix_ids`, and an empty `prompt_token_ids`: its prompt is the first `count` ids of
  (prompt ids + completion ids) of the turn numbered `turn` (always earlier in `proxy_turns`), then the suffix. A turn
  without `prompt_base` carries its whole prompt in `prompt_token_ids`, as in version 1. Each prompt id is then
  written about once per rollout, and the size grows with the tokens generated, not with turns x context.
- `request.messages` holds the messages after the first `messages_base.count` messages of turn `messages_base.turn`
  (a typed field of the turn; version 1 kept it inside `request`), and `tools_sha256` names the tool schemas in
  `RolloutResult.request_tools`. `RolloutResult.turn_messages(i)` rebuilds one turn's messages.

Every result is standard JSON, whatever the sandbox or the model produced: a typed float that is NaN or infinite
(a -inf logprob) is written as the string "NaN", "Infinity" or "-Infinity" and read back as that float (see
`WireFloat`); a work-dir path whose bytes are not UTF-8 is listed in `files_non_utf8` with its bytes in base64.

This module holds the result and names every wire type (`__all__`); the rest live by job beside it: request.py (the
request and its bounds), turn.py (a model call's record), prompt_compaction.py (prompt ids on the wire),
result_parts.py (command results, timings, usage and the other records of a result), status.py (how a rollout
ended), wire_float.py (NaN and infinities in JSON).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import BaseModel, Field, WithJsonSchema, field_serializer, model_validator

from opencode_env.wire.grading import GradedTest, IntegrityFinding
from opencode_env.wire.prompt_compaction import (
    COMPACTION_WINDOW,
    common_prefix_length,
    compact_prompts,
    expanded_prompt,
)
from opencode_env.wire.request import (
    MAX_COMMAND_CHARS,
    MAX_COMMANDS,
    MAX_ENV_VALUE_CHARS,
    MAX_ENV_VARS,
    MAX_FILE_CHARS,
    MAX_FILES,
    MAX_FILES_TOTAL_CHARS,
    MAX_INSTRUCTION_CHARS,
    RESERVED_ENV,
    Command,
    EndpointName,
    EnvName,
    EnvValue,
    FilePath,
    FileText,
    ImageRef,
    Mode,
    Network,
    ResultText,
    RolloutRequest,
    Sampling,
    SandboxPath,
    SetupAs,
    TaskId,
    TokenIn,
    VerifyAs,
    VerifySandbox,
)
from opencode_env.wire.result_parts import (
    AttributionCheck,
    CommandResult,
    NonUtf8Path,
    PhaseTimings,
    TokenUsage,
    ToolCallSummary,
    UpstreamInfo,
)
from opencode_env.wire.status import (
    INFRASTRUCTURE_FAILURES,
    LimitHit,
    Phase,
    RewardSource,
    RolloutStatus,
    is_infrastructure_failure,
)
from opencode_env.wire.turn import (
    CallUsage,
    MessagesBase,
    PromptBase,
    PromptSource,
    RecordedOutcome,
    RolloutTurn,
    TokenIdSource,
    TopLogprob,
    TurnKind,
    TurnOutcome,
)
from opencode_env.wire.wire_float import NonFiniteName, WireFloat

__all__ = [
    "COMPACTION_WINDOW",
    "INFRASTRUCTURE_FAILURES",
    "MAX_COMMANDS",
    "MAX_COMMAND_CHARS",
    "MAX_ENV_VALUE_CHARS",
    "MAX_ENV_VARS",
    "MAX_FILES",
    "MAX_FILES_TOTAL_CHARS",
    "MAX_FILE_CHARS",
    "MAX_INSTRUCTION_CHARS",
    "RESERVED_ENV",
    "SCHEMA_VERSION",
    "TOOL_NAME",
    "AttributionCheck",
    "CallUsage",
    "Command",
    "CommandResult",
    "EndpointName",
    "EnvName",
    "EnvValue",
    "FilePath",
    "FileText",
    "ImageRef",
    "LimitHit",
    "MessagesBase",
    "Mode",
    "Network",
    "NonFiniteName",
    "NonUtf8Path",
    "Phase",
    "PhaseTimings",
    "PromptBase",
    "PromptSource",
    "RecordedOutcome",
    "ResultText",
    "RewardSource",
    "RolloutRequest",
    "RolloutResult",
    "RolloutStatus",
    "RolloutTurn",
    "Sampling",
    "SandboxPath",
    "SentToolSchema",
    "SetupAs",
    "TaskId",
    "TokenIdSource",
    "TokenIn",
    "TokenUsage",
    "ToolCallSummary",
    "TopLogprob",
    "TurnKind",
    "TurnOutcome",
    "UpstreamInfo",
    "VerifyAs",
    "VerifySandbox",
    "WireFloat",
    "common_prefix_length",
    "compact_prompts",
    "is_infrastructure_failure",
]

TOOL_NAME = "run_rollout"
SCHEMA_VERSION = 3

SentToolSchema = Annotated[
    Any,
    WithJsonSchema(
        {
            "type": ["object", "array", "string", "number", "integer", "boolean", "null"],
            "description": "One tool schema as the agent sent it: normally an object, kept whatever it was.",
        }
    ),
]


class RolloutResult(BaseModel):
    task_id: str = Field("", description="The request's task_id, echoed.")
    sandbox_id: str = Field("", description="The sandbox the rollout ran in (empty when none was created).")
    reward: WireFloat | None = Field(
        None,
        description="The verifier's reward (see reward_source); None when there is none or our side failed.",
    )
    agent_exit_code: int | None = Field(
        None, description="OpenCode's exit code; None when the agent never ran or was killed."
    )
    wall_s: WireFloat = Field(0.0, description="Wall-clock seconds of the whole rollout, sandbox creation to close.")
    mode: Mode = Field(
        "transparent_proxy", description="How the agent reached the model: through the capture proxy, or directly."
    )
    setup_results: list[CommandResult] = Field(
        default_factory=list, description="Each setup command's result, in order."
    )
    verify_results: list[CommandResult] = Field(
        default_factory=list, description="Each verify command's result, in order."
    )
    proxy_turns: list[RolloutTurn] = Field(
        default_factory=list, description="Every LLM call the proxy captured, with token ids and per-token logprobs."
    )
    files: dict[str, str] = Field(
        default_factory=dict, description="Text files of the work dir after the rollout, by path."
    )
    files_extra: list[str] = Field(
        default_factory=list,
        description="Paths in the work dir left out of `files` (caps, binary). Like the keys of `files`, each is the "
        "exact path; a path that is not UTF-8 is in neither, but in `files_non_utf8`.",
    )
    files_non_utf8: list[NonUtf8Path] = Field(
        default_factory=list,
        description="Paths in the work dir whose bytes are not valid UTF-8, each with its bytes in base64 and a "
        "readable form; their contents are not collected.",
    )
    agent_log_tail: str = Field("", description="The end of OpenCode's own log.")
    proxy_log_tail: str = Field("", description="The end of the capture proxy's log.")
    error: str | None = Field(None, description="What went wrong, when status is not completed.")
    status: RolloutStatus = Field(
        "completed", description="How the rollout ended; infrastructure failures carry no reward."
    )
    failed_phase: Phase | None = Field(None, description="The phase that failed or was cut short, if any.")
    timings: PhaseTimings = Field(default_factory=PhaseTimings, description="Seconds spent in each phase.")
    reward_source: RewardSource = Field(
        "none", description="Where the reward came from: reward.json, reward.txt or the verify pass rate."
    )
    usage: TokenUsage = Field(default_factory=TokenUsage, description="Token counts over the captured LLM calls.")
    backend: str = Field("", description="The sandbox backend that ran the rollout.")
    opencode_version: str = Field("", description="The OpenCode version that ran the agent.")
    upstream: UpstreamInfo = Field(default_factory=UpstreamInfo, description="The model endpoint used (never its key).")
    tool_calls: list[ToolCallSummary] = Field(
        default_factory=list,
        description="Agent-reported: read from OpenCode's event stream, which the agent can write.",
    )
    agent_final_text: str = Field("", description="Agent-reported: OpenCode's last text event.")
    request_tools: dict[str, list[SentToolSchema]] = Field(
        default_factory=dict, description="Tool schemas sent upstream, by sha256, stored once per rollout."
    )
    limits_hit: list[LimitHit] = Field(
        default_factory=list, description="Resource limits the sandbox enforced: 'memory', 'processes', 'disk'."
    )
    enforcement: dict[str, str] = Field(
        default_factory=dict, description="The isolation and limits that were active (which mechanism enforced what)."
    )
    oracle: bool = Field(False, description="True when the request's solution commands ran in place of the agent.")
    solution_results: list[CommandResult] = Field(
        default_factory=list, description="The solution commands of an oracle run, in order."
    )
    task: RolloutRequest | None = Field(
        None,
        description="The request this rollout ran, without its api_key: a saved result can be compared or run "
        "again (`run_rollout(result.task)`, the key coming from the environment as usual).",
    )
    attribution: AttributionCheck | None = Field(
        None, description="How the model calls were tied to OpenCode's sessions, and the check against its store."
    )
    test_outcomes: list[GradedTest] = Field(
        default_factory=list, description="The test grader's per-test outcomes (request.tests), expected ids only."
    )
    integrity: list[IntegrityFinding] = Field(
        default_factory=list,
        description="Files that configure the grader (test config, conftest.py, bytecode, start-up hooks, git "
        "config) the agent created, changed or deleted, and what the grader did about each before verify.",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="What a trainer should know before using the data, e.g. logprobs that may not be those of the "
        "distribution that sampled (non-neutral top_p/top_k on a server that returns raw logprobs).",
    )
    schema_version: int = Field(SCHEMA_VERSION, description="The wire shape (see the module doc); absent = 1.")

    @model_validator(mode="after")
    def _expand_prompts(self) -> RolloutResult:
        earlier: dict[int, RolloutTurn] = {}
        for index, turn in enumerate(self.proxy_turns):
            if turn.prompt_base is not None or turn.prompt_suffix_ids:
                if turn.prompt_token_ids:
                    raise ValueError(
                        f"proxy_turns[{index}]: prompt_token_ids and prompt_base/prompt_suffix_ids exclude each other"
                    )
                turn.prompt_token_ids = expanded_prompt(turn, earlier, index)
                turn.prompt_base, turn.prompt_suffix_ids = None, []
            earlier[turn.turn] = turn
        return self

    @field_serializer("proxy_turns")
    def _compact_prompts(self, turns: list[RolloutTurn]) -> list[RolloutTurn]:
        return compact_prompts(turns)

    def prompt_ids(self, index: int) -> list[int]:
        """`proxy_turns[index]`'s whole prompt (in Python the field always holds it; the wire may not)."""
        return self.proxy_turns[index].prompt_token_ids

    def turn_messages(self, index: int) -> list[Any]:
        """The full message list of `proxy_turns[index]`'s request, rebuilt from the compact records."""
        return self._messages([index])[index] or []

    def all_turn_messages(self) -> list[list[Any]]:
        """Every turn's full message list, in one pass over the references (linear in the messages)."""
        return [messages or [] for messages in self._messages(range(len(self.proxy_turns)))]

    def _messages(self, wanted: Iterable[int]) -> list[list[Any] | None]:
        """Iterative (a long rollout's chain of references is deeper than Python's recursion limit)."""
        turns = self.proxy_turns
        positions = {turn.turn: position for position, turn in enumerate(turns)}
        built: list[list[Any] | None] = [None] * len(turns)
        for start in wanted:
            stack, on_stack = [start], {start}
            while stack:
                position = stack[-1]
                turn, base = turns[position], turns[position].messages_base
                source = None if base is None else positions.get(base.turn)
                if base is not None and source is None:
                    raise ValueError(f"proxy_turns[{position}].messages_base.turn: no turn numbered {base.turn}")
                if built[position] is None and base is not None and source is not None:
                    earlier = built[source]
                    if earlier is None:
                        if source in on_stack:
                            raise ValueError(f"proxy_turns[{position}].messages_base: the references form a cycle")
                        stack.append(source)
                        on_stack.add(source)
                        continue
                    built[position] = [*earlier[: base.count], *turn.request.get("messages", [])]
                elif built[position] is None:
                    built[position] = list(turn.request.get("messages", []))
                on_stack.discard(stack.pop())
        return built
