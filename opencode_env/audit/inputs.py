"""An audit's inputs, read as `eval` reads them (evals/inputs.py): Harbor task directories, folders of them, JSON and
JSONL request files. Each task is loaded twice, as the agent gets it and with its oracle; a task without an oracle
is broken for an audit (nothing shows it can be solved)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opencode_env.audit.driver import AuditTask
from opencode_env.audit.layouts import TaskKind
from opencode_env.evals.inputs import load_each, read_folder
from opencode_env.evals.runner import EvalError, Report


@dataclass
class AuditInputs:
    tasks: list[AuditTask] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)


def _quiet(_: str) -> None:
    return None


def _split(paths: Sequence[Path]) -> tuple[list[Path], list[Path], list[str]]:
    harbor: list[Path] = []
    files: list[Path] = []
    refused: list[str] = []
    for path in paths:
        if path.is_dir():
            folder = read_folder(path)
            harbor += folder.task_dirs
            files += folder.request_files
            refused += folder.refused
        elif path.exists():
            files.append(path)
        else:
            raise EvalError(f"{path}: no such file or directory")
    return harbor, files, refused


def load_audit_inputs(
    paths: Sequence[Path], *, report: Report | None = None, image_progress: Report | None = None
) -> AuditInputs:
    report, image_progress = report or _quiet, image_progress or _quiet
    harbor, files, refused = _split(paths)
    loaded = AuditInputs(broken=list(refused))
    seen: set[str] = set()
    groups: list[tuple[TaskKind, list[Path]]] = [("harbor", harbor), ("request", files)]
    for kind, group in groups:
        if not group:
            continue
        oracles = load_each(group, oracle=True, report=report, image_progress=image_progress)
        agents = {request.task_id: request for request in load_each(group, report=_quiet).tasks}
        loaded.broken += oracles.broken
        for oracle in oracles.tasks:
            if oracle.task_id in seen:
                raise EvalError(f"task id {oracle.task_id!r} appears twice")
            seen.add(oracle.task_id)
            agent = agents.get(oracle.task_id)
            if agent is not None:
                loaded.tasks.append(AuditTask(oracle.task_id, kind, agent, oracle))
    return loaded
