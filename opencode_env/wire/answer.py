"""The MCP tool's answer: a summary of the rollout that fits every MCP client, and the whole result by reference
(inline when small). MCP clients refuse an event above 1 MiB by default and a result is megabytes, so the answer
holds what a caller decides on plus `result_ref` (an HTTP route and MCP resources of at most `PART_BYTES`); a
result of at most `INLINE_MAX_BYTES` (a quarter of that limit) also comes whole."""

from __future__ import annotations

from pydantic import BaseModel, Field

from opencode_env.wire.grading import GradedTest, GradeIsolation, IntegrityFinding
from opencode_env.wire.result import Phase, PhaseTimings, RewardSource, RolloutResult, RolloutStatus, TokenUsage
from opencode_env.wire.shared import WireFloat

INLINE_MAX_BYTES = 256 * 1024
PART_BYTES = 512 * 1024
RESULT_PATH = "/results"
RESOURCE_SCHEME = "opencode-env"


def resource_uri(ref: str, part: int) -> str:
    return f"{RESOURCE_SCHEME}://results/{ref}/{part}"


class ResultRef(BaseModel):
    """Where the whole RolloutResult is, and for how long."""

    id: str = Field(description="The result's capability: unguessable, known only to the caller that ran it.")
    url: str | None = Field(
        description="GET it (with the server's bearer token, as for the tool): the RolloutResult JSON, "
        "absolute when the server knows how the call reached it, else relative to the server's URL; "
        "gzip-encoded (Content-Encoding: gzip; plain JSON to a client that does not accept gzip). None over "
        "stdio, where the server has no HTTP route: read the resources."
    )
    path: str = Field(
        description="The same route relative to the server (when the URL's host is not how you reach it)."
    )
    resources: list[str] = Field(
        description="The same bytes as MCP resources (resources/read): blobs, in order, of the gzip stream; "
        "concatenated and gunzipped they are the RolloutResult JSON."
    )
    json_bytes: int = Field(description="Size of the RolloutResult JSON.")
    gzip_bytes: int = Field(description="Size of the gzip stream (what the URL sends).")
    sha256: str = Field(description="SHA-256 of the RolloutResult JSON (uncompressed), hex.")
    retention_s: float = Field(description="How long the server keeps it after the rollout (the operator's setting).")
    expires_at: float = Field(description="When it is deleted, seconds since the epoch (UTC).")


ANSWER_LIST_MAX = 100
"""At most this many integrity findings and test outcomes in the answer; the whole lists are in the result."""


class RolloutAnswer(BaseModel):
    """run_rollout's structured content over MCP: the rollout's summary, and where its whole result is."""

    task_id: str = Field("", description="The request's task_id, echoed.")
    status: RolloutStatus = Field(description="How the rollout ended; infrastructure failures carry no reward.")
    reward: WireFloat | None = Field(None, description="The verifier's reward; None when there is none.")
    reward_source: RewardSource = Field("none", description="Where the reward came from.")
    grade_isolation: GradeIsolation = Field("none", description="Where it was graded (result.grade_isolation).")
    error: str | None = Field(None, description="What went wrong, when status is not completed.")
    failed_phase: Phase | None = Field(None, description="The phase that failed or was cut short, if any.")
    backend: str = Field("", description="The sandbox backend that ran the rollout.")
    sandbox_id: str = Field("", description="The sandbox the rollout ran in.")
    wall_s: WireFloat = Field(0.0, description="Wall-clock seconds of the whole rollout.")
    usage: TokenUsage = Field(default_factory=TokenUsage, description="Token counts over the captured LLM calls.")
    timings: PhaseTimings = Field(default_factory=PhaseTimings, description="Seconds spent in each phase.")
    turns: int = Field(0, description="Model calls the proxy captured.")
    sampled_tokens: int = Field(0, description="Completion tokens over every captured call.")
    warnings: list[str] = Field(default_factory=list, description="What a trainer should know about the data.")
    coverage: str = Field("", description="How many agent tokens a training export carries (training.coverage).")
    integrity: list[IntegrityFinding] = Field(
        default_factory=list,
        description=f"Grader files the agent created, changed or deleted (result.integrity): the first "
        f"{ANSWER_LIST_MAX}, so that an agent that plants a million files cannot push the answer past a client's "
        "limit; integrity_total counts them all.",
    )
    integrity_total: int = Field(0, ge=0, description="len(result.integrity).")
    test_outcomes: list[GradedTest] = Field(
        default_factory=list,
        description=f"The test grader's per-test outcomes (result.test_outcomes), the first {ANSWER_LIST_MAX}.",
    )
    test_outcomes_total: int = Field(0, ge=0, description="len(result.test_outcomes).")
    schema_version: int = Field(description="The RolloutResult's wire shape.")
    result_ref: ResultRef | None = Field(None, description="Where the whole RolloutResult is; None if not kept.")
    result: RolloutResult | None = Field(
        None, description=f"The whole RolloutResult when its JSON is at most {INLINE_MAX_BYTES} bytes; else None."
    )


def inline_result(structured: object) -> RolloutResult:
    """The whole RolloutResult a tool answer carries inline (a small one); a ValueError naming where a larger one is.
    A RolloutResult object itself (what OpenEnv's sessions answer with) is taken as it is."""
    if isinstance(structured, dict) and "result_ref" in structured:
        answer = RolloutAnswer.model_validate(structured)
        if answer.result is None:
            where = answer.result_ref.url if answer.result_ref else "nowhere (not kept)"
            raise ValueError(f"the result is {where}: over {INLINE_MAX_BYTES} bytes, it is only by reference")
        return answer.result
    return RolloutResult.model_validate(structured)
