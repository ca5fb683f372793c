"""Evals: run tasks k times each, resumably, and summarize pass@k, from `opencode-env eval` or from Python:
`summary = await run_eval(load_tasks([Path("tasks/")]), out=Path("runs/eval-1"), k=8, concurrency=8)` (or
`run_eval_sync(...)`, also in a notebook), then `print(summary.table())`."""

from __future__ import annotations

from opencode_env.evals.inputs import load_tasks, with_model
from opencode_env.evals.runner import EvalConfig, EvalError, EvalLayout, run_eval, run_eval_sync, safe_task_id
from opencode_env.evals.summary import (
    AttemptOutcome,
    EvalSummary,
    Tally,
    TaskSummary,
    format_table,
    pass_at_k,
    summarize,
    summarize_results,
)

__all__ = [
    "AttemptOutcome",
    "EvalConfig",
    "EvalError",
    "EvalLayout",
    "EvalSummary",
    "Tally",
    "TaskSummary",
    "format_table",
    "load_tasks",
    "pass_at_k",
    "run_eval",
    "run_eval_sync",
    "safe_task_id",
    "summarize",
    "summarize_results",
    "with_model",
]
