"""A Dockerfile read as Docker reads its FROM lines (pure): instructions joined across `\\` continuations, comments
and parser directives dropped, the ARGs declared before the first FROM (the only ones a FROM may use) substituted
into it with Docker's forms `$NAME`, `${NAME}`, `${NAME:-word}` and `${NAME:+word}`. The builder copies the bases
so named into its box; a FROM whose variable has no value is refused by name before any build."""

from __future__ import annotations

import re
from dataclasses import dataclass

_VARIABLE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:[-+])(?P<word>[^}]*))?\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)
_ARG = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:=(?P<value>.*))?$")
_FROM_WORDS = re.compile(r"^(?:--\S+\s+)*(?P<image>\S+)(?:\s+AS\s+(?P<stage>\S+))?\s*$", re.IGNORECASE)
_IMAGE_REFERENCE = re.compile(r"^[a-z0-9][A-Za-z0-9._/:@-]{0,254}$")


class DockerfileError(ValueError):
    """A Dockerfile line this builder cannot resolve (named by its line number)."""


@dataclass(frozen=True)
class Instruction:
    line: int
    """The line number where the instruction starts (1-based)."""
    keyword: str
    """Upper case: FROM, RUN, ARG, ..."""
    arguments: str


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined (the escape character `\\`)."""
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        continued = stripped.endswith("\\")
        pending.append(stripped[:-1] if continued else stripped)
        if continued:
            continue
        keyword, _, arguments = " ".join(pending).strip().partition(" ")
        found.append(Instruction(start, keyword.upper(), arguments.strip()))
        pending = []
    if pending:
        keyword, _, arguments = " ".join(pending).strip().partition(" ")
        found.append(Instruction(start, keyword.upper(), arguments.strip()))
    return found


def substitute(text: str, values: dict[str, str | None], *, line: int) -> str:
    """`text` with Docker's variable forms replaced; a variable with no value (an ARG without a default, or none)
    in a plain form is an error naming it."""

    def one(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bare")
        value = values.get(name)
        op, word = match.group("op"), match.group("word")
        if op == ":-":
            return value if value else substitute(word, values, line=line)
        if op == ":+":
            return substitute(word, values, line=line) if value else ""
        if value is None:
            raise DockerfileError(
                f"Dockerfile line {line}: ${name} has no value (declare it before the first FROM as `ARG {name}="
                "VALUE`; no build arguments are passed)"
            )
        return value

    return _VARIABLE.sub(one, text)


def base_images(text: str) -> list[str]:
    """The images the FROM lines name, ARGs before the first FROM substituted (not the file's own stages, not
    scratch), in order, each once."""
    values: dict[str, str | None] = {}
    stages: set[str] = set()
    names: list[str] = []
    global_scope = True
    for instruction in instructions(text):
        if instruction.keyword == "ARG" and global_scope:
            values |= _declared(instruction.arguments)
        elif instruction.keyword == "FROM":
            global_scope = False
            image, stage = _from(instruction, values)
            if image.lower() not in stages and image != "scratch" and image not in names:
                names.append(image)
            if stage:
                stages.add(stage.lower())
    return names


def _declared(arguments: str) -> dict[str, str | None]:
    """An ARG's names and their defaults (None: declared without one)."""
    values: dict[str, str | None] = {}
    for word in arguments.split():
        declared = _ARG.match(word)
        if declared is not None:
            value = declared.group("value")
            values[declared.group("name")] = _unquoted(value) if value is not None else None
    return values


def _from(instruction: Instruction, values: dict[str, str | None]) -> tuple[str, str | None]:
    where = f"Dockerfile line {instruction.line}: FROM"
    words = _FROM_WORDS.match(instruction.arguments)
    if words is None:
        raise DockerfileError(f"{where} {instruction.arguments[:120]!r} names no image")
    image = substitute(words.group("image"), values, line=instruction.line)
    if image != "scratch" and not _IMAGE_REFERENCE.match(image):
        raise DockerfileError(f"{where} {image[:120]!r} is not an image reference")
    return image, words.group("stage")


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value
