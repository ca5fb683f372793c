"""Which way the test grader runs a task's tests when the task says `mode = "auto"` (the default): by value when
the tests' own text has the shape by value serves, else in process. Pure: a function of the task's test files
alone, decided before anything runs, so nothing the agent does can move a task from one mode to the other.

By value serves tests that import modules of the work dir and call their functions with plain values, compare
plain results, read constants and expect the code's exceptions (docs/grading.md). The shape check is conservative:
any construct it cannot vouch for (a class of the code instantiated, a callback or an object passed to the code,
a patch or mock, files, programs or captured output, a dunder of the code's names, a star import, a file that does
not parse) keeps the task in process, the reason naming the file, the line and the construct. What the text cannot
show (a function that returns a generator) `check-task` finds by running the oracle both ways.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from typing import Literal

from opencode_env.inside import by_value_client
from opencode_env.wire.grading import GradedTests

ResolvedMode = Literal["in_process", "by_value"]

TEST_TOOLS = frozenset({"pytest", "_pytest", "hypothesis"})
"""Imported by tests, never the code under test (the image provides them)."""
STDLIB = frozenset(sys.stdlib_module_names)
OBJECT_FIXTURES = frozenset(
    {"tmp_path", "tmpdir", "tmp_path_factory", "tmpdir_factory", "monkeypatch", "mocker", "capsys", "capfd",
     "capsysbinary", "capfdbinary", "caplog", "request", "recwarn", "pytestconfig", "testdir", "pytester"}
)  # fmt: skip
"""pytest fixtures that are objects (paths, patchers, captures): by value the code's process sees none of them."""
UNSERVED_MODULES = frozenset(
    {"subprocess", "runpy", "pathlib", "shutil", "tempfile", "glob", "unittest.mock", "mock", "io", "importlib",
     "multiprocessing", "inspect", "ctypes", "pickle"}
)  # fmt: skip
"""Modules whose use means the tests reach the code other than by calling it with values: they read or write files
(the work dir is sealed to the tests by value), run programs, patch, reload or introspect the code."""
UNSERVED_BUILTINS = frozenset({"open", "exec", "eval", "compile", "__import__", "setattr", "delattr", "vars"})
NOT_EXCEPTIONS = frozenset({"SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException"})
ENDS_ITERATION = frozenset(kind.__name__ for kind in by_value_client.ENDS_ITERATION)
"""By value, what the code raises of these is a RuntimeError on the tests' side (it would end the tests' own
iteration otherwise): tests that name one expect it, and stay in process."""
HOLDS_TYPE = frozenset({"isinstance", "issubclass", "type"})
PLAIN_BUILTINS = frozenset(
    {"int", "float", "str", "bytes", "bool", "list", "tuple", "dict", "set", "frozenset", "sorted", "len", "abs",
     "min", "max", "sum", "round", "ord", "chr", "repr", "divmod", "pow", "hex", "oct", "bin", "format"}
)  # fmt: skip
"""Builtins whose result from plain arguments is plain data the wire carries."""
MAX_AUTO_CHARS = 1_000_000
"""Python text auto reads at most (a few seconds of parsing on a loaded machine); past it, in process."""
MODULE_ASKS = frozenset({"getattr", "hasattr"})
OS_VALUES = frozenset({"environ", "getenv", "sep", "linesep", "pathsep", "name"})
"""What of `os` tests may use by value; the rest touches files or processes."""
UNSERVED_ATTRIBUTES = frozenset({("sys", "modules"), ("sys", "stdout"), ("sys", "stderr"), ("sys", "stdin")})


@dataclass(frozen=True)
class ModeChoice:
    mode: ResolvedMode
    reason: str
    declared: bool
    """The task named the mode itself (no shape was read)."""


class Unserved(Exception):
    """A construct by value does not serve, as `file:line: what`."""


def choose_mode(tests: GradedTests) -> ModeChoice:
    """The mode the test grader runs `tests` in: the declared one, or for `auto` the one the tests' shape allows."""
    if tests.mode != "auto":
        return ModeChoice(tests.mode, f"declared tests.mode = {tests.mode!r}", declared=True)
    size = sum(len(text) for path, text in tests.files.items() if path.endswith(".py"))
    if size > MAX_AUTO_CHARS:
        return ModeChoice(
            "in_process",
            f"auto: the test files hold {size} characters, more than auto reads ({MAX_AUTO_CHARS}); declare tests.mode",
            declared=False,
        )
    try:
        used = _code_modules(tests.files)
    except Unserved as unserved:
        return ModeChoice("in_process", f"auto: {unserved}", declared=False)
    if not used:
        return ModeChoice(
            "in_process", "auto: the tests import no module of the work dir (nothing to take out)", declared=False
        )
    return ModeChoice(
        "by_value", f"auto: the tests reach {', '.join(sorted(used))} only through plain values", declared=False
    )


def provided_modules(paths: list[str]) -> frozenset[str]:
    """Top-level names the tests' own directory provides (`helper` for `helper.py`, `fixtures` for `fixtures/x`)."""
    names = set()
    for path in paths:
        first = path.split("/", 1)[0]
        names.add(first[:-3] if first.endswith(".py") else first)
    return frozenset(names)


def _code_modules(files: dict[str, str]) -> set[str]:
    """The work dir's modules the tests use, each use checked (raises Unserved)."""
    provided = provided_modules(list(files))
    used: set[str] = set()
    for path in sorted(files):
        if path.endswith(".py"):
            used |= _FileShape(path, files[path], provided).check()
    return used


def _is_code(module: str, provided: frozenset[str]) -> bool:
    top = module.split(".", 1)[0]
    return bool(top) and top not in STDLIB and top not in TEST_TOOLS and top not in provided


def _dotted(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ['a', 'b', 'c'] (None for anything else)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _unserved_attribute(node: ast.Attribute) -> bool:
    if not isinstance(node.value, ast.Name):
        return False
    owner = node.value.id
    return (owner, node.attr) in UNSERVED_ATTRIBUTES or (owner == "os" and node.attr not in OS_VALUES)


def _class_like(name: str) -> bool:
    """CapWords (a class, by Python's naming), not an ALL_CAPS constant."""
    return name[:1].isupper() and not name.isupper()


class _FileShape:
    def __init__(self, path: str, source: str, provided: frozenset[str]) -> None:
        self.path, self.source, self.provided = path, source, provided
        self.code_names: dict[str, bool] = {}
        """Names bound to the code's modules or their attributes: True for a module itself."""
        self.local_objects: set[str] = set()
        """Names the tests bind to objects: their functions and classes, modules and non-constant imports."""
        self.parents: dict[int, ast.AST] = {}

    def fail(self, node: ast.AST | None, what: str) -> Unserved:
        line = getattr(node, "lineno", 0)
        return Unserved(f"{self.path}:{line}: {what}; by value serves tests that call the code with plain values")

    def check(self) -> set[str]:
        try:
            tree = ast.parse(self.source, filename=self.path)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
            raise self.fail(None, f"does not parse ({type(error).__name__})") from None
        try:
            return self._checked(tree)
        except RecursionError:
            raise self.fail(None, "is nested too deeply to read") from None

    def _checked(self, tree: ast.Module) -> set[str]:
        nodes = list(ast.walk(tree))
        for node in nodes:
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
        used = self._imports(nodes)
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                self._fixtures(node)
                if not isinstance(node, ast.Lambda):
                    self.local_objects.add(node.name)
            if isinstance(node, ast.Name) and node.id in UNSERVED_BUILTINS and node.id not in self.code_names:
                raise self.fail(node, f"uses {node.id}()")
            if isinstance(node, ast.Name) and node.id in NOT_EXCEPTIONS:
                raise self.fail(node, f"names {node.id} (by value only Exception's subclasses cross)")
            if isinstance(node, ast.Name) and node.id in ENDS_ITERATION:
                raise self.fail(node, f"names {node.id} (by value it crosses as a RuntimeError)")
            if isinstance(node, ast.Attribute) and _unserved_attribute(node):
                raise self.fail(node, f"uses {ast.unparse(node)[:60]}")
        for node in nodes:
            if isinstance(node, ast.Name) and node.id in self.code_names:
                self._use(node)
        return used

    def _imports(self, nodes: list[ast.AST]) -> set[str]:
        used: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._unserved_module(node, alias.name)
                    bound = alias.asname or alias.name.split(".", 1)[0]
                    if _is_code(alias.name, self.provided):
                        used.add(alias.name.split(".", 1)[0])
                        self.code_names[bound] = True
                    else:
                        self.local_objects.add(bound)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                self._unserved_module(node, node.module)
                for alias in node.names:
                    self._unserved_module(node, f"{node.module}.{alias.name}")
                if not _is_code(node.module, self.provided):
                    bound_names = (alias.asname or alias.name for alias in node.names)
                    self.local_objects.update(name for name in bound_names if not name.isupper())
                    continue
                used.add(node.module.split(".", 1)[0])
                for alias in node.names:
                    if alias.name == "*":
                        raise self.fail(node, f"star-imports {node.module}")
                    self.code_names[alias.asname or alias.name] = False
        return used

    def _unserved_module(self, node: ast.AST, module: str) -> None:
        if module in UNSERVED_MODULES or module.split(".", 1)[0] in UNSERVED_MODULES:
            raise self.fail(node, f"imports {module}")
        if module in ("os.system", "os.popen") or module.startswith("os.path"):
            raise self.fail(node, f"imports {module}")

    def _fixtures(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda) -> None:
        if isinstance(node, ast.ClassDef):
            return
        arguments = node.args
        for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if argument.arg in OBJECT_FIXTURES:
                raise self.fail(node, f"takes the {argument.arg} fixture")

    def _use(self, name: ast.Name) -> None:
        """One reference to a code name, checked by what encloses it."""
        outer: ast.expr = name
        while isinstance(parent := self.parents.get(id(outer)), ast.Attribute) and parent.value is outer:
            outer = parent
        chain = _dotted(outer) or [name.id]
        shown = ".".join(chain)
        if any(part.startswith("__") and part.endswith("__") for part in chain[1:]):
            raise self.fail(name, f"reads {shown} (a stand-in has no dunder attributes)")
        if isinstance(outer, (ast.Attribute, ast.Name)) and not isinstance(outer.ctx, ast.Load):
            raise self.fail(name, f"assigns or deletes {shown}")
        parent = self.parents.get(id(outer))
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            raise self.fail(name, f"decorates with or subclasses {shown} (the code's objects stay in its process)")
        if isinstance(parent, ast.Call) and parent.func is outer:
            self._call(parent, chain)
            return
        if isinstance(parent, (ast.Call, ast.keyword)):
            self._passed(parent if isinstance(parent, ast.Call) else self.parents.get(id(parent)), outer, chain)

    def _call(self, call: ast.Call, chain: list[str]) -> None:
        shown = ".".join(chain)
        if _class_like(chain[-1]) and not isinstance(self.parents.get(id(call)), ast.Raise):
            raise self.fail(call, f"instantiates {shown} (the tests would hold the code's objects)")
        if isinstance(self.parents.get(id(call)), (ast.withitem, ast.Await)):
            raise self.fail(call, f"uses what {shown}() returns as a context manager or awaitable")
        for argument in [*call.args, *(keyword.value for keyword in call.keywords)]:
            if not self._plain(argument):
                raise self.fail(argument, f"passes {ast.unparse(argument)[:60]} to {shown} (not a plain value)")

    def _passed(self, call: ast.AST | None, outer: ast.expr, chain: list[str]) -> None:
        """A code name handed to a call as an argument."""
        shown = ".".join(chain)
        if not isinstance(call, ast.Call):
            return
        callee = _dotted(call.func) or []
        last = callee[-1] if callee else ""
        if callee and callee[0] in self.code_names and not (_class_like(chain[-1]) or chain[-1].isupper()):
            raise self.fail(call, f"passes {shown} to the code (a function cannot cross)")
        if last in HOLDS_TYPE:
            raise self.fail(call, f"{last}() of {shown} (the code's classes stay in its process)")
        module_itself = len(chain) == 1 and self.code_names.get(chain[0], False)
        if module_itself and last not in MODULE_ASKS:
            raise self.fail(call, f"passes the module {shown} to {'.'.join(callee) or 'a call'}")

    def _plain(self, node: ast.expr) -> bool:
        """An expression whose value is plain data, as far as its text shows."""
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.JoinedStr):
            return True
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return all(self._plain(item) for item in node.elts)
        if isinstance(node, ast.Dict):
            return all(self._plain(item) for item in [*node.values, *(key for key in node.keys if key is not None)])
        if isinstance(node, ast.Starred):
            return self._plain(node.value)
        if isinstance(node, ast.UnaryOp):
            return self._plain(node.operand)
        if isinstance(node, ast.BinOp):
            return self._plain(node.left) and self._plain(node.right)
        if isinstance(node, ast.BoolOp):
            return all(self._plain(value) for value in node.values)
        if isinstance(node, ast.Compare):
            return True
        if isinstance(node, ast.IfExp):
            return self._plain(node.body) and self._plain(node.orelse)
        if isinstance(node, ast.Subscript):
            return self._plain(node.value)
        if isinstance(node, (ast.ListComp, ast.SetComp)):
            return self._plain(node.elt)
        if isinstance(node, ast.DictComp):
            return self._plain(node.key) and self._plain(node.value)
        if isinstance(node, ast.Name):
            return self._plain_name(node.id)
        if isinstance(node, ast.Attribute):
            chain = _dotted(node)
            return chain is not None and chain[0] in self.code_names and chain[-1].isupper()
        if isinstance(node, ast.Call):
            return self._plain_call(node)
        return False

    def _plain_name(self, name: str) -> bool:
        if name in self.code_names:
            return not self.code_names[name] and name.isupper()
        return name not in self.local_objects and name not in OBJECT_FIXTURES

    def _plain_call(self, call: ast.Call) -> bool:
        arguments = [*call.args, *(keyword.value for keyword in call.keywords)]
        if not all(self._plain(argument) for argument in arguments):
            return False
        callee = _dotted(call.func)
        if callee is not None and callee[0] in self.code_names:
            return not _class_like(callee[-1])
        if callee is not None and len(callee) == 1:
            return callee[0] in PLAIN_BUILTINS
        if isinstance(call.func, ast.Attribute):
            return self._plain(call.func.value)
        return False
