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
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

EndpointName = Literal["", "vllm", "openai", "hf_router"]
Mode = Literal["transparent_proxy", "black_box"]
Network = Literal["internet", "model_only"]
Phase = Literal["validate", "sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect"]
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


RewardSource = Literal["reward_json", "reward_txt", "verify_pass_rate", "none"]
TurnKind = Literal["agent", "auxiliary", "sub_agent", "unattributed"]
"""unattributed: a call the proxy cannot tie to OpenCode itself (kept in the record, never trained or counted)."""
VerifySandbox = Literal["same", "fresh"]
VerifyAs = Literal["grader", "root"]
ResultText = Literal["summary", "json"]
SetupAs = Literal["root", "user"]
TokenIdSource = Literal["return_token_ids", "token_id_strings", "none"]
TokenIn = Literal["off", "auto"]
PromptSource = Literal["chat_template", "token_in"]
"""How a turn's prompt ids were made: chat_template, the model server rendered the messages itself (every call);
token_in, the proxy sent the previous turn's prompt + completion ids followed by the new messages' ids."""
RecordedOutcome = Literal[
    "complete",
    "bad_request",
    "upstream_error",
    "stalled",
    "unreachable",
    "upstream_disconnected",
    "client_disconnected",
    "undelivered",
]
"""How a call ended, as the proxy recorded it."""
TurnOutcome = RecordedOutcome | Literal["cut_by_deadline"]
"""cut_by_deadline: the pipeline's word for a call our own deadline cut (the proxy saw the agent go away)."""
LimitHit = Literal["memory", "processes", "disk"]

TOOL_NAME = "run_rollout"
SCHEMA_VERSION = 3
COMPACTION_WINDOW = 4
MAX_INSTRUCTION_CHARS = 200_000
MAX_COMMANDS = 64
MAX_COMMAND_CHARS = 16_000
MAX_FILES = 256
MAX_FILE_CHARS = 1_000_000
MAX_FILES_TOTAL_CHARS = 8_000_000
MAX_ENV_VARS = 64
MAX_ENV_VALUE_CHARS = 32_000
RESERVED_ENV = frozenset({"PATH", "HOME", "USER", "TMPDIR", "PYTHONPATH"})

Command = Annotated[str, StringConstraints(min_length=1, max_length=MAX_COMMAND_CHARS)]
ImageRef = Annotated[str, StringConstraints(max_length=512, pattern=r"^[A-Za-z0-9._:@/+-]*$")]
SandboxPath = Annotated[str, StringConstraints(max_length=512, pattern=r"^(/[A-Za-z0-9._@+-]+)*/?$")]
TaskId = Annotated[str, StringConstraints(max_length=256, pattern=r"^[A-Za-z0-9._:@+/-]*$")]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
EnvValue = Annotated[str, StringConstraints(max_length=MAX_ENV_VALUE_CHARS)]
FilePath = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^[^\x00]+$")]
FileText = Annotated[str, StringConstraints(max_length=MAX_FILE_CHARS)]
NonFiniteName = Literal["Infinity", "-Infinity", "NaN"]
SentToolSchema = Annotated[
    Any,
    WithJsonSchema(
        {
            "type": ["object", "array", "string", "number", "integer", "boolean", "null"],
            "description": "One tool schema as the agent sent it: normally an object, kept whatever it was.",
        }
    ),
]


def _float_for_json(value: float) -> float | NonFiniteName:
    """JSON has no NaN or infinities, and pydantic writes them as null, which does not parse back as a float."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


WireFloat = Annotated[float, PlainSerializer(_float_for_json, return_type=float | NonFiniteName, when_used="json")]
"""A float that every JSON form of a result carries: `model_dump_json` and `model_dump(mode="json")` write NaN,
Infinity and -Infinity as those strings (the serialization schema, which MCP clients check, allows them), and
validation reads the strings back as the floats. Standard JSON parsers accept it: JavaScript's JSON.parse gives the
string, and `Number(x)` the number."""


class Sampling(BaseModel):
    """Sampling parameters the capture proxy sets on every model call (OpenCode sends none), so the distribution
    that sampled is known and recorded with each turn. Unset fields leave the model server's defaults."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(None, ge=0, le=5, description="Softmax temperature.")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus mass.")
    top_k: int | None = Field(None, ge=-1, le=100_000, description="Top-k cut (-1: off; vLLM, SGLang).")
    min_p: float | None = Field(None, ge=0, le=1, description="Minimum probability relative to the top token.")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Sampling seed.")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=10, description="vLLM, SGLang.")
    stop: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] | None = Field(
        None, max_length=16, description="Stop strings."
    )

    def sent(self) -> dict[str, Any]:
        """The fields set, as the request body carries them."""
        return self.model_dump(exclude_none=True)


class RolloutRequest(BaseModel):
    """One rollout: which model to call, what the agent is asked, how the task is set up and checked."""

    model_config = ConfigDict(extra="forbid")

    endpoint: EndpointName = Field(
        "", description="Endpoint shorthand whose env vars fill base_url, api_key and model when they are empty."
    )
    base_url: str = Field("", max_length=2048, description="OpenAI-compatible base URL of the policy model.")
    api_key: str = Field("", max_length=4096, description="Upstream API key; never echoed in results or logs.")
    model: str = Field("", max_length=512, description="Upstream model id.")
    instruction: str = Field(
        ..., min_length=1, max_length=MAX_INSTRUCTION_CHARS, description="The task given to the agent, verbatim."
    )
    setup: list[Command] = Field(
        default_factory=list,
        max_length=MAX_COMMANDS,
        description="Shell commands run in order before the agent; the first failure stops the rollout.",
    )
    setup_as: SetupAs = Field(
        "root",
        description="root: setup runs as the sandbox's own root (mapped to an unprivileged host uid), so an image's "
        "package managers work, and the work dir is then handed to `user` for the agent; user: as the agent's tools.",
    )
    verify: list[Command] = Field(
        default_factory=list,
        max_length=MAX_COMMANDS,
        description="Shell commands run after the agent (always, even after an agent timeout); pass rate is the "
        "fallback reward.",
    )
    solution: list[Command] | None = Field(
        None,
        max_length=MAX_COMMANDS,
        description="Oracle run: shell commands run in order in place of the agent (no model, no proxy; [] is the "
        "do-nothing agent), each within agent_timeout_s; the first failure stops the solution; verify runs as "
        "usual. A task whose oracle does not reach reward 1.0 is broken.",
    )
    task_id: TaskId = Field("", description="Caller's label for the task (letters, digits, ._:@+/-), echoed back.")
    mode: Mode = Field(
        "transparent_proxy",
        description="transparent_proxy records every LLM turn with token logprobs; black_box lets OpenCode call "
        "the upstream directly.",
    )
    disable_thinking: bool | None = Field(
        None, description="Send enable_thinking=false; None means the endpoint's default (on for vllm)."
    )
    max_tokens_cap: int = Field(4096, ge=1, le=1_000_000, description="Upper bound on max_tokens per LLM call.")
    top_logprobs: int = Field(5, ge=0, le=20, description="Alternatives recorded per token (0 = sampled only).")
    sampling: Sampling | None = Field(
        None,
        description="Sampling parameters set on every model call by the capture proxy and recorded in each turn's "
        "request (transparent_proxy mode); None leaves the model server's defaults.",
    )
    sub_agents: bool = Field(
        False,
        description="Let the agent start sub-agents (OpenCode's task tool). Their calls are recorded as sub_agent "
        "turns tied to their parent session (OpenCode's own store, local backend), in sequences of their own.",
    )
    token_in: TokenIn = Field(
        "off",
        description="auto: where the model server takes prompt token ids (a vLLM with /tokenize and "
        "/v1/chat/completions/tokens), each agent turn's prompt is the previous turn's prompt + completion ids and "
        "the new messages' ids, so the model sees its own earlier tokens exactly (reasoning a chat template would "
        "drop included) and one training sequence covers the session; off: the server renders every prompt from "
        "the messages (transparent_proxy mode).",
    )
    agent_timeout_s: float = Field(600.0, gt=0, le=86_400, description="Wall-clock limit for the agent run.")
    image: ImageRef = Field(
        "",
        description="OCI image whose root file system the sandbox runs, never pulled per rollout. Local backend: an "
        "image in this machine's container storage (podman/buildah), or oci-archive:PATH / docker-archive:PATH; "
        "E2B: a template (`template` is its alias); Hugging Face: the sandbox's image. '' is the backend's default "
        "(local: OPENCODE_ENV_LOCAL_IMAGE, else the base image once built); 'host': the local host's own root, "
        "read-only.",
    )
    template: str = Field("", max_length=256, description="E2B template name: an alias of `image` on E2B.")
    workdir: SandboxPath = Field(
        "",
        description="Absolute path of the agent's work dir (an image's own, e.g. /app); '' is /home/user/workdir. "
        "`files` and `verify_files` with relative paths go there, and verify is handed this tree.",
    )
    files: dict[FilePath, FileText] = Field(
        default_factory=dict,
        max_length=MAX_FILES,
        description="Text files written before setup, keyed by path relative to the work dir or absolute (on the "
        f"local backend without an image: under /home/user or /tmp; no '..', at most {MAX_FILES} files, "
        f"{MAX_FILES_TOTAL_CHARS} characters in all).",
    )
    verify_files: dict[FilePath, FileText] = Field(
        default_factory=dict,
        max_length=MAX_FILES,
        description="Protected files (tests, fixtures) the host writes into the work dir right before verify, "
        "replacing whatever the agent left at those paths; the agent never sees them. Keyed like `files` (Harbor's "
        f"tests go to /tests; no '..', at most {MAX_FILES} files, {MAX_FILES_TOTAL_CHARS} characters in all).",
    )
    verify_sandbox: VerifySandbox = Field(
        "same",
        description="same: verify runs in the agent's sandbox, under a grader identity with a fresh HOME and /tmp; "
        "fresh: verify runs in a new sandbox into which only the agent's work dir is copied (stronger, slower).",
    )
    result_text: ResultText = Field(
        "summary",
        description="The MCP tool result's text block: summary (a few lines for a chat model; the whole result is in "
        "the structured content) or json (the whole result as JSON text as well).",
    )
    verify_as: VerifyAs = Field(
        "grader",
        description="grader: verify runs as an identity the agent never had (uid 1001, no privilege); root: as the "
        "sandbox's own root (mapped to an unprivileged host uid), for tests that install packages (Harbor's default).",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ENV_VARS,
        description="Environment variables for setup, verify and the agent's commands "
        "(PATH, HOME, USER, TMPDIR, PYTHONPATH and OPENCODE_* are reserved).",
    )
    setup_timeout_s: float = Field(300.0, gt=0, le=86_400, description="Time limit for each setup command.")
    verify_timeout_s: float = Field(300.0, gt=0, le=86_400, description="Time limit for each verify command.")
    upstream_idle_timeout_s: float = Field(
        120.0,
        ge=1,
        le=290,
        description="The proxy ends a model call that sends no bytes for this long (OpenCode gives up at ~300 s).",
    )
    upstream_max_unreachable: int = Field(
        3,
        ge=1,
        le=100,
        description="Stop the agent (upstream_error) after this many consecutive model calls that could not "
        "connect, instead of letting OpenCode retry each for a minute (transparent_proxy mode).",
    )
    upstream_max_server_errors: int = Field(
        20,
        ge=1,
        le=1000,
        description="Stop the agent after this many consecutive 5xx answers (a vLLM under load answers 503 for a "
        "while: keep it well above a few).",
    )
    total_timeout_s: float | None = Field(
        None,
        gt=0,
        le=172_800,
        description="Deadline over the whole rollout; None derives it from the phase timeouts.",
    )
    network: Network = Field(
        "internet",
        description="internet: setup, agent and verify reach public addresses through an egress proxy (never the "
        "host, private or link-local ranges); model_only: nothing but the model. The agent reaches the model only "
        "through its capture proxy (black_box: only the configured upstream).",
    )
    memory_mb: int = Field(4096, ge=64, le=1_048_576, description="Memory for everything the rollout runs (MiB).")
    max_processes: int = Field(1024, ge=16, le=1_000_000, description="Processes and threads alive at once.")
    disk_mb: int = Field(8192, ge=64, le=1_048_576, description="Size of the rollout's writable tree (MiB).")
    cpus: float = Field(2.0, gt=0, le=1024, description="CPU time share, in cores.")

    @field_validator("files", "verify_files")
    @classmethod
    def _files_stay_in_the_work_dir(cls, files: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        name = info.field_name
        for path in files:
            if ".." in path.replace("\\", "/").split("/") or path.strip("/") in ("", "."):
                raise ValueError(f"{name}: path {path[:80]!r} must name a file, with no '..' component")
        total = sum(len(text) for text in files.values())
        if total > MAX_FILES_TOTAL_CHARS:
            raise ValueError(f"{name}: {total} characters in all, over the limit of {MAX_FILES_TOTAL_CHARS}")
        return files

    @field_validator("env")
    @classmethod
    def _env_leaves_reserved_names_alone(cls, env: dict[str, str]) -> dict[str, str]:
        reserved = sorted(name for name in env if name in RESERVED_ENV or name.startswith("OPENCODE"))
        if reserved:
            raise ValueError(f"env: {', '.join(reserved)} reserved (PATH, HOME, USER, TMPDIR, PYTHONPATH, OPENCODE_*)")
        return env

    @model_validator(mode="after")
    def _timeouts_fit_the_total(self) -> RolloutRequest:
        if self.total_timeout_s is not None and self.total_timeout_s < 1:
            raise ValueError("total_timeout_s must be at least 1 second")
        if self.sampling is not None and self.mode == "black_box":
            raise ValueError("sampling: set by the capture proxy, so transparent_proxy mode only (mode='black_box')")
        if self.token_in != "off" and self.mode == "black_box":
            raise ValueError("token_in: done by the capture proxy, so transparent_proxy mode only (mode='black_box')")
        return self


class CommandResult(BaseModel):
    cmd: str
    exit_code: int | None = Field(description="None when the command was killed (timeout) before it exited.")
    stdout: str = ""
    stderr: str = ""
    duration_s: WireFloat = 0.0
    timed_out: bool = False
    output_truncated: bool = False


TopLogprob = tuple[str, WireFloat, int | None]
"""One alternative at a position: (token, logprob, token id when the upstream gave one)."""


class CallUsage(BaseModel):
    """What the model server counted for one call: OpenAI's usage object, its integer fields (others kept as sent).
    A count the server did not send is None, and left out of the JSON."""

    model_config = ConfigDict(extra="allow")

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None

    @model_serializer(mode="wrap")
    def _counted_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, int]:
        return {name: value for name, value in handler(self).items() if value is not None}


class PromptBase(BaseModel):
    """The first `count` ids of (prompt ids + completion ids) of the turn numbered `turn`."""

    turn: int = Field(ge=0)
    count: int = Field(ge=1)


class MessagesBase(BaseModel):
    """The first `count` messages of the turn numbered `turn`."""

    turn: int = Field(ge=0)
    count: int = Field(ge=0)


class RolloutTurn(BaseModel):
    """One LLM call made by the agent, as recorded by the capture proxy."""

    turn: int
    finish_reason: str | None = None
    completion_tokens: list[str] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    per_token_logps: list[WireFloat] = Field(
        default_factory=list,
        description='One per completion token; -inf, inf and NaN travel as "-Infinity", "Infinity" and "NaN".',
    )
    latency_s: WireFloat = 0.0
    timestamp: WireFloat = 0.0
    upstream_status: int | None = None
    upstream_error: str | None = None
    prompt_token_ids: list[int] = Field(default_factory=list)
    top_logprobs: list[list[TopLogprob]] = Field(default_factory=list)
    request: dict[str, Any] = Field(
        default_factory=dict,
        description="The request as sent upstream, compacted: `messages` holds only what follows `messages_base`; "
        "`tools` is left out (see tools_sha256). RolloutResult.turn_messages(i) rebuilds the messages.",
    )
    messages_base: MessagesBase | None = Field(None, description="Where request.messages continue from.")
    tools_sha256: str | None = Field(None, description="Key of this turn's tool schemas in request_tools.")
    prompt_base: PromptBase | None = Field(
        None, description="Wire only: the prompt starts with these ids of an earlier turn (see the module doc)."
    )
    prompt_suffix_ids: list[int] = Field(
        default_factory=list, description="Wire only: the prompt ids after prompt_base."
    )
    response: dict[str, Any] = Field(default_factory=dict)
    usage: CallUsage = Field(default_factory=CallUsage, description="The model server's counts for this call.")
    ttft_s: WireFloat | None = None
    kind: TurnKind = "agent"
    headers: dict[str, str] = Field(default_factory=dict)
    token_id_source: TokenIdSource = "none"
    aligned: bool = False
    stream: bool = True
    outcome: TurnOutcome = "complete"
    clamped: dict[str, Any] = Field(
        default_factory=dict,
        description="Request fields the proxy overrode before forwarding (e.g. n: 64 sent as 1), with the "
        "values the agent sent.",
    )
    session_id: str | None = Field(None, description="The OpenCode session that made the call (x-session-id).")
    parent_session_id: str | None = Field(
        None, description="For a sub-agent's call: the session that started it (OpenCode's own session store)."
    )
    prompt_source: PromptSource = Field(
        "chat_template", description="How the prompt ids were made (token_in mode: see RolloutRequest.token_in)."
    )
    token_in_fallback: str | None = Field(
        None, description="token_in mode: why this turn's prompt was rendered by the server instead (first turn, ...)."
    )

    @model_validator(mode="before")
    @classmethod
    def _lift_request_references(cls, data: Any) -> Any:
        """Version 1 kept `messages_base` and `tools_sha256` inside `request`: lift them into their fields."""
        if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
            return data
        request = data["request"]
        if "messages_base" not in request and "tools_sha256" not in request:
            return data
        lifted = dict(data)
        lifted["request"] = {k: v for k, v in request.items() if k not in ("messages_base", "tools_sha256")}
        for key in ("messages_base", "tools_sha256"):
            if lifted.get(key) is None:
                lifted[key] = request.get(key)
        return lifted


class ToolCallSummary(BaseModel):
    tool: str
    status: str
    title: str = ""
    exit_code: int | None = None
    started_at: WireFloat | None = Field(None, description="Unix time the tool started (OpenCode's event).")
    ended_at: WireFloat | None = Field(None, description="Unix time the tool ended (OpenCode's event).")
    session_id: str | None = Field(None, description="The OpenCode session whose step ran the tool.")


class AttributionCheck(BaseModel):
    """Each model call tied to the OpenCode session that made it, and the proxy's record checked against OpenCode's
    own session store (read from the host side once the agent has stopped): every assistant step OpenCode recorded
    should have a turn, and every agent or sub-agent turn a recorded step."""

    source: Literal["opencode_store", "headers_only"] = Field(
        "headers_only",
        description="opencode_store: sessions and their parents from OpenCode's database; headers_only: the store "
        "could not be read (see note), so the first session named is OpenCode's and any other is unattributed.",
    )
    sessions: int = Field(0, description="Sessions OpenCode recorded (the root and its sub-agents).")
    sub_agent_sessions: int = 0
    steps_recorded: int = Field(0, description="Assistant steps (model calls that answered) in OpenCode's store.")
    turns_matched: int = Field(0, description="Complete agent and sub-agent turns matched to a recorded step.")
    disagreements: list[str] = Field(default_factory=list, description="Steps without a turn, turns without a step.")
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
                turn.prompt_token_ids = _expanded_prompt(turn, earlier, index)
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


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading items a and b share (slice comparisons run in C; a binary search finds a divergence)."""
    limit = min(len(a), len(b))
    if (a if limit == len(a) else a[:limit]) == (b if limit == len(b) else b[:limit]):
        return limit
    low, high = 0, limit - 1
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


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


def _expanded_prompt(turn: RolloutTurn, earlier: dict[int, RolloutTurn], index: int) -> list[int]:
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
