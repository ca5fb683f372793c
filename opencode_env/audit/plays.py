"""The panel: each play is one shell script run as the agent (the `user` identity, in the agent's phase, in its box,
from its work dir) in place of a model, with a header that says what it is:

    # name: conftest-pass
    # family: test-runner hooks
    # tries: what the script does
    # proves: what its success says about the task's grader
    # applies: a read-only shell test: does the box offer what the play needs (run once per task, in the survey)
    # keeps: (optional) a command printing the work-dir paths the play writes that a naive grader would keep
    # fix: the change to the task that closes the hole

A play that finds nothing to act on exits NOT_APPLICABLE. The built-in panel is this package's plays/ folder; a user
adds plays from a folder of their own (a play of the same name replaces the built-in one)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, Field

from opencode_env.wire import MAX_COMMAND_CHARS

NOT_APPLICABLE = 3
"""A play's exit status when it found nothing to act on (no visible test, no repository...)."""
REQUIRED = ("name", "family", "tries", "proves", "applies", "fix")
HEADER_LINE = re.compile(r"^#\s*([a-z]+):\s?(.*)$")
PLAY_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_PLAY_CHARS = MAX_COMMAND_CHARS - 1_000


class PlayError(ValueError):
    """A play file that is not a play: which file, which field, what is wrong."""


class Play(BaseModel):
    name: str
    family: str
    tries: str
    proves: str
    applies: str = Field(description="A read-only shell test, true when the box offers what the play needs.")
    keeps: str = Field("", description="Prints the work-dir paths the play writes that a naive grader keeps.")
    fix: str
    script: str = Field(description="The whole file, run by bash from the work dir as the agent.")
    source: str = Field(description="Where the play came from: builtin, or its file.")


def parse_play(text: str, source: str) -> Play:
    """A play from its file's text; PlayError names the file and the field at fault."""
    if len(text) > MAX_PLAY_CHARS:
        raise PlayError(f"{source}: {len(text)} characters, over the limit of {MAX_PLAY_CHARS} for a play")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#!"):
            continue
        match = HEADER_LINE.match(line)
        if match is None:
            break
        fields.setdefault(match.group(1), match.group(2).strip())
    missing = [name for name in REQUIRED if not fields.get(name)]
    if missing:
        raise PlayError(f"{source}: header lacks {', '.join(missing)} (each a '# name: value' line at the top)")
    if not PLAY_NAME.match(fields["name"]):
        raise PlayError(
            f"{source}: name {fields['name'][:80]!r} must be lowercase letters, digits and '-' (at most 63)"
        )
    return Play(
        name=fields["name"],
        family=fields["family"],
        tries=fields["tries"],
        proves=fields["proves"],
        applies=fields["applies"],
        keeps=fields.get("keeps", ""),
        fix=fields["fix"],
        script=text,
        source=source,
    )


def builtin_plays() -> list[Play]:
    folder = resources.files("opencode_env.audit").joinpath("plays")
    files = sorted((entry for entry in folder.iterdir() if entry.name.endswith(".sh")), key=lambda entry: entry.name)
    return [parse_play(entry.read_text(encoding="utf-8"), "builtin") for entry in files]


def plays_from_folder(folder: Path) -> list[Play]:
    """Every *.sh in `folder` (not through links), in name order."""
    if not folder.is_dir():
        raise PlayError(f"{folder}: not a folder of plays")
    plays = []
    for path in sorted(folder.glob("*.sh")):
        if path.is_symlink() or not path.is_file():
            raise PlayError(f"{path}: not a regular file (plays are never read through links)")
        plays.append(parse_play(path.read_text(encoding="utf-8"), str(path)))
    return plays


def panel(extra: Sequence[Path] = (), only: Sequence[str] = ()) -> list[Play]:
    """The built-in plays, then each folder's (a name given again replaces the earlier play), narrowed to `only`."""
    by_name = {play.name: play for play in builtin_plays()}
    for folder in extra:
        by_name.update((play.name, play) for play in plays_from_folder(folder))
    unknown = sorted(set(only) - set(by_name))
    if unknown:
        raise PlayError(f"--play: no play named {', '.join(unknown)} (known: {', '.join(sorted(by_name))})")
    return [play for name, play in sorted(by_name.items()) if not only or name in only]
