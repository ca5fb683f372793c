"""From results to what trainers consume: training sequences, step samples, coverage, TRL and OpenEnv rows, export.
Pure data: it imports the wire and nothing that runs a rollout (the pipeline never imports it either; a driver that
runs rollouts for a trainer, `evals/trl_rollout.py`, lives with the drivers)."""

from opencode_env.training.coverage import Coverage, RolloutCoverage
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
    "sequences_coverage",
    "steps_coverage",
    "training_sequences",
    "training_steps",
    "training_steps_batch",
    "training_summary",
    "trl_row_coverage",
]
