"""The grader's copy of a test file: every test renamed to a fresh random name, each graded test beside a mutant of
itself (the same test with the expected value of one assertion perturbed) and a few constant canaries placed among
them (pure).

A mutant and its original differ in one literal only, and which one comes first is a coin flip: nothing but knowing
which expected value is right (solving) tells them apart. An honest run can pass at most one of the two (the same
call cannot equal two different values); a forger that makes failures pass without knowing which is right passes
both, or guesses, once per pair.
"""

from __future__ import annotations

import ast
import random
import re
import string
from collections import Counter
from dataclasses import dataclass, field

MAX_LITERAL_CHARS = 4096
"""A literal longer than this as source is left alone (a mutant would double a large expected value)."""
NAME_LETTERS = 12
LOWER = string.ascii_lowercase
DEF_NAME = re.compile(rb"(?:async\s+)?def\s+([A-Za-z_][A-Za-z0-9_]*)")

Scope = tuple[str, str]
"""(the test class or "", the test function's name)."""


@dataclass(frozen=True)
class Rewritten:
    """One test file's copy: `names` maps each renamed test to its new name, `twins` each mutated test to its
    mutant's name, `canaries` lists the constant canaries placed in it as (class or "", name, passes)."""

    source: str
    names: dict[Scope, str] = field(default_factory=dict)
    twins: dict[Scope, str] = field(default_factory=dict)
    canaries: tuple[tuple[str, str, bool], ...] = ()


@dataclass(frozen=True)
class _Test:
    owner: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    first: int
    """The block's first line (its first decorator's), 1-based."""


def fresh_name(rng: random.Random, taken: set[str], prefix: str = "test_") -> str:
    while True:
        number = rng.getrandbits(64) % len(LOWER) ** NAME_LETTERS
        letters = []
        for _ in range(NAME_LETTERS):
            number, digit = divmod(number, len(LOWER))
            letters.append(LOWER[digit])
        name = prefix + "".join(letters)
        if name not in taken:
            taken.add(name)
            return name


def perturb(value: object, rng: random.Random) -> object | None:
    """A value of the same type and shape that differs from `value` and whose repr reads back as itself, or None
    when `value` has none (None, empty containers and strings, values whose repr does not round-trip).

    The draw is symmetric: the chance that `a` becomes `b` equals the chance that `b` becomes `a` (integers by an
    exclusive or that keeps their sign, a character swapped for another of its class, one element of a container), so
    whoever sees the pair {a, b} and knows nothing of the right value but a prior flat around it cannot tell which
    one was drawn from the other."""
    if not _round_trips(value):
        return None
    for _ in range(8):
        changed = _perturbed(value, rng)
        if changed is not None and changed != value and type(changed) is type(value) and _round_trips(changed):
            return changed
    return None


def _perturbed(value: object, rng: random.Random) -> object | None:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        mask = rng.randint(1, 3)
        return value ^ mask if value >= 0 else -(((-value - 1) ^ mask) + 1)
    if isinstance(value, float):
        return value + rng.choice((-2.0, -1.0, -0.5, 0.5, 1.0, 2.0))
    if isinstance(value, str | bytes):
        return _perturbed_text(value, rng) if value else None
    if isinstance(value, list | tuple) and value:
        index = rng.randrange(len(value))
        item = perturb(value[index], rng)
        return None if item is None else type(value)([*value[:index], item, *value[index + 1 :]])
    if isinstance(value, dict) and value:
        key = rng.choice(list(value))
        item = perturb(value[key], rng)
        return None if item is None else {**value, key: item}
    if isinstance(value, set | frozenset) and value:
        chosen = rng.choice(sorted(value, key=repr))
        item = perturb(chosen, rng)
        return None if item is None or item in value else type(value)((value - {chosen}) | {item})
    return None


def _perturbed_text(value: str | bytes, rng: random.Random) -> str | bytes:
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    index = rng.randrange(len(text))
    old = text[index]
    alphabet = string.digits if old.isdigit() else string.ascii_uppercase if old.isupper() else LOWER
    changed = text[:index] + rng.choice([letter for letter in alphabet if letter != old]) + text[index + 1 :]
    return changed.encode("latin-1") if isinstance(value, bytes) else changed


def _round_trips(value: object) -> bool:
    try:
        again = ast.literal_eval(repr(value))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return bool(type(again) is type(value) and again == value)


def can_rewrite(source: str) -> bool:
    """`rewrite` gives a copy of this file (it parses and has a test it can rename)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    mentions = _Mentions.of(tree)
    lines = _lines(source)
    return any(_renamable(test, mentions, lines) for test in _tests(tree))


def _lines(source: str) -> list[bytes]:
    lines = source.encode("utf-8").splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += b"\n"
    return lines


def rewrite(
    source: str,
    graded: set[Scope],
    rng: random.Random,
    canaries: list[bool],
) -> Rewritten | None:
    """The copy of one test file (see the module's docstring), or None when it does not parse or has no test this
    can rename. A test whose name the file mentions anywhere else (called, aliased, in a string) keeps its name and
    gets no mutant; `canaries` says how many constant canaries to place and which must pass."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    lines = _lines(source)
    mentions = _Mentions.of(tree)
    tests = [test for test in _tests(tree) if _renamable(test, mentions, lines)]
    if not tests:
        return None
    taken = set(mentions.names)
    names: dict[Scope, str] = {}
    twins: dict[Scope, str] = {}
    blocks: dict[int, bytes] = {}
    for test in tests:
        scope = (test.owner, test.node.name)
        names[scope] = fresh_name(rng, taken)
        copies = [_block(lines, test, names[scope], None)]
        mutant = _mutant(test, rng) if scope in graded else None
        if mutant is not None:
            literal, node, changed = mutant
            twins[scope] = fresh_name(rng, taken)
            copies = [
                _block(lines, test, names[scope], (node, repr(literal))),
                _block(lines, test, twins[scope], (node, repr(changed))),
            ]
            rng.shuffle(copies)
        blocks[test.first] = _joined(copies, method=bool(test.owner))
    placed: list[tuple[str, str, bool]] = []
    for passes in canaries:
        anchor = rng.choice(tests)
        name = fresh_name(rng, taken)
        indent = lines[anchor.node.lineno - 1][: anchor.node.col_offset]
        constant = canary(name, passes, rng, indent=indent, method=bool(anchor.owner))
        block = blocks[anchor.first]
        pieces = [block, constant] if rng.random() < 0.5 else [constant, block]
        blocks[anchor.first] = _joined(pieces, method=bool(anchor.owner))
        placed.append((anchor.owner, name, passes))
    return Rewritten(_assembled(lines, tests, blocks), names, twins, tuple(placed))


def _tests(tree: ast.Module) -> list[_Test]:
    """Test functions as pytest collects them by default: top-level `test*` and `test*` methods of `Test*` classes."""
    found: list[_Test] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            found.append(_Test("", node, _first_line(node)))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            found.extend(
                _Test(node.name, item, _first_line(item))
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test")
            )
    return found


def _first_line(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return min([node.lineno, *(item.lineno for item in node.decorator_list)])


@dataclass(frozen=True)
class _Mentions:
    """Every name a file uses (names, attributes, definitions, text of its strings), counted once per file."""

    names: Counter[str]
    text: str

    @classmethod
    def of(cls, tree: ast.Module) -> _Mentions:
        names: Counter[str] = Counter()
        strings: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names[node.id] += 1
            elif isinstance(node, ast.Attribute):
                names[node.attr] += 1
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[node.name] += 1
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.append(node.value)
        return cls(names, "\0".join(strings))


def _renamable(test: _Test, mentions: _Mentions, lines: list[bytes]) -> bool:
    """Named nowhere else in the file, defined once, not a fixture, and on lines of its own."""
    name = test.node.name
    if mentions.names[name] > 1 or name in mentions.text:
        return False
    if any("fixture" in ast.dump(item) for item in test.node.decorator_list):
        return False
    end = test.node.end_lineno or test.node.lineno
    head, tail = lines[test.first - 1], lines[end - 1]
    return (
        not head[: test.node.col_offset].strip()
        and DEF_NAME.match(lines[test.node.lineno - 1], test.node.col_offset) is not None
        and tail[test.node.end_col_offset or 0 :].strip()[:1] in (b"", b"#")
    )


def _assertions(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[object, ast.expr]]:
    """The test's own top-level `assert X == <literal>` (or `<literal> == X`) statements, as (the literal's value,
    its node): statements of the body itself run whenever the test passes, so a mutant of one fails when it does."""
    found: list[tuple[object, ast.expr]] = []
    for statement in node.body:
        if not isinstance(statement, ast.Assert) or not isinstance(statement.test, ast.Compare):
            continue
        compare = statement.test
        if len(compare.ops) != 1 or not isinstance(compare.ops[0], ast.Eq):
            continue
        sides = [(side, *_literal(side)) for side in (compare.left, compare.comparators[0])]
        known = [(side, value) for side, ok, value in sides if ok]
        if len(known) == 1:
            side, value = known[0]
            found.append((value, side))
    return found


def _literal(node: ast.expr) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def _mutant(test: _Test, rng: random.Random) -> tuple[object, ast.expr, object] | None:
    """The test's last assertion with a literal it can perturb: (the literal, its node, the perturbed value)."""
    for literal, node in reversed(_assertions(test.node)):
        if len(repr(literal)) > MAX_LITERAL_CHARS:
            continue
        changed = perturb(literal, rng)
        if changed is not None:
            return literal, node, changed
    return None


def _block(lines: list[bytes], test: _Test, name: str, literal: tuple[ast.expr, str] | None) -> bytes:
    """The test's lines (decorators to its end) with its name replaced, and one literal's source when given."""
    first, end = test.first, test.node.end_lineno or test.node.lineno
    block = list(lines[first - 1 : end])
    if literal is not None:
        node, text = literal
        start, stop = node.lineno - first, (node.end_lineno or node.lineno) - first
        head, tail = block[start][: node.col_offset], block[stop][node.end_col_offset or 0 :]
        block[start : stop + 1] = [head + text.encode("utf-8") + tail]
    row = test.node.lineno - first
    found = DEF_NAME.match(block[row], test.node.col_offset)
    if found is None:
        raise AssertionError("checked by _renamable")
    block[row] = block[row][: found.start(1)] + name.encode() + block[row][found.end(1) :]
    return b"".join(block)


def _joined(blocks: list[bytes], *, method: bool) -> bytes:
    return (b"\n" if method else b"\n\n").join(blocks)


def canary(name: str, passes: bool, rng: random.Random, *, indent: bytes, method: bool) -> bytes:
    """A test that passes or fails on constants alone, whatever the solution does."""
    values = [rng.randrange(1000) for _ in range(2 + rng.randrange(4))]
    off = 0 if passes else rng.randint(1, 9)
    shape = rng.randrange(3)
    if shape == 0:
        check = f"assert sum(values) == {sum(values) + off}"
    elif shape == 1:
        check = f"assert max(values) - min(values) == {max(values) - min(values) + off}"
    else:
        check = f"assert len(str(values)) == {len(str(values)) + off}"
    source = f"def {name}({'self' if method else ''}):\n    values = {values!r}\n    {check}\n"
    return b"".join(indent + line for line in source.encode().splitlines(keepends=True))


def _assembled(lines: list[bytes], tests: list[_Test], blocks: dict[int, bytes]) -> str:
    """The file with each test's lines replaced by its block."""
    out: list[bytes] = []
    spans = {test.first: test.node.end_lineno or test.node.lineno for test in tests}
    row = 1
    while row <= len(lines):
        if row in blocks:
            out.append(blocks[row])
            row = spans[row] + 1
        else:
            out.append(lines[row - 1])
            row += 1
    return b"".join(out).decode("utf-8")
