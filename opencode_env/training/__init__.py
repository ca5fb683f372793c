"""From results to what trainers consume: training sequences, step samples, coverage, TRL and OpenEnv rows, export,
attribution."""

from opencode_env.training.coverage import Coverage, RolloutCoverage
from opencode_env.training.sampling import sampling_warnings
from opencode_env.training.sequences import (
    TrainingSequence,
    TrainingSequences,
    TrainingSummary,
    sequences_coverage,
    training_sequences,
    training_summary,
    trl_row_coverage,
)
from opencode_env.training.steps import StepSample, steps_coverage, training_steps, training_steps_batch

__all__ = [
    "Coverage",
    "RolloutCoverage",
    "StepSample",
    "TrainingSequence",
    "TrainingSequences",
    "TrainingSummary",
    "sampling_warnings",
    "sequences_coverage",
    "steps_coverage",
    "training_sequences",
    "training_steps",
    "training_steps_batch",
    "training_summary",
    "trl_row_coverage",
]
