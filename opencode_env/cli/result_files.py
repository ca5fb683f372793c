"""The result files a path names, for `export` and `view`: a RolloutResult JSON file, an eval's output directory
(its results/<task>/<n>.json, never its eval.json or summary.json, never an attempt cut short), or a directory of
result files. Each comes with where it came from and its attempt number (0 outside an eval)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from opencode_env.wire import RolloutResult

CUT_SHORT_SUFFIX = ".cancelled.json"


class ResultFileError(Exception):
    """A path that is not a result (or holds none); the message names it and why."""


@dataclass(frozen=True)
class ResultFile:
    path: Path
    attempt: int


def _attempt_number(path: Path) -> int:
    return int(path.stem) if path.stem.isdigit() else 0


def result_files(path: Path) -> list[ResultFile]:
    if not path.is_dir():
        return [ResultFile(path, 0)]
    if (path / "eval.json").is_file():
        found = sorted(path.glob("results/*/*.json"), key=lambda item: (item.parent.name, _attempt_number(item)))
        files = [ResultFile(item, _attempt_number(item)) for item in found if not item.name.endswith(CUT_SHORT_SUFFIX)]
    else:
        files = [ResultFile(item, 0) for item in sorted(path.glob("*.json"))]
    if not files:
        raise ResultFileError(f"{path} is a directory holding no result (an eval's output dir, or RESULT.json files)")
    return files


def read_result(path: Path) -> RolloutResult:
    try:
        return RolloutResult.model_validate_json(path.read_bytes())
    except OSError as error:
        raise ResultFileError(f"cannot read {path}: {error.strerror or error}") from error
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        message = first["msg"].removeprefix("Value error, ")
        raise ResultFileError(f"{path} is not a RolloutResult: {where}: {message}") from error
