"""The tests' side of the by-value mode is total over whatever the code under test's process sends back: a plain
value, the code's own exception rebuilt from builtin types, or ByValueBroken (the test fails)."""

from __future__ import annotations

import builtins
import contextlib
import json
import socket
import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencode_env.inside import by_value_client, by_value_wire

REPLIES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6) | st.sampled_from("ifsyltSFd"),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["id", "value", "raised", "refused", "chain", "args", "message", "kind"]), inner
        )
    ),
    max_leaves=25,
)


def answer_with(tmp_path: Path, payload: bytes) -> object:
    """One call through a real Channel whose peer answers `payload` (a frame of it when it parses as JSON)."""
    path = str(tmp_path / "peer.sock")
    channel = by_value_client.Channel(path, connect_timeout_s=5, call_timeout_s=5)
    client = by_value_client.Client(channel)

    def peer() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(path)
            by_value_wire.read_frame(connection)
            connection.sendall(by_value_wire.HEADER.pack(len(payload)) + payload)

    thread = threading.Thread(target=peer)
    thread.start()
    try:
        return client.call("calc", "add", (1, 2), {})
    finally:
        thread.join()
        if channel.connection is not None:
            channel.connection.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(REPLIES | st.binary(max_size=40).map(lambda raw: {"raw": raw.hex()}))
def test_whatever_a_server_answers_is_a_value_its_exception_or_a_failure(tmp_path: Path, reply: object) -> None:
    if isinstance(reply, dict) and "raw" in reply and len(reply) == 1:
        payload = bytes.fromhex(str(reply["raw"]))
    else:
        payload = json.dumps({"id": 1, **reply} if isinstance(reply, dict) else reply).encode()
    try:
        answer_with(tmp_path, payload)
    except by_value_client.ByValueBroken:
        return
    except Exception as error:
        raised: Exception | None = error
    else:
        return
    assert hasattr(raised, "by_value_chain"), repr(raised)


BUILTIN_EXCEPTIONS = sorted(
    f"builtins.{name}"
    for name, kind in vars(builtins).items()
    if isinstance(kind, type) and issubclass(kind, BaseException)
)
CODE_CLASSES = ["calc.Done", "calc.Error", "x.y.Z"]
CHAIN = st.lists(st.sampled_from(BUILTIN_EXCEPTIONS) | st.sampled_from(CODE_CLASSES), max_size=6)


@settings(max_examples=500, deadline=None)
@given(chain=CHAIN, registered=CHAIN, args=st.none() | st.lists(st.integers() | st.text(max_size=4), max_size=2))
def test_nothing_the_code_raises_ends_the_tests_iteration(
    chain: list[str], registered: list[str], args: list[object] | None
) -> None:
    """Whatever chain of names the code's process sends, and whatever classes the tests asked for first: the tests'
    side makes an exception for it (even of a class whose constructor wants more than a message), and never a
    StopIteration or StopAsyncIteration, which `map`, `filter` or `zip` would take for their end (a wrong function
    raising it would make `all(map(f, xs))` True)."""
    client = by_value_client.Client(channel=None)  # type: ignore[arg-type]  # rebuilding asks the channel nothing
    with contextlib.suppress(by_value_client.ByValueBroken):
        client.exception_class(registered)
    try:
        error = client.rebuilt({"chain": chain, "message": "m", "args": args})
    except by_value_client.ByValueBroken:
        return
    if isinstance(error, by_value_client.ByValueBroken):
        return  # the test fails, whatever it iterates
    assert not isinstance(error, (StopIteration, StopAsyncIteration)), (chain, registered, type(error).__mro__)
    assert error.by_value_chain == chain  # type: ignore[attr-defined]

    def raising(_: object) -> bool:
        raise error

    with contextlib.suppress(Exception):
        assert not all(map(raising, [1, 2])), "the error ended map() and all() read it as True"
