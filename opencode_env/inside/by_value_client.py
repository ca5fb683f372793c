"""The tests' side of the by-value mode: stand-in modules whose attributes forward to the code under test's
process, installed by the pytest runner before pytest runs (the work dir is not on the tests' sys.path). Whatever
is not the code's own answer raises ByValueBroken, a BaseException no `except Exception` takes for an answer.
Runs in the sandbox's Python (3.8 or newer): the standard library and by_value_wire only."""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import socket
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from opencode_env.inside import by_value_wire as wire

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}", re.ASCII)
MAX_NOTE = 8192
ENDS_ITERATION = (StopIteration, StopAsyncIteration)
ENDS_ITERATION_NAMES = {f"builtins.{kind.__name__}" for kind in ENDS_ITERATION}
BROKEN_SUFFIX = ".broken"
"""Beside the socket, made by this process (the grader's) when it starts listening: `intact`, overwritten in place
with `broken: WHY` when the channel first breaks (in place, so a disk the agent filled cannot refuse it). The host
reads it and grades a broken channel 0 with a `by_value_broken` finding. The code under test's identity cannot
write there."""
MARKER_SIZE = 512


class ByValueBroken(BaseException):
    """The code under test's process gave no answer of its own: the test fails (see the module's docstring)."""


class Channel:
    """One connection to the code under test's process, accepted on a socket this process listens on."""

    def __init__(self, path: str, connect_timeout_s: float, call_timeout_s: float) -> None:
        if os.path.lexists(path):
            os.unlink(path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, 0o666)
        self.listener.listen(1)
        self.path = path
        self.marker = os.open(path + BROKEN_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        os.write(self.marker, b"intact".ljust(MARKER_SIZE))
        self.connect_timeout_s, self.call_timeout_s = connect_timeout_s, call_timeout_s
        self.connection: socket.socket | None = None
        self.broken = ""
        self.sent = 0
        self.lock = threading.Lock()

    def request(self, message: dict[str, object]) -> dict[str, Any]:
        with self.lock:
            if self.broken:
                raise ByValueBroken(f"the code under test's process is gone: {self.broken}")
            try:
                frame = wire.dumps({**message, "id": self.sent + 1})
            except wire.Refused as refused:
                raise ByValueBroken(str(refused)) from None
            try:
                connection = self.connected()
                self.sent += 1
                connection.sendall(frame)
                reply = wire.read_frame(connection)
            except socket.timeout:  # noqa: UP041 (an OSError of its own before Python 3.10)
                self.fail(f"no answer within {self.call_timeout_s:g}s")
            except (OSError, wire.WireError) as error:
                self.fail(str(error)[:300])
            if reply.get("id") != self.sent:
                self.fail("a reply to another request")
            return reply

    def connected(self) -> socket.socket:
        if self.connection is not None:
            return self.connection
        self.listener.settimeout(self.connect_timeout_s)
        try:
            connection, _ = self.listener.accept()
        except socket.timeout:  # noqa: UP041 (an OSError of its own before Python 3.10)
            self.fail(f"the code under test's process did not connect within {self.connect_timeout_s:g}s")
        finally:
            self.listener.close()
            os.unlink(self.path)
        connection.settimeout(self.call_timeout_s)
        self.connection = connection
        return connection

    def fail(self, why: str) -> NoReturn:
        self.broken = why
        if self.connection is not None:
            self.connection.close()
        said = f"broken: {why}".replace("\n", " ").encode("utf-8", "replace")[: MARKER_SIZE - 1]
        try:
            os.pwrite(self.marker, said.ljust(MARKER_SIZE), 0)
        finally:
            raise ByValueBroken(f"the code under test's process gave no answer: {why}")


class Client:
    """The stand-ins' view of the other process: requests, and the local classes standing for its exceptions."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.classes: dict[str, type[BaseException]] = {}

    def answer(self, message: dict[str, object]) -> dict[str, Any]:
        reply = self.channel.request(message)
        if "raised" in reply:
            raise self.rebuilt(reply["raised"])
        if "refused" in reply:
            raise ByValueBroken(f"the code under test's answer cannot cross: {str(reply['refused'])[:500]}")
        return reply

    def load(self, module: StandIn) -> None:
        reply = self.answer({"op": "import", "module": module.__name__})
        if reply.get("package") is True:
            module.__path__ = []
        names = reply.get("names")
        if isinstance(names, list) and all(type(name) is str for name in names):
            module.__all__ = [name for name in names if IDENTIFIER.fullmatch(name)]

    def attribute(self, module: str, name: str) -> object:
        reply = self.answer({"op": "describe", "module": module, "name": name})
        kind = reply.get("kind")
        if kind == "value":
            return self.value(reply.get("value"))
        if kind == "exception":
            return self.exception_class(reply.get("chain"))
        if kind == "module" and reply.get("module") == f"{module}.{name}":
            return importlib.import_module(f"{module}.{name}")
        if kind in ("callable", "object", "module"):
            return Forwarder(self, module, name)
        raise ByValueBroken(f"{module}.{name}: an answer of no known kind")

    def call(self, module: str, name: str, args: Sequence[object], kwargs: dict[str, object]) -> object:
        try:
            message = {
                "op": "call",
                "module": module,
                "name": name,
                "args": wire.encode(tuple(args), f"{module}.{name}: argument"),
                "kwargs": wire.encode(dict(kwargs), f"{module}.{name}: keyword argument"),
            }
        except wire.Refused as refused:
            raise ByValueBroken(str(refused)) from None
        return self.value(self.answer(message).get("value"))

    def value(self, tree: object) -> object:
        try:
            return wire.decode(tree)
        except wire.WireError as error:
            raise ByValueBroken(f"the code under test's answer is not plain data: {error}") from None

    def exception_class(self, chain: object) -> type[BaseException]:
        names = _chain(chain)
        base = _builtin_base(names)
        if base is None:
            raise ByValueBroken(f"{names[:1]}: an exception class with no builtin Exception among its bases")
        made: type[BaseException] = base
        for name in reversed([name for name in names if not name.startswith("builtins.")]):
            if name not in self.classes:
                module, _, qualname = name.rpartition(".")
                body = {"__module__": module, "__qualname__": qualname, "__str__": _remote_str}
                self.classes[name] = type(qualname.rpartition(".")[2] or "Error", (made,), body)
            made = self.classes[name]
        return made

    def rebuilt(self, raised: object) -> BaseException:
        """The local exception for what the code raised (raised, not returned, by the caller)."""
        if not isinstance(raised, dict):
            return ByValueBroken("the code under test's exception is not described")
        names = _chain(raised.get("chain"))
        message = str(raised.get("message", ""))[:MAX_NOTE]
        kind = next((self.classes[name] for name in names if name in self.classes), None) or _builtin_base(names)
        if kind is None:
            return ByValueBroken(f"the code under test raised {names[:1]}: {message}")
        if kind not in self.classes.values() and ENDS_ITERATION_NAMES & set(names):
            message = f"the code under test raised {names[0]}, which cannot end the tests' iteration: {message}"
            raised = {**raised, "args": None}
        args = self.value(raised["args"]) if raised.get("args") is not None else (message,)
        error = _built(kind, args if isinstance(args, tuple) else (message,), message)
        if kind in self.classes.values():
            error._by_value_text = message  # type: ignore[attr-defined]
        error.by_value_chain = names  # type: ignore[attr-defined]
        note = str(raised.get("traceback", ""))[-MAX_NOTE:]
        if note and hasattr(error, "add_note"):
            error.add_note(f"raised in the code under test's process:\n{note}")
        return error


def _built(kind: type[BaseException], args: tuple[object, ...], message: str) -> BaseException:
    """`kind` made from the code's arguments, else from its message alone, else without its own constructor (a
    UnicodeDecodeError wants five arguments, an ExceptionGroup a list); a plain Exception when none of them can be
    made: the tests see an exception for every one the code raised."""
    ways: tuple[Callable[[], BaseException], ...] = (
        lambda: kind(*args),
        lambda: kind(message),
        lambda: _plain(kind, message),
    )
    for way in ways:
        try:
            return way()
        except Exception:  # the next way of making it is tried
            continue
    return Exception(message)


def _plain(kind: type[BaseException], message: str) -> BaseException:
    error = kind.__new__(kind)
    BaseException.__init__(error, message)
    return error


def _remote_str(error: BaseException) -> str:
    text = getattr(error, "_by_value_text", None)
    return text if isinstance(text, str) else BaseException.__str__(error)


def _chain(chain: object) -> list[str]:
    if not isinstance(chain, list) or not chain or not all(type(name) is str for name in chain):
        raise ByValueBroken("an exception's bases are a list of names")
    names: list[str] = [name[:300] for name in chain[:64]]
    return names


def _builtin_base(names: list[str]) -> type[BaseException] | None:
    """The first builtin Exception subclass among `names` (KeyboardInterrupt, SystemExit and the like are not
    answers a test could expect by value). One that ends an iteration (StopIteration, StopAsyncIteration) is a
    RuntimeError here, as Python makes it inside a generator: raised by the code under test, it would otherwise
    end the tests' own `map`, `filter` or `zip` early and turn `all(...)` into True."""
    for name in names:
        module, _, short = name.rpartition(".")
        if module != "builtins" or not IDENTIFIER.fullmatch(short):
            continue
        kind = getattr(builtins, short, None)
        if isinstance(kind, type) and issubclass(kind, Exception):
            return RuntimeError if issubclass(kind, ENDS_ITERATION) else kind
    return None


class StandIn(types.ModuleType):
    """A module of the work dir as the tests see it: each attribute asked of the code under test's process."""

    __all__: list[str]

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        found = _client().attribute(self.__name__, name)
        if isinstance(found, (Forwarder, type, types.ModuleType)):
            setattr(self, name, found)
        return found


class Forwarder:
    """A function (or any object that is not plain data) of the code under test: called by value."""

    __slots__ = ("_client", "_module", "_name")

    def __init__(self, client: Client, module: str, name: str) -> None:
        self._client, self._module, self._name = client, module, name

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._client.call(self._module, self._name, args, kwargs)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._client.attribute(self._module, f"{self._name}.{name}")

    def __repr__(self) -> str:
        return f"<{self._module}.{self._name}, by value>"


class Finder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: a top-level module nothing trusted provides (the tests' own directory, the image's
    paths, builtins) is a stand-in, and so is every submodule of one. The work dir is sealed to this process while
    the tests run, so this is the only way to its code; the server says whether the module exists there."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        parent = fullname.rpartition(".")[0]
        if parent and not isinstance(sys.modules.get(parent), StandIn):
            return None
        return importlib.machinery.ModuleSpec(fullname, Loader(), origin="by value")


class Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return StandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        assert isinstance(module, StandIn)
        _client().load(module)


_installed: list[Client] = []


def _client() -> Client:
    return _installed[0]


class _FindsNothing:
    """The path-entry finder of a directory inside the work dir: no import machinery loads a file from there."""

    def find_spec(self, fullname: str, target: types.ModuleType | None = None) -> None:
        return None

    def invalidate_caches(self) -> None:
        return None


def _work_dir_hook(workdir: str) -> Any:
    sealed = os.path.realpath(workdir).rstrip("/")

    def hook(path: str) -> _FindsNothing:
        resolved = os.path.realpath(path or os.getcwd())
        if resolved == sealed or resolved.startswith(sealed + "/"):
            return _FindsNothing()
        raise ImportError("not in the work dir")

    return hook


def install(socket_path: str, workdir: str, *, call_timeout_s: float, connect_timeout_s: float) -> None:
    """Listen for the code under test's process and make every module nothing trusted provides a stand-in (call
    once, before any test is imported). A directory in the work dir that a test puts on sys.path finds nothing (the
    work dir is also sealed to a grader that is not root; a root grader could read it)."""
    _installed.append(Client(Channel(socket_path, connect_timeout_s, call_timeout_s)))
    sys.path_hooks.insert(0, _work_dir_hook(workdir))
    sys.path_importer_cache.clear()
    sys.meta_path.append(Finder())
