"""Only OpenCode's own uid may call the model through its proxy, whatever token the caller holds: the proxy asks the
kernel's socket table who owns the calling socket. Real proxy, real scripted model, real callers of two uids."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from opencode_env.proxy.peers import socket_owner
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, say
from opencode_env.testing.proxy_process import running_proxy

TOKEN = "proxy-token-for-the-peer-test"
OPENCODE_UID = 2_100_000_321
TOOLS_UID = 2_100_000_322
CALL = """
import json, sys, urllib.request, urllib.error
body = json.dumps({"model": sys.argv[3], "stream": False, "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(sys.argv[1] + "/chat/completions", data=body,
    headers={"authorization": "Bearer " + sys.argv[2], "content-type": "application/json"})
try:
    print(urllib.request.urlopen(request, timeout=20).status)
except urllib.error.HTTPError as error:
    print(error.code)
"""

TABLE = (
    b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    b"   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0\n"
    b"   1: 0200007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 2001002 0 4 1 0\n"
    b"   2: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 2001001 0 2 1 0\n"
    b"   3: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0\n"
    b"   4: 0100007F:AAAA 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 2001001 0 5 1 0\n"
    b"   5: 0100007F:AAAA 0100007F:1F90 06 00000000:00000000 00:00000000 00000000 2001002 0 6 1 0\n"
)
LOOPBACK = "127.0.0.1"


def test_the_socket_table_names_the_callers_uid_by_the_whole_connection() -> None:
    """Row 1 is a tool that bound 127.0.0.2 with OpenCode's client port (0xD431): by ports alone it is OpenCode's
    connection; by both ends it is its own, and OpenCode's stays OpenCode's. Two owners of one connection (rows 4
    and 5) is ambiguity: nobody."""
    proxy = (LOOPBACK, 8080)
    assert socket_owner(TABLE, (LOOPBACK, 0xD431), proxy) == 2001001
    assert socket_owner(TABLE, ("127.0.0.2", 0xD431), proxy) == 2001002
    assert socket_owner(TABLE, ("::ffff:127.0.0.1", 0xD431), proxy) == 2001001
    assert socket_owner(TABLE, proxy, (LOOPBACK, 0xD431)) == 0
    assert socket_owner(TABLE, (LOOPBACK, 0xD432), proxy) is None
    assert socket_owner(TABLE, (LOOPBACK, 0xD431), ("127.0.0.2", 8080)) is None
    assert socket_owner(TABLE, (LOOPBACK, 0xAAAA), proxy) is None
    assert socket_owner(b"", (LOOPBACK, 1), proxy) is None


@contextmanager
def proxy_admitting(uid: int, upstream: str, directory: Path) -> Iterator[str]:
    """The real proxy reading this process's socket table (the test's own network namespace), admitting `uid`."""
    table = os.open("/proc/self/net/tcp", os.O_RDONLY)
    try:
        peers = ("--token-env", "TOKEN", "--peer-table-fd", str(table), "--peer-uid", str(uid))
        with running_proxy(upstream, directory, *peers, env={"TOKEN": TOKEN}, pass_fds=(table,)) as proxy:
            yield proxy.url
    finally:
        os.close(table)


def call_as(uid: int, url: str, token: str, model: str = "scripted-policy") -> str:
    """Call the proxy as `uid` for `model` (the name the scripted model serves: another name is answered 404)."""
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    done = subprocess.run(
        [*drop, "/usr/bin/python3", "-c", CALL, url, token, model], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root, as CI has")
def test_a_caller_with_the_token_but_not_opencodes_uid_is_refused(tmp_path: Path) -> None:
    with ScriptedModelServer(Script(steps=[say("one"), say("two")])) as model:
        with proxy_admitting(OPENCODE_UID, model.base_url, tmp_path) as url:
            assert call_as(TOOLS_UID, url, TOKEN) == "403"
            request = urllib.request.Request(f"{url}/chat/completions", data=b"{}", headers={"authorization": TOKEN})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=20)
            refused.value.close()
            assert refused.value.code in (401, 403)
            assert call_as(OPENCODE_UID, url, TOKEN) == "200"
            assert call_as(OPENCODE_UID, url, "a-wrong-token") == "401"
        assert [json.dumps(exchange.request["messages"]) for exchange in model.exchanges] == [
            json.dumps([{"role": "user", "content": "hi"}])
        ]
        assert "its socket is not OpenCode's" in (tmp_path / "proxy.log").read_text()
