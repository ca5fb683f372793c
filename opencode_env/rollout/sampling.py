"""What a trainer should know about a rollout's sampling before trusting its logprobs as the sampler's.

Pure. A policy-gradient loss needs the logprob of each token under the distribution that sampled it. vLLM returns,
by default (`--logprobs-mode raw_logprobs`), the logprobs of the model's unmodified distribution: the same as the
sampler's only when sampling is neutral (temperature 1, no top-p/top-k/min-p cut, no penalty). With no `sampling`
in the request, the model server's defaults decided, and vLLM applies the model's generation_config (often a
temperature, top_p and top_k), which the result does not record.
"""

from __future__ import annotations

from opencode_env.wire import RolloutRequest, Sampling

UNRECORDED = (
    "no sampling was set: the model server's defaults decided the sampling, unrecorded (vLLM applies the model's "
    "generation_config, often a temperature, top_p and top_k under which raw logprobs are not those of the "
    "distribution that sampled); set RolloutRequest.sampling to record it"
)


SHAPING_FIELDS = ("temperature", "top_p", "top_k", "min_p")
"""The fields that shape the distribution sampled from, whose server defaults vLLM takes from the model."""


def sampling_warnings(task: RolloutRequest | None) -> list[str]:
    """Warnings for RolloutResult.warnings; [] for a result without its request, an oracle run or black_box mode
    (no model call recorded, no logprobs to doubt)."""
    if task is None or task.solution is not None or task.mode == "black_box":
        return []
    if task.sampling is None:
        return [UNRECORDED]
    warnings = []
    unset = [name for name in SHAPING_FIELDS if getattr(task.sampling, name) is None]
    if unset:
        warnings.append(
            f"sampling fields left unset ({', '.join(unset)}) are the model server's defaults, unrecorded (vLLM "
            "applies the model's generation_config)"
        )
    changed = non_neutral_fields(task.sampling)
    if not changed:
        return warnings
    named = ", ".join(f"{name}={value}" for name, value in changed.items())
    return [
        *warnings,
        f"sampling is not neutral ({named}): a server that returns raw logprobs (vLLM's default --logprobs-mode "
        "raw_logprobs) gives the logprobs of the unmodified distribution, not of the one that sampled; start vLLM "
        "with --logprobs-mode processed_logprobs",
    ]


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
