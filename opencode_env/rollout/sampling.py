"""What a trainer should know about a rollout's sampling before trusting its logprobs as the sampler's.

Pure. A policy-gradient loss needs the logprob of each token under the distribution that sampled it. vLLM returns,
by default (`--logprobs-mode raw_logprobs`), the logprobs of the model's unmodified distribution: the same as the
sampler's only when sampling is neutral (temperature 1, no top-p/top-k/min-p cut, no penalty). With no `sampling`
in the request, the model server's defaults decided, and vLLM applies the model's generation_config (often a
temperature, top_p and top_k), which the result does not record.
"""

from __future__ import annotations

from opencode_env.wire import RolloutRequest, Sampling
from opencode_env.wire.notices import Notice

UNRECORDED = (
    "no sampling was set: the model server's defaults decided the sampling, unrecorded (vLLM applies the model's "
    "generation_config, often a temperature, top_p and top_k under which raw logprobs are not those of the "
    "distribution that sampled)"
)
RECORD_FIX = (
    "set RolloutRequest.sampling, e.g. temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0 to sample from the model's "
    "own distribution (what `opencode-env demo` does)"
)
PROCESSED_FIX = "start vLLM with --logprobs-mode processed_logprobs"


SHAPING_FIELDS = ("temperature", "top_p", "top_k", "min_p")
"""The fields that shape the distribution sampled from, whose server defaults vLLM takes from the model."""


def sampling_notices(task: RolloutRequest | None, *, sampled: bool, logprobs_kind: str | None = None) -> list[Notice]:
    """What the result says of its sampling. Applies only to a rollout that sampled (`sampled`: a model call was
    recorded; never a refused, oracle or black_box one). The raw-logprobs one only where the probe did not tell the
    server's kind (`logprobs_kind`: the probe's own warning covers raw, and processed logprobs are the sampler's)."""
    if task is None or not sampled or task.solution is not None or task.mode == "black_box":
        return []
    if task.sampling is None:
        return [Notice(code="sampling_unrecorded", severity="warning", message=UNRECORDED, fix=RECORD_FIX)]
    notices = []
    unset = [name for name in SHAPING_FIELDS if getattr(task.sampling, name) is None]
    if unset:
        message = (
            f"sampling fields left unset ({', '.join(unset)}) are the model server's defaults, unrecorded (vLLM "
            "applies the model's generation_config)"
        )
        notices.append(Notice(code="sampling_fields_unset", severity="warning", message=message, fix=RECORD_FIX))
    changed = non_neutral_fields(task.sampling)
    if not changed or logprobs_kind in ("raw", "processed"):
        return notices
    named = ", ".join(f"{name}={value}" for name, value in changed.items())
    message = (
        f"sampling is not neutral ({named}): a server that returns raw logprobs (vLLM's default --logprobs-mode "
        f"raw_logprobs) gives the logprobs of the unmodified distribution, not of the one that sampled; {PROCESSED_FIX}"
    )
    return [*notices, Notice(code="sampling_not_neutral", severity="warning", message=message, fix=PROCESSED_FIX)]


def non_neutral_fields(sampling: Sampling) -> dict[str, float]:
    """The fields set to a value that changes the distribution sampled from, by name."""
    changed = {
        "temperature": sampling.temperature is not None and sampling.temperature != 1,
        "top_p": sampling.top_p is not None and sampling.top_p < 1,
        "top_k": sampling.top_k is not None and sampling.top_k > 0,
        "min_p": sampling.min_p is not None and sampling.min_p > 0,
        "repetition_penalty": sampling.repetition_penalty is not None and sampling.repetition_penalty != 1,
        "presence_penalty": bool(sampling.presence_penalty),
        "frequency_penalty": bool(sampling.frequency_penalty),
    }
    return {name: getattr(sampling, name) for name, is_changed in changed.items() if is_changed}
