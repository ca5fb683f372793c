"""A rollout's request: what the agent is asked, how the task is set up and checked, and the bounds on each.

One deadline governs the whole rollout; each phase gets what is left of it. Without an explicit `total_timeout_s`,
the budget is the sum of what every phase may take: sandbox + install + proxy + collect margins, each setup and
verify command's timeout, and the agent's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from opencode_env.wire.grading import GradedTests
from opencode_env.wire.mcp import MAX_MCP_SERVERS, McpServer, mcp_problems
from opencode_env.wire.provenance import Capture
from opencode_env.wire.services import MAX_SERVICES, Service, service_problems, services_budget_s
from opencode_env.wire.steps import MAX_STEPS, MinReward, StepName, StepReward
from opencode_env.wire.suggest import EXTRA, with_suggestions
from opencode_env.wire.task_paths import WORKDIR, OutsideTaskRoots, confined_dir, confined_file

EndpointName = Literal["", "vllm", "openai", "hf_router"]
Mode = Literal["transparent_proxy", "black_box"]
Network = Literal["internet", "model_only"]
VerifySandbox = Literal["same", "fresh"]
VerifyAs = Literal["grader", "root"]
ResultText = Literal["summary", "json"]
SetupAs = Literal["root", "user"]
SolutionAs = Literal["user", "root", "image_user"]
TokenIn = Literal["off", "auto", "require"]
RewardFile = Literal["reward.txt", "reward.json"]

MAX_INSTRUCTION_CHARS = 200_000
MAX_COMMANDS = 64
MAX_ARTIFACT_PATHS = 32
MAX_COMMAND_CHARS = 16_000
MAX_FILES = 256
MAX_FILE_CHARS = 1_000_000
MAX_FILES_TOTAL_CHARS = 8_000_000
MAX_STEPS_FILES_CHARS = 2 * MAX_FILES_TOTAL_CHARS
"""Every step's files and verify_files together (each step's alone is bounded like the request's own)."""
MAX_ENV_VARS = 64
MAX_ENV_VALUE_CHARS = 32_000
RESERVED_ENV = frozenset({"PATH", "HOME", "USER", "TMPDIR", "PYTHONPATH"})
LOADER_ENV = frozenset(
    {
        "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "GLOBIGNORE", "CDPATH",
        "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONPLATLIBDIR", "PYTHONEXECUTABLE", "PYTHONINSPECT",
        "PYTHONBREAKPOINT", "PYTHONWARNINGS", "PYTHONSAFEPATH", "PYTHONNOUSERSITE",
        "PERL5OPT", "PERL5LIB", "PERLLIB", "PERL5DB", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS", "NODE_PATH",
        "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "GCONV_PATH", "HOSTALIASES", "LOCPATH",
        "GIT_EXEC_PATH", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "GIT_PAGER", "GIT_EDITOR", "GIT_TEMPLATE_DIR",
    }
)  # fmt: skip
LOADER_ENV_PREFIXES = ("LD_", "BASH_FUNC_", "DYLD_", "GIT_CONFIG")
"""Variables the dynamic loader, a shell or an interpreter reads at start-up to run code of the setter's choice (a
preloaded library, a start-up file, an option): refused in every env a request or a task sets, since that env
reaches every process of the rollout, OpenCode's own included."""


def loader_env_names(names: Iterable[str]) -> list[str]:
    """The names among `names` that change how a program starts (LOADER_ENV, LOADER_ENV_PREFIXES), sorted."""
    return sorted(name for name in names if name in LOADER_ENV or name.startswith(LOADER_ENV_PREFIXES))


Command = Annotated[str, StringConstraints(min_length=1, max_length=MAX_COMMAND_CHARS)]
ImageRef = Annotated[str, StringConstraints(max_length=512, pattern=r"^(?:[A-Za-z0-9._:@/+][A-Za-z0-9._:@/+-]*)?$")]
SandboxPath = Annotated[str, StringConstraints(max_length=512, pattern=r"^(/[A-Za-z0-9._@+-]+)*/?$")]
ImageUser = Annotated[
    str,
    StringConstraints(max_length=65, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$"),
]
"""A Dockerfile USER: a user name or uid, optionally `:group` or `:gid`."""
TaskId = Annotated[str, StringConstraints(max_length=256, pattern=r"^[A-Za-z0-9._:@+/-]*$")]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
EnvValue = Annotated[str, StringConstraints(max_length=MAX_ENV_VALUE_CHARS)]
FilePath = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^[^\x00]+$")]
FileText = Annotated[str, StringConstraints(max_length=MAX_FILE_CHARS)]


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


def request_problems(error: ValidationError) -> str:
    """A request's validation failure in one line, naming each field and its problem."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or '(top level)'}: {item['msg']}" for item in error.errors()
    )


class RolloutStep(BaseModel):
    """One step of a multi-step task (Harbor's `[[steps]]`): in order, in the one sandbox (the agent keeps its work),
    each its files and setup, the agent with its instruction (a new OpenCode session), then its verify in a fresh
    grader's box. Unset timeouts and verify fall back to the request's."""

    model_config = ConfigDict(extra="forbid")

    name: StepName
    instruction: str = Field(..., min_length=1, max_length=MAX_INSTRUCTION_CHARS)
    files: dict[FilePath, FileText] = Field(
        default_factory=dict,
        max_length=MAX_FILES,
        description="Written before the step's setup, keyed like the request's `files` (Harbor's workdir/).",
    )
    setup: list[Command] = Field(
        default_factory=list, max_length=MAX_COMMANDS, description="Run after the files, as the request's setup_as."
    )
    verify: list[Command] | None = Field(None, max_length=MAX_COMMANDS, description="None: the request's verify.")
    verify_files: dict[FilePath, FileText] = Field(
        default_factory=dict,
        max_length=MAX_FILES,
        description="The step's protected files, over the request's verify_files (a same-named one wins); never in "
        "the agent's sandbox.",
    )
    solution: list[Command] = Field(
        default_factory=list, max_length=MAX_COMMANDS, description="The step's oracle (run when `solution` is set)."
    )
    agent_timeout_s: float | None = Field(None, gt=0, le=86_400)
    verify_timeout_s: float | None = Field(None, gt=0, le=86_400)
    min_reward: MinReward | None = Field(
        None,
        description="A grade under it stops the run (later steps not run): a number gates the reward, a table of "
        "metric names gates each metric (a missing one counts as under).",
    )


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
    solution_as: SolutionAs = Field(
        "user",
        description="user: the solution runs as the agent's tools do (uid 1000); root: as the sandbox's own root "
        "(mapped to an unprivileged host uid), as Harbor's oracle runs in its container, for a solution that writes "
        "root-owned paths; image_user: as the image's USER (`image_user`), as Docker runs a container's commands.",
    )
    artifacts: list[SandboxPath] = Field(
        default_factory=list,
        max_length=MAX_ARTIFACT_PATHS,
        description="Absolute files or directories of the task's roots (the work dir's or not: /app, /logs/artifacts, "
        "/tmp/out) collected into the result's `artifacts` after verify, from the agent's box: regular files only, "
        f"no link followed, at most {MAX_ARTIFACT_PATHS} paths.",
    )
    skills_dir: SandboxPath | None = Field(
        None,
        description="A directory of the task's roots holding agent skills (<name>/SKILL.md and the files beside "
        "them): read by the host before the agent starts (text files, bounded, no link followed) and given to "
        "OpenCode as a skills path it reads and the agent's tools cannot change.",
    )
    mcp_servers: list[McpServer] = Field(
        default_factory=list,
        max_length=MAX_MCP_SERVERS,
        description="MCP servers OpenCode gives the agent (Harbor's [environment] mcp_servers). stdio: refused for an "
        "agent run (OpenCode would start it before it loads its plugins; an oracle run leaves it unused); sse, "
        "streamable-http: a URL whose host is one of `services` (a sidecar on the sandbox's loopback).",
    )
    image_user: ImageUser | None = Field(
        None,
        description="The image's USER (name or uid, optionally :group or :gid): the identity solution_as="
        "'image_user' drops to from the sandbox's root (the work dir is handed to it). The agent's tools keep `user`.",
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
        "auto",
        description="auto: each continued agent turn's prompt is sent as ids (the previous turn's prompt + "
        "completion ids and the new messages' ids from the server's /tokenize) by the route the endpoint probe "
        "proved: prime-rl's /v1/chat/completions/tokens, or stock vLLM's chat route with "
        "kv_transfer_params.prompt_token_ids; so the model sees its own earlier tokens exactly (reasoning a chat "
        "template would drop included) and one training sequence covers the session. Where no route is proven, the "
        "chat template renders every prompt and each turn records why (forks then split the session). require: the "
        "same, but a server that takes no prompt ids is refused before any sandbox, with why and how to fix it. "
        "off: the server renders every prompt from the messages. auto by default in transparent_proxy mode, off in "
        "black_box mode (no proxy to send ids).",
    )
    capture: Capture | None = Field(
        None,
        description="What the endpoint must return, checked by a probe before any sandbox starts: tokens (completion "
        "and prompt token ids and logprobs, for training), logprobs (logprobs only), text (the reward only, for "
        "evals). An endpoint that cannot is refused with what is missing and how to fix it; None: tokens in "
        "transparent_proxy mode, text in black_box mode.",
    )
    policy_version: str = Field(
        "", max_length=256, description="Your label of the policy's weights for this rollout, recorded in provenance."
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
        description="Absolute path of the agent's work dir (an image's own, e.g. /app), inside the task's roots "
        "like `files`; '' is /home/user/workdir. `files` and `verify_files` with relative paths go there, and verify "
        "is handed this tree.",
    )
    files: dict[FilePath, FileText] = Field(
        default_factory=dict,
        max_length=MAX_FILES,
        description="Text files written before setup, keyed by path relative to the work dir or absolute, inside "
        "the task's roots: /home/user (OpenCode's directories there aside), /tmp, or a top-level directory of the "
        "task's image other than the sandbox's own (/app, /tests; on the local backend without an image: /home/user "
        f"or /tmp); no '..', at most {MAX_FILES} files, {MAX_FILES_TOTAL_CHARS} characters in all.",
    )
    verify_files: dict[FilePath, FileText] = Field(
        default_factory=dict,
        max_length=MAX_FILES,
        description="Protected files (tests, fixtures) the host writes into the work dir right before verify, "
        "replacing whatever the agent left at those paths; the agent never sees them. Keyed like `files` (Harbor's "
        f"tests go to /tests; no '..', at most {MAX_FILES} files, {MAX_FILES_TOTAL_CHARS} characters in all).",
    )
    solution_files: list[FilePath] = Field(
        default_factory=list,
        max_length=MAX_FILES,
        description="Paths (relative to the work dir) of files the task asks the agent to write that would "
        "otherwise count as grader configuration (a pyproject.toml, a conftest.py, a .pth): kept as the agent left "
        "them; every other test config, conftest.py, bytecode, start-up hook and git config the agent created or "
        "changed is removed or restored before verify, and recorded in the result's `integrity`. Also the "
        "repository and packaging metadata (.git, *.dist-info, *.egg-info, *.pth, __pycache__) the copy into a "
        "fresh verify sandbox carries.",
    )
    tests: GradedTests | None = Field(
        None,
        description="A test grader: test files and the ids that must pass, run by the product itself (tests from "
        "a directory the agent never wrote, the work dir last on sys.path, a JUnit report read by the host); the "
        "reward comes from which expected ids passed, never from an exit code. `verify` commands still run first.",
    )
    reward_files: list[RewardFile] | None = Field(
        None,
        max_length=2,
        description="Which reward files of the verifier directory (/home/user/logs/verifier, Harbor's /logs/verifier) "
        "verify writes: only those are read, and the reward is theirs; any other is ignored (code under test runs "
        "as the grader and could write one). With both declared and both written, the grade is 0.0 (agent_error: "
        "a script writes one). [] reads none: the reward is verify's pass rate. None (the default): the files the "
        "task's own `verify` commands or `verify_files` name (`reward.txt`, `reward.json` in their text); Harbor "
        "tasks declare both. Ignored with `tests` (the reward is the tests').",
    )
    reward_range: tuple[float, float] = Field(
        (0.0, 1.0),
        description="The lowest and highest reward the task's reward file may hold: a value outside it (or not "
        "finite) is graded 0.0 with a `reward_out_of_range` finding (agent_error). Harbor's task.toml: "
        "`[verifier] reward_range = [low, high]`.",
    )
    reward_key: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = Field(
        None,
        description="Which key of a multi-metric reward.json is the reward. None: Harbor's rule (the `reward` key, "
        "else reward.txt's value when a task writes both, else the only numeric key); a reward.json that names no "
        "reward by these rules is graded 0.0 with a `reward_unparsable` finding. Harbor's task.toml: "
        '`[verifier] reward_key = "..."`.',
    )
    verify_sandbox: VerifySandbox = Field(
        "fresh",
        description="fresh: verify runs in a new sandbox made from the task's image with setup run again, fed a copy "
        "of the agent's work dir the host makes (regular files and directories only; no links, devices, owners or "
        "repository and packaging metadata unless named in solution_files): nothing else of the agent's box "
        "reaches the grade. same: verify runs in the agent's own sandbox under a grader identity with a fresh HOME "
        "and /tmp, for a task that grades more than files (a service the agent started, packages it installed). "
        "The result's grade_isolation says which the grade had.",
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
    services: list[Service] = Field(
        default_factory=list,
        max_length=MAX_SERVICES,
        description="Sidecars (a docker-compose environment's other services), each in a sandbox of its own sharing "
        "the rollout's network: its name resolves to 127.0.0.1; closed with the rollout. Local backend only.",
    )
    steps: list[RolloutStep] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="A multi-step task (Harbor's [[steps]]): the steps run in order in one sandbox, each its setup, "
        "the agent with its instruction, its verify in a fresh grader's box; a step under its min_reward stops the "
        "run. The result has a part per step; `instruction` is then shown only. Needs verify_sandbox='fresh'.",
    )
    step_reward: StepReward = Field(
        "mean",
        description="How the steps' grades make the reward (Harbor's multi_step_reward_strategy): mean, the mean "
        "over the graded steps; final, the last graded step's.",
    )
    memory_mb: int = Field(4096, ge=64, le=1_048_576, description="Memory for everything the rollout runs (MiB).")
    max_processes: int = Field(1024, ge=16, le=1_000_000, description="Processes and threads alive at once.")
    disk_mb: int = Field(8192, ge=64, le=1_048_576, description="Size of the rollout's writable tree (MiB).")
    cpus: float = Field(2.0, gt=0, le=1024, description="CPU time share, in cores.")

    @field_validator("workdir")
    @classmethod
    def _workdir_is_the_tasks(cls, workdir: str) -> str:
        if workdir:
            try:
                confined_dir(workdir)
            except OutsideTaskRoots as error:
                raise ValueError(f"workdir: {error}") from None
        return workdir

    @field_validator("files", "verify_files")
    @classmethod
    def _files_stay_in_the_tasks_roots(cls, files: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        _check_files(str(info.field_name), files, info.data.get("workdir") or WORKDIR)
        return files

    @field_validator("steps")
    @classmethod
    def _steps_named_once_files_confined(cls, steps: list[RolloutStep], info: ValidationInfo) -> list[RolloutStep]:
        names = [step.name for step in steps]
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"steps: {', '.join(twice)} named twice (a step's name is its key)")
        for index, step in enumerate(steps):
            for name, files in (("files", step.files), ("verify_files", step.verify_files)):
                _check_files(f"steps[{index}].{name}", files, info.data.get("workdir") or WORKDIR)
        total = sum(len(text) for step in steps for text in [*step.files.values(), *step.verify_files.values()])
        if total > MAX_STEPS_FILES_CHARS:
            raise ValueError(
                f"steps: {total} characters of files and verify_files in all, over the limit of {MAX_STEPS_FILES_CHARS}"
            )
        return steps

    @field_validator("skills_dir")
    @classmethod
    def _skills_are_the_tasks(cls, path: str | None) -> str | None:
        if path is not None:
            _in_task_roots("skills_dir", path)
        return path

    @field_validator("artifacts")
    @classmethod
    def _artifacts_are_the_tasks(cls, paths: list[str]) -> list[str]:
        for path in paths:
            _in_task_roots("artifacts", path)
        return paths

    @field_validator("solution_files")
    @classmethod
    def _solution_files_are_in_the_work_dir(cls, paths: list[str], info: ValidationInfo) -> list[str]:
        workdir = info.data.get("workdir") or WORKDIR
        for path in paths:
            parts = path.replace("\\", "/").split("/")
            if path.startswith("/") or ".." in parts or path.strip("/") in ("", "."):
                raise ValueError(f"solution_files: {path[:80]!r} must be relative to the work dir, with no '..'")
            try:
                confined_file(path, workdir)
            except OutsideTaskRoots as error:
                raise ValueError(f"solution_files: {error}") from None
        return [path.strip("/") for path in paths]

    @field_validator("reward_range")
    @classmethod
    def _reward_range_in_order(cls, bounds: tuple[float, float]) -> tuple[float, float]:
        low, high = bounds
        if not (math.isfinite(low) and math.isfinite(high)) or low > high:
            raise ValueError(f"reward_range: {list(bounds)} must be two finite numbers, the lower first")
        return bounds

    @field_validator("reward_files")
    @classmethod
    def _reward_files_once_each(cls, names: list[str] | None) -> list[str] | None:
        if names is not None and len(set(names)) != len(names):
            raise ValueError(f"reward_files: {names} names a file twice")
        return names

    @field_validator("env")
    @classmethod
    def _env_leaves_reserved_names_alone(cls, env: dict[str, str]) -> dict[str, str]:
        reserved = sorted(name for name in env if name in RESERVED_ENV or name.startswith("OPENCODE"))
        if reserved:
            raise ValueError(f"env: {', '.join(reserved)} reserved (PATH, HOME, USER, TMPDIR, PYTHONPATH, OPENCODE_*)")
        unsafe = loader_env_names(env)
        if unsafe:
            raise ValueError(f"env: {', '.join(unsafe)} refused (loader and shell start-up variables: LD_*, BASH_ENV)")
        return env

    @model_validator(mode="wrap")
    @classmethod
    def _unknown_fields_name_the_known(cls, data: Any, handler: ModelWrapValidatorHandler[RolloutRequest]) -> Any:
        try:
            return handler(data)
        except ValidationError as error:
            if not any(item["type"] == EXTRA for item in error.errors()):
                raise
            raise with_suggestions(cls, error) from None

    @model_validator(mode="after")
    def _timeouts_fit_the_total(self) -> RolloutRequest:
        if self.solution_as == "image_user" and self.image_user is None:
            raise ValueError("solution_as='image_user' needs image_user (the image's USER, like 'app' or '1234:1234')")
        if self.total_timeout_s is not None and self.total_timeout_s < 1:
            raise ValueError("total_timeout_s must be at least 1 second")
        if self.sampling is not None and self.mode == "black_box":
            raise ValueError("sampling: set by the capture proxy, so transparent_proxy mode only (mode='black_box')")
        if self.capture in ("tokens", "logprobs") and self.mode == "black_box":
            raise ValueError(f"capture={self.capture!r}: black_box mode records no model call; use capture='text'")
        if self.token_in != "off" and self.mode == "black_box":
            if "token_in" in self.model_fields_set:
                raise ValueError(
                    "token_in: done by the capture proxy, so transparent_proxy mode only (mode='black_box')"
                )
            self.token_in = "off"
        if self.steps and self.verify_sandbox != "fresh":
            raise ValueError("steps: each step is verified in a fresh grader's box (verify_sandbox='fresh')")
        if self.steps and self.tests is not None:
            raise ValueError("steps: not with `tests` (each step's verify and verify_files grade it)")
        if problems := service_problems(self.services):
            raise ValueError("; ".join(problems))
        service_names = frozenset(name for service in self.services for name in (service.name, *service.aliases))
        if problems := mcp_problems(self.mcp_servers, service_names, agent_runs=self.solution is None):
            raise ValueError("; ".join(problems))
        for service in self.services:
            if unsafe := loader_env_names(service.env):
                raise ValueError(
                    f"services.{service.name}.env: {', '.join(unsafe)} refused (loader and shell start-up "
                    "variables: LD_*, BASH_ENV)"
                )
        return self

    def declared_reward_files(self) -> tuple[RewardFile, ...]:
        """The reward files verify writes: `reward_files`, or those the task's own verify commands and files name.
        Only the task's text counts, never anything of the agent's."""
        if self.reward_files is not None:
            return tuple(self.reward_files)
        texts = [*self.verify, *self.verify_files.values()]
        names: tuple[RewardFile, ...] = ("reward.txt", "reward.json")
        return tuple(name for name in names if any(name in text for text in texts))

    def doing_nothing(self) -> RolloutRequest:
        """This task's do-nothing run: an oracle run with no solution (and none for any step)."""
        steps = [step.model_copy(update={"solution": []}) for step in self.steps]
        return self.model_copy(update={"solution": [], "steps": steps})

    def wanted_capture(self) -> Capture:
        """The capture this rollout needs: `capture`, or by default tokens through the proxy and text without it."""
        if self.capture is not None:
            return self.capture
        return "text" if self.mode == "black_box" else "tokens"


SANDBOX_MARGIN_S = 120.0
INSTALL_MARGIN_S = 600.0
PROXY_MARGIN_S = 30.0
COLLECT_MARGIN_S = 60.0


class DeadlineExceeded(Exception):
    """The rollout's overall deadline passed before a phase could start."""


def total_budget_s(request: RolloutRequest) -> float:
    if request.total_timeout_s is not None:
        return request.total_timeout_s
    phases = [(request.setup, request.agent_timeout_s, request.verify, request.verify_timeout_s)]
    if request.steps:
        phases = [
            (
                [*request.setup, *step.setup],
                step.agent_timeout_s or request.agent_timeout_s,
                request.verify if step.verify is None else step.verify,
                step.verify_timeout_s or request.verify_timeout_s,
            )
            for step in request.steps
        ]
    return (
        SANDBOX_MARGIN_S
        + INSTALL_MARGIN_S
        + PROXY_MARGIN_S
        + COLLECT_MARGIN_S
        + sum(
            request.setup_timeout_s * len(setup) + agent_s + verify_s * len(verify)
            for setup, agent_s, verify, verify_s in phases
        )
        + services_budget_s(request.services)
    )


class Deadline:
    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self._started = time.monotonic()

    def remaining(self) -> float:
        return self.total_s - (time.monotonic() - self._started)

    def budget(self, wanted_s: float) -> float:
        """The time a phase may take: what it wants, capped by what is left; raises when nothing is left."""
        left = self.remaining()
        if left <= 0:
            raise DeadlineExceeded(f"the rollout's overall deadline of {self.total_s:.0f}s has passed")
        return min(wanted_s, left)


def _check_files(name: str, files: dict[str, str], workdir: str) -> None:
    for path in files:
        try:
            confined_file(path, workdir)
        except OutsideTaskRoots as error:
            raise ValueError(f"{name}: {error}") from None
    total = sum(len(text) for text in files.values())
    if total > MAX_FILES_TOTAL_CHARS:
        raise ValueError(f"{name}: {total} characters in all, over the limit of {MAX_FILES_TOTAL_CHARS}")


def _in_task_roots(field: str, path: str) -> None:
    """ValueError naming `field` unless `path` is absolute and inside the task's roots."""
    if not path.startswith("/"):
        raise ValueError(f"{field}: {path[:80]!r} must be an absolute path")
    try:
        confined_dir(path)
    except OutsideTaskRoots as error:
        raise ValueError(f"{field}: {error}") from None
