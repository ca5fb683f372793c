"""The rollout's result on the wire: how it ended, the records it is made of besides its turns, how prompt ids are
compacted, and the few lines a person reads of it. Fields existing clients read keep their names; additions are
optional; a result of a schema version newer than this code is refused by name, so a trainer never reads packed
lists as empty. Every result is standard JSON (non-finite floats as strings, non-UTF-8 paths in base64); the shape
and its versions are in docs/wire-format.md and docs/results.md."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializationInfo,
    ValidationInfo,
    WithJsonSchema,
    field_serializer,
    model_validator,
)

from opencode_env.inside.prefix import common_prefix_length
from opencode_env.wire.grading import (
    GradedTest,
    GradeIsolation,
    IntegrityFinding,
    ResolvedTestMode,
    findings_summary,
)
from opencode_env.wire.notices import Notice, Severity, reconciled
from opencode_env.wire.provenance import Provenance
from opencode_env.wire.request import EndpointName, Mode, RolloutRequest
from opencode_env.wire.shared import WireFloat
from opencode_env.wire.steps import MAX_STEPS, StepResult
from opencode_env.wire.token_packing import ResultTexts
from opencode_env.wire.turn import PromptBase, RolloutTurn, unpacked_turn

Phase = Literal["validate", "sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect"]
PhaseIdentity = Literal["root", "user", "grader", "image_user"]
"""Who a phase's task commands run as: the sandbox's own root (an unprivileged uid on the host), `user` (uid 1000,
the agent's tools), `grader` (uid 1001, an identity the agent never had), `image_user` (the request's image_user,
dropped to from the sandbox's root)."""
RolloutStatus = Literal[
    "completed",
    "setup_failed",
    "agent_timeout",
    "agent_error",
    "sandbox_error",
    "install_error",
    "proxy_error",
    "upstream_error",
    "invalid_request",
    "timeout",
    "cancelled",
    "internal_error",
]
INFRASTRUCTURE_FAILURES: frozenset[RolloutStatus] = frozenset(
    {"sandbox_error", "install_error", "proxy_error", "upstream_error", "timeout", "cancelled", "internal_error"}
)
"""Statuses where our side (sandbox, install, proxy, model endpoint, deadline) failed: such a rollout carries no
reward and gives no usable training data. `invalid_request` never ran; `setup_failed`, `agent_error` and
`agent_timeout` are outcomes of the task or the policy."""


def is_infrastructure_failure(status: RolloutStatus) -> bool:
    """The one predicate that decides whether a rollout's reward and training data can be used."""
    return status in INFRASTRUCTURE_FAILURES


RewardSource = Literal["reward_json", "reward_txt", "verify_pass_rate", "tests", "none"]
LimitHit = Literal["memory", "processes", "disk"]


class CommandResult(BaseModel):
    cmd: str
    exit_code: int | None = Field(description="None when the command was killed (timeout) before it exited.")
    stdout: str = ""
    stderr: str = ""
    duration_s: WireFloat = 0.0
    timed_out: bool = False
    output_truncated: bool = False


class ToolCallSummary(BaseModel):
    tool: str
    status: str
    title: str = ""
    exit_code: int | None = None
    started_at: WireFloat | None = Field(None, description="Unix time the tool started (OpenCode's event).")
    ended_at: WireFloat | None = Field(None, description="Unix time the tool ended (OpenCode's event).")
    session_id: str | None = Field(None, description="The OpenCode session whose step ran the tool.")


class AttributionCheck(BaseModel):
    """Each model call tied to the OpenCode session that made it, by the session header of the call as the proxy
    recorded it, and the proxy's record checked against OpenCode's own session store (read from the host side once
    the agent has stopped). The store only labels (a sub-agent's parent): what it claims against the record is
    ignored and named in `disagreements`."""

    source: Literal["opencode_store", "headers_only"] = Field(
        "headers_only",
        description="opencode_store: sub-agents' parents labelled from OpenCode's database where it agrees with the "
        "proxy's record; headers_only: the store was not read (see note), so no parent is known. Either way a "
        "call's kind comes from its session header: the root session's calls are agent; with caller_check, "
        "another session's are sub_agent, without it unattributed.",
    )
    sessions: int = Field(0, description="OpenCode's sessions that made captured calls (the root and its sub-agents).")
    sub_agent_sessions: int = 0
    caller_check: bool = Field(
        False,
        description="The proxy admitted only connections OpenCode's own uid opened (the local backend): every session "
        "named in the record is OpenCode's.",
    )
    steps_recorded: int = Field(0, description="Assistant steps (model calls that answered) in OpenCode's store.")
    turns_matched: int = Field(0, description="Complete agent and sub-agent turns matched to a recorded step.")
    disagreements: list[str] = Field(
        default_factory=list,
        description="Where OpenCode's store and the proxy's record disagree (steps without a turn, turns without a "
        "step, sessions or parents the record never saw): the record stands, the store's claim is ignored.",
    )
    refused_calls: int = Field(
        0,
        description="Calls the proxy refused before they reached the model (403: a socket OpenCode's uid does not "
        "own; 401: no valid token): never forwarded, never a turn.",
    )
    note: str | None = Field(None, description="Why the store was not used, when it was not.")


class TokenUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls: int = 0
    source: Literal["proxy", "opencode_events", "none"] = "none"


class PhaseTimings(BaseModel):
    """Seconds spent in each phase; None for a phase that never started."""

    sandbox_s: WireFloat | None = None
    install_s: WireFloat | None = None
    prepare_s: WireFloat | None = None
    setup_s: WireFloat | None = None
    proxy_s: WireFloat | None = None
    agent_s: WireFloat | None = None
    verify_s: WireFloat | None = None
    collect_s: WireFloat | None = None
    close_s: WireFloat | None = None


class UpstreamInfo(BaseModel):
    """Where the model calls went, without the key."""

    endpoint: EndpointName = ""
    base_url: str = ""
    model: str = ""
    disable_thinking: bool = False


class NonUtf8Path(BaseModel):
    """A work-dir path whose bytes are not valid UTF-8 (Linux names are bytes; JSON text cannot hold them as such)."""

    path_base64: str = Field(
        description="The path's exact bytes, relative to the work dir ('/' between components), in standard padded "
        "base64 (RFC 4648): the one lossless form."
    )
    display: str = Field(
        description="For reading only: the path decoded as UTF-8 with each byte that is not UTF-8 written as \\xNN "
        "(not unique: a UTF-8 name may read the same)."
    )


COMPACTION_WINDOW = 4


def _shared_with(base: RolloutTurn, prompt: list[int]) -> int:
    head, tail = base.prompt_token_ids, base.completion_token_ids
    shared = common_prefix_length(head, prompt)
    if shared < len(head):
        return shared
    return shared + common_prefix_length(tail, prompt[shared:])


def compact_prompts(turns: list[RolloutTurn]) -> list[RolloutTurn]:
    """The turns with each prompt written as a reference to a recent turn's ids plus its new suffix."""
    numbers = Counter(turn.turn for turn in turns)
    recent: list[RolloutTurn] = []
    out = []
    for turn in turns:
        prompt = turn.prompt_token_ids
        best, shared = None, 0
        for candidate in reversed(recent):
            if len(candidate.prompt_token_ids) + len(candidate.completion_token_ids) <= shared:
                continue
            count = _shared_with(candidate, prompt)
            if count > shared:
                best, shared = candidate, count
        if best is None:
            out.append(turn)
        else:
            base = PromptBase(turn=best.turn, count=shared)
            out.append(
                turn.model_copy(
                    update={"prompt_token_ids": [], "prompt_base": base, "prompt_suffix_ids": prompt[shared:]}
                )
            )
        if numbers[turn.turn] == 1 and prompt:
            recent = [*recent[-(COMPACTION_WINDOW - 1) :], turn]
    return out


def expanded_prompt(turn: RolloutTurn, earlier: dict[int, RolloutTurn], index: int) -> list[int]:
    """`turn`'s whole prompt: the ids its `prompt_base` names in an earlier turn, then its suffix."""
    base = turn.prompt_base
    if base is None:
        return list(turn.prompt_suffix_ids)
    source = earlier.get(base.turn)
    if source is None:
        raise ValueError(f"proxy_turns[{index}].prompt_base.turn: {base.turn} is not an earlier turn")
    head, tail = source.prompt_token_ids, source.completion_token_ids
    if base.count > len(head) + len(tail):
        raise ValueError(
            f"proxy_turns[{index}].prompt_base.count: {base.count} is over the {len(head) + len(tail)} ids of "
            f"turn {base.turn}"
        )
    prefix = head[: base.count] if base.count <= len(head) else head + tail[: base.count - len(head)]
    return prefix + turn.prompt_suffix_ids


TOOL_NAME = "run_rollout"
SCHEMA_VERSION = 6
RESULT_REQUIRED_IN_JSON = ("task_id", "status", "reward")
"""What a result in JSON carries in every schema version; defaults stay for results built in Python."""
UNPACKED_CONTEXT = "unpacked_tokens"
"""`result.model_dump_json(context={UNPACKED_CONTEXT: True})`: every turn's per-token lists as JSON lists (the
version 3 shape of a turn, for a reader that cannot unpack)."""

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
    artifacts: dict[str, str] = Field(
        default_factory=dict,
        description="The request's `artifacts` that are text, by absolute path (the agent's box, after verify).",
    )
    artifacts_extra: list[str] = Field(
        default_factory=list,
        description="Artifact paths found but left out of `artifacts` (binary, over the caps, a path not UTF-8 as "
        "its readable form), and those named but absent (or a link), each with why.",
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
    reward_metrics: dict[str, WireFloat] = Field(
        default_factory=dict,
        description="Every numeric metric of the reward.json verify wrote (Harbor's multi-metric rewards), the "
        "reward's own key among them; empty when the reward came from elsewhere.",
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
    verify_network_failure: str | None = Field(
        None,
        description="The line of verify's output that shows it failed to reach the network (a name lookup, a "
        "connection): the reward then grades the sandbox's network, not the agent's work.",
    )
    identities: dict[Phase, PhaseIdentity] = Field(
        default_factory=dict,
        description="Who each phase's task commands ran as: setup, agent (the agent's tools, or an oracle's "
        "solution) and verify.",
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
    test_mode: ResolvedTestMode | None = Field(
        None,
        description="How the test grader ran the tests (request.tests.mode, `auto` resolved from the tests' text "
        "before the rollout started); None without a test grader.",
    )
    test_mode_reason: str = Field("", description="Why: the declaration, or what auto read in the tests.")
    integrity: list[IntegrityFinding] = Field(
        default_factory=list,
        description="Files that configure the grader (test config, conftest.py, bytecode, start-up hooks, git "
        "config) the agent created, changed or deleted, the entries of its work dir the copy into the grader's box "
        "did not carry (links, FIFOs, devices, metadata), and what the grader did about each before verify.",
    )
    grade_isolation: GradeIsolation = Field(
        "none",
        description="Where the reward was graded: fresh_box (a new box from the task's image after setup, fed a "
        "copy of the agent's work dir the host made), agent_box (the agent's own box, hardened: the request's "
        "verify_sandbox='same', for a task that grades more than files), none (verify never ran). A trainer that "
        "wants only grades the agent could not shape filters on fresh_box.",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="What a trainer should know before using the data, e.g. logprobs that may not be those of the "
        "distribution that sampled (non-neutral top_p/top_k on a server that returns raw logprobs); most serious "
        "first. `notices` holds the same with each one's code, severity and fix.",
    )
    notices: list[Notice] = Field(
        default_factory=list,
        description="The warnings typed: code, severity (error, warning, note), message and fix, most serious first; "
        "empty in a result written before they existed (`warning_notices()` derives them from `warnings`).",
    )
    steps: list[StepResult] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="A multi-step task's steps in order, each its status, grade, wall time and model calls "
        "(proxy_turns[first_turn:end_turn]); the reward is theirs by the request's step_reward. Empty otherwise.",
    )
    provenance: Provenance | None = Field(
        None,
        description="Where the data came from: the endpoint probe, model identity, chat template fingerprint, policy "
        "version and the agent configuration's hash; None for a result written before it existed.",
    )
    schema_version: int = Field(SCHEMA_VERSION, description="The wire shape (see the module doc); absent = 1.")

    def warn(self, code: str, message: str, *, severity: Severity = "warning", fix: str = "") -> None:
        """Add a warning (its message to `warnings`, itself to `notices`); `order_warnings` sorts them."""
        self.notices.append(Notice(code=code, severity=severity, message=message, fix=fix))
        self.warnings.append(message)

    def warning_notices(self) -> list[Notice]:
        """Every warning as a notice, most serious first (a bare message counts as a warning)."""
        return reconciled(self.notices, self.warnings)

    def order_warnings(self) -> None:
        """`notices` and `warnings` most serious first, one notice per message."""
        self.notices = self.warning_notices()
        self.warnings = [notice.message for notice in self.notices]

    @model_validator(mode="before")
    @classmethod
    def _is_a_result(cls, data: Any, info: ValidationInfo) -> Any:
        """Refuse what is not a result: a schema version this code does not know, and, in JSON (a file, a reply),
        an object without the fields every result of every version carries (an eval's summary.json is not one)."""
        if not isinstance(data, dict):
            return data
        version = data.get("schema_version", 1)
        if type(version) is not int or not 1 <= version <= SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {version!r} is not one this opencode-env knows (1 to {SCHEMA_VERSION}): "
                "a newer opencode-env wrote it, or it is not a RolloutResult"
            )
        missing = [name for name in RESULT_REQUIRED_IN_JSON if name not in data]
        if info.mode == "json" and missing:
            raise ValueError(f"not a RolloutResult: {', '.join(missing)} missing (every result carries them)")
        return data

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
    def _compact_prompts(self, turns: list[RolloutTurn], info: SerializationInfo) -> list[RolloutTurn]:
        compact = compact_prompts(turns)
        unpacked = isinstance(info.context, dict) and info.context.get(UNPACKED_CONTEXT)
        if not info.mode_is_json() or unpacked:
            return compact
        known = ResultTexts()
        return [turn.packed_for_wire(known) for turn in compact]

    @model_validator(mode="before")
    @classmethod
    def _unpack_tokens(cls, data: Any) -> Any:
        """Packed turns name each token's text once per result: unpacked in order, with one map of texts."""
        if not isinstance(data, dict) or not isinstance(data.get("proxy_turns"), list):
            return data
        known = ResultTexts()
        return {**data, "proxy_turns": [unpacked_turn(turn, known) for turn in data["proxy_turns"]]}

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
        f"reward:     {result.reward} ({result.reward_source}, graded in {result.grade_isolation})",
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
    if result.steps:
        parts = ", ".join(f"{step.name} {step.status} {step.reward}" for step in result.steps)
        lines.insert(2, f"steps:      {parts} ({result.task.step_reward if result.task else 'mean'})")
    return "\n".join(lines)


def tool_text(result: RolloutResult) -> str:
    """The MCP tool result's text block: the summary, the task's id and where the rest is."""
    task = f"task:       {result.task_id}\n" if result.task_id else ""
    return f"{task}{result_summary(result)}\n{WHERE_THE_REST_IS}"
