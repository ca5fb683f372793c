"""An eval's inputs: Harbor task directories (or directories of them) and JSON / JSONL files of requests, loaded as
the requests an eval runs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opencode_env.evals.runner import EvalError, Report
from opencode_env.sandbox.local.services import DataError, read_data_file
from opencode_env.wire import RolloutRequest, request_problems
from opencode_env.wire.bounded_parse import REQUEST_FILE, ParseLimit, loads_json


def _task_id_from_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:@+/-]", "-", name)[:256] or "task"


def _parse_json(text: str, where: str) -> Any:
    try:
        return loads_json(text, where=where, limits=REQUEST_FILE)
    except json.JSONDecodeError as error:
        raise EvalError(f"{where}: not JSON: {error}") from error
    except ParseLimit as error:
        raise EvalError(str(error)) from None


def _file_entries(path: Path, *, named: bool = True) -> Iterator[tuple[str, str, Any]]:
    """(where, default task id, JSON value) of each request in a .json or .jsonl file, read as data (a file found
    in a folder, not `named` by the operator, is never read through a link). A .jsonl line that is not JSON gives
    its EvalError as the value, so the file's other lines still load and every bad line is named."""
    try:
        text = read_data_file(path, REQUEST_FILE.max_chars, follow_link=named).decode("utf-8")
    except (OSError, UnicodeDecodeError, DataError) as error:
        raise EvalError(f"cannot read {path}: {error}") from error
    stem = _task_id_from_name(path.stem)
    if path.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                where = f"{path} line {number}"
                try:
                    yield where, f"{stem}-{number}", _parse_json(line, where)
                except EvalError as error:
                    yield where, f"{stem}-{number}", error
        return
    data = _parse_json(text, str(path))
    if isinstance(data, list):
        for index, item in enumerate(data):
            yield f"{path}[{index}]", f"{stem}-{index + 1}", item
    else:
        yield str(path), stem, data


def _for_this_run(where: str, request: RolloutRequest, *, oracle: bool) -> RolloutRequest:
    if oracle and request.solution is None:
        raise EvalError(f"{where}: task {request.task_id!r} has no solution to run with --oracle")
    return request if oracle else request.model_copy(update={"solution": None})


def _from_file(
    path: Path, *, oracle: bool, loaded: LoadedTasks, named: bool = True
) -> list[tuple[str, RolloutRequest]]:
    """The file's requests; each entry that is not one is refused with where and why (the whole file when it cannot
    be read, or, for a .json file, when it is not JSON), the others kept."""
    requests = []
    try:
        entries = list(_file_entries(path, named=named))
    except EvalError as error:
        loaded.refuse(str(error))
        return []
    for where, default_id, data in entries:
        if isinstance(data, EvalError):
            loaded.refuse(str(data))
            continue
        try:
            request = RolloutRequest.model_validate(data)
        except ValidationError as error:
            loaded.refuse(f"{where}: not a RolloutRequest: {request_problems(error)}")
            continue
        if not request.task_id:
            request = request.model_copy(update={"task_id": default_id})
        try:
            requests.append((where, _for_this_run(where, request, oracle=oracle)))
        except EvalError as error:
            loaded.refuse(str(error))
    return requests


REQUEST_SUFFIXES = (".json", ".jsonl")


@dataclass
class Folder:
    """What a folder given to eval holds: task directories (a child with task.toml or instruction.md), request
    files (*.json, *.jsonl), and the entries refused (links: what a folder holds is never read through one)."""

    task_dirs: list[Path] = field(default_factory=list)
    request_files: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def read_folder(path: Path) -> Folder:
    """The task directory itself, or what a dataset folder holds (hidden entries and other files are not inputs);
    a folder with neither is read as a task directory, so its error says what it lacks."""
    if (path / "task.toml").exists():
        return Folder(task_dirs=[path])
    folder = Folder()
    for child in sorted(path.iterdir()):
        if child.name.startswith("."):
            continue
        is_task = (child / "task.toml").exists() or (child / "instruction.md").exists()
        if child.is_symlink():
            if is_task or child.suffix in REQUEST_SUFFIXES:
                folder.refused.append(f"{child}: a symbolic link; what a folder holds is never read through links")
        elif child.is_dir() and is_task:
            folder.task_dirs.append(child)
        elif child.is_file() and child.suffix in REQUEST_SUFFIXES:
            folder.request_files.append(child)
    if not (folder.task_dirs or folder.request_files or folder.refused):
        folder.task_dirs.append(path)
    return folder


def _from_task_dir(path: Path, *, oracle: bool, image_progress: Report) -> RolloutRequest:
    from opencode_env.sandbox.local.services import ImageBuildError, missing_base_hint
    from opencode_env.tasks.harbor import request_from_task_dir

    try:
        request = request_from_task_dir(path, oracle=oracle, progress=image_progress)
    except (ValueError, OSError, ImageBuildError) as error:
        raise EvalError(f"{path}: {missing_base_hint(str(error))}") from error
    return request if request.task_id else request.model_copy(update={"task_id": _task_id_from_name(path.name)})


@dataclass
class LoadedTasks:
    """The requests that loaded, in order, and one line per task that did not (where, and why)."""

    tasks: list[RolloutRequest] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    fail_fast: bool = False

    def refuse(self, line: str) -> None:
        if self.fail_fast:
            raise EvalError(line)
        self.broken.append(line)


def _load_path(
    path: Path, *, oracle: bool, loaded: LoadedTasks, report: Report, image_progress: Report
) -> list[tuple[str, RolloutRequest]]:
    if path.is_dir():
        entries = []
        folder = read_folder(path)
        if folder.task_dirs != [path]:
            report(
                f"{path}: {len(folder.task_dirs)} task directories, {len(folder.request_files)} request files"
                + (f", {len(folder.refused)} refused" if folder.refused else "")
            )
        for line in folder.refused:
            loaded.refuse(line)
        for request_file in folder.request_files:
            report(f"loading {request_file}")
            entries += _from_file(request_file, oracle=oracle, loaded=loaded, named=False)
        for task_dir in folder.task_dirs:
            report(f"loading {task_dir} (its image is built now if it has none yet)")
            try:
                entries.append((str(task_dir), _from_task_dir(task_dir, oracle=oracle, image_progress=image_progress)))
            except EvalError as error:
                loaded.refuse(str(error))
        return entries
    if not path.exists():
        raise EvalError(f"{path}: no such file or directory")
    return _from_file(path, oracle=oracle, loaded=loaded)


def load_each(
    paths: Sequence[Path],
    *,
    oracle: bool = False,
    fail_fast: bool = False,
    report: Report | None = None,
    image_progress: Report | None = None,
) -> LoadedTasks:
    """The requests of Harbor task directories (or directories of them) and JSON / JSONL files, in order, and each
    task that is broken (with why) instead of stopping at it; a path that does not exist or a task id given twice
    is still an error. A request without a task id is named after its file; requests' `solution` is kept with
    `oracle`, dropped without. With `fail_fast` the first broken task is an EvalError. Progress (each task
    directory as its image is built) goes to `report`, what each build does (its steps, its archives) to
    `image_progress`."""
    loaded = LoadedTasks(fail_fast=fail_fast)
    report, image_progress = report or _quiet, image_progress or _quiet
    entries = [
        entry
        for path in paths
        for entry in _load_path(path, oracle=oracle, loaded=loaded, report=report, image_progress=image_progress)
    ]
    seen: dict[str, str] = {}
    for where, request in entries:
        if request.task_id in seen:
            raise EvalError(f"task id {request.task_id!r} appears twice, in {seen[request.task_id]} and in {where}")
        seen[request.task_id] = where
    loaded.tasks = [request for _, request in entries]
    return loaded


def load_tasks(paths: Sequence[Path], *, oracle: bool = False) -> list[RolloutRequest]:
    """`load_each`'s requests, stopping at the first broken task (EvalError naming it and why)."""
    return load_each(paths, oracle=oracle, fail_fast=True).tasks


def _quiet(_: str) -> None:
    return None


def with_model(
    tasks: Sequence[RolloutRequest], *, endpoint: str = "", base_url: str = "", model: str = "", api_key: str = ""
) -> list[RolloutRequest]:
    """The tasks with each non-empty field given here in place of their own (validated again)."""
    overrides = {
        name: value
        for name, value in (("endpoint", endpoint), ("base_url", base_url), ("model", model), ("api_key", api_key))
        if value
    }
    if not overrides:
        return list(tasks)
    try:
        return [RolloutRequest.model_validate({**task.model_dump(), **overrides}) for task in tasks]
    except ValidationError as error:
        raise EvalError(f"the model options do not fit a request: {error.errors()[0]['msg']}") from error
