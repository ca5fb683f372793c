"""The `opencode-env` command line: every argument parser of the project, each calling into a domain package
(rollout, evals, tasks, training, viewer, sandbox); no domain package imports this one (an import contract says so).

app.py: the top parser, `main` and the small commands (demo, serve, mcp, install, reap, settings, build-template);
run.py, eval.py, check_task.py, export.py, view.py, image.py: a command each; support.py: what they share."""

from __future__ import annotations

from opencode_env.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
