"""The code under test's side of the by-value mode, started as
`python3 -I by_value_server.py --socket PATH --workdir DIR --wait SECONDS` under the agent's identity.

It connects to the socket the tests' process listens on, then serves one request at a time: import a module of the
work dir, describe one of its attributes, or call one (the arguments rebuilt from plain data, the result sent back
as plain data or refused, an exception as its type's names, its arguments when they are plain, and its text). It
trusts nothing it is sent beyond the encoding, and the tests' process trusts nothing it sends back (it runs the
agent's code, which can write anything on the socket). It exits when the tests' process closes the connection.
Runs in the sandbox's Python (3.8 or newer): the standard library and by_value_wire only.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
import traceback
import types
from typing import Any

from opencode_env.inside import by_value_wire as wire

MAX_TEXT = 8192
MAX_NAMES = 10_000


def connect(path: str, wait_s: float) -> socket.socket:
    """The tests' process's socket, once it listens (it starts at about the same time)."""
    deadline = time.monotonic() + wait_s
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
            return connection
        except OSError:
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def resolve(module: str, name: str) -> object:
    """`name` (dotted: `Calc.add`) of the imported module `module`."""
    target: object = sys.modules[module] if module in sys.modules else importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def exception_chain(kind: type) -> list[str]:
    """The exception type's method resolution order, each as `module.qualname`."""
    return [f"{getattr(base, '__module__', '?')}.{getattr(base, '__qualname__', '?')}" for base in kind.__mro__]


def describe(value: object) -> dict[str, object]:
    if isinstance(value, types.ModuleType):
        return {"kind": "module", "module": value.__name__}
    if isinstance(value, type) and issubclass(value, BaseException):
        return {"kind": "exception", "chain": exception_chain(value)}
    try:
        return {"kind": "value", "value": wire.encode(value)}
    except wire.Refused:
        return {"kind": "callable" if callable(value) else "object"}


def public_names(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
        names = [name for name in dir(module) if not name.startswith("_")]
    return [str(name)[:200] for name in list(names)[:MAX_NAMES]]


def raised(error: BaseException) -> dict[str, object]:
    try:
        arguments: object = wire.encode(tuple(error.args), "the exception's args")
    except wire.Refused:
        arguments = None
    try:
        message = str(error)
    except Exception as failure:  # the code's own __str__ can raise; its text is then the failure's
        message = f"<str() raised {type(failure).__name__}>"
    return {
        "chain": exception_chain(type(error)),
        "args": arguments,
        "message": message[:MAX_TEXT],
        "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__))[-MAX_TEXT:],
    }


def handle(request: dict[str, Any]) -> dict[str, object]:
    op, module = request.get("op"), str(request.get("module", ""))
    try:
        if op == "import":
            imported = importlib.import_module(module)
            return {"package": hasattr(imported, "__path__"), "names": public_names(imported)}
        if op == "describe":
            return describe(resolve(module, str(request.get("name", ""))))
        if op == "call":
            function: Any = resolve(module, str(request.get("name", "")))
            args = wire.decode(request.get("args"))
            kwargs = wire.decode(request.get("kwargs"))
            result = function(*args, **kwargs)
            try:
                return {"value": wire.encode(result, "the result")}
            except wire.Refused as refused:
                return {"refused": str(refused)[:MAX_TEXT]}
        return {"refused": f"unknown operation {str(op)[:40]!r}"}
    except BaseException as error:  # the code under test's exception is the reply, whatever it is
        return {"raised": raised(error)}


def serve(connection: socket.socket) -> None:
    while True:
        try:
            request = wire.read_frame(connection)
        except wire.WireError:
            return
        reply = handle(request)
        reply["id"] = request.get("id")
        try:
            frame = wire.dumps(reply)
        except wire.Refused as refused:
            frame = wire.dumps({"id": request.get("id"), "refused": str(refused)})
        connection.sendall(frame)


def main(argv: list[str]) -> int:
    named = {argv[index]: argv[index + 1] for index in range(0, len(argv) - 1, 2)}
    connection = connect(named["--socket"], float(named["--wait"]))
    sys.path.append(named["--workdir"])
    serve(connection)
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # threads the code under test started do not keep this process alive
