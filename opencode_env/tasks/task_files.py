"""A task directory's files read as data (sandbox/local/files/data_dir.py: no link followed, regular files only, bounded
reads), refusals raised as the task's format error."""

from __future__ import annotations

from opencode_env.sandbox.local.services import DataDir


class TaskFormatError(ValueError):
    """A task directory that cannot be read as a Harbor task; the message names the file and the field."""


class TaskDir(DataDir):
    """Reads below one task directory; each method takes a path relative to it ('tests', 'tests/test.sh')."""

    error = TaskFormatError
