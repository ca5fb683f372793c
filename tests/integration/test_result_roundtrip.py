"""Whatever a sandbox leaves behind, and whatever numbers a model sends, the result serialises and parses back.

Trees are made by real commands in a real local sandbox, then collected as the pipeline collects them; each result
goes through every way it leaves us: `model_dump_json`, `model_dump(mode="json")` with the standard library, the
MCP tool result (checked against the published output schema, as MCP clients check it), the WebSocket frame, and a
JavaScript `JSON.parse`.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import validators  # type: ignore[import-untyped]
from pydantic import BaseModel

from opencode_env.rollout.collect import collect_files, read_tail
from opencode_env.sandbox.local.backend import LocalSandbox
from opencode_env.sandbox.local.files import hostfs
from opencode_env.server.result_store import ResultStore
from opencode_env.server.tool_result import mcp_tool_result, session_tool_result
from opencode_env.wire import CommandResult, PhaseTimings, RolloutResult, RolloutTurn
from opencode_env.wire.answer import ANSWER_LIST_MAX, RolloutAnswer
from opencode_env.wire.grading import IntegrityFinding

WORKDIR = "/home/user/workdir"
INF = float("inf")
NAN = float("nan")


async def python_in(sandbox: LocalSandbox, source: str) -> None:
    result = await sandbox.run(f"python3 -c {shlex.quote(source)}", timeout_s=60, cwd=WORKDIR)
    assert result.exit_code == 0, result.stderr


def refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")


def standard_json(text: str) -> Any:
    """Parsed as a standard parser (JavaScript's JSON.parse) would: NaN and Infinity literals are refused."""
    return json.loads(text, parse_constant=refuse_constant)


def round_trip(result: RolloutResult) -> RolloutResult:
    """The result through every serialisation we send, each checked to be standard JSON; returns the parsed copy."""
    text = result.model_dump_json()
    standard_json(text)
    parsed = RolloutResult.model_validate_json(text)
    via_dict = RolloutResult.model_validate(standard_json(json.dumps(result.model_dump(mode="json"), allow_nan=False)))
    assert via_dict.model_dump_json() == text

    with tempfile.TemporaryDirectory(prefix="roundtrip-") as directory:
        store = ResultStore(Path(directory))
        tool = mcp_tool_result(result, store, "json")
        schema = RolloutAnswer.model_json_schema(mode="serialization")
        validators.validator_for(schema)(schema).validate(tool.structured_content)
        structured = json.dumps(tool.structured_content["result"], allow_nan=False)
        assert RolloutResult.model_validate(standard_json(structured)).model_dump_json() == text
        assert RolloutResult.model_validate_json(tool.content[0].text).model_dump_json() == text  # type: ignore[union-attr]
        summary = mcp_tool_result(result, store).content[0].text  # type: ignore[union-attr]
        assert f"status:     {result.status}" in summary

        frame = standard_json(json.dumps({"result": session_tool_result(tool)}, allow_nan=False))
        by_reference = gzip.decompress(store.gzip_of(frame["result"]["data"]["result_ref"]["id"]) or b"")
        assert RolloutResult.model_validate(standard_json(by_reference.decode())).model_dump_json() == text
    assert parsed.model_dump_json() == text
    return parsed


def result_with(collected: Any) -> RolloutResult:
    return RolloutResult(files=collected.text, files_extra=collected.extra, files_non_utf8=collected.non_utf8)


ODD_TREE = r"""
import os
open(b"bin\xe9.txt", "wb").write(b"latin-1 name\n")
open(b"blob\xfe.bin", "wb").write(b"\x00\x01")
os.mkdir(b"dir\xff")
open(b"dir\xff/inner.txt", "w").write("inside\n")
open("caf\u00e9.txt", "w").write("utf-8 name\n")
open("line\nbreak.txt", "w").write("newline in the name\n")
open("n" * 255, "w").write("longest name\n")
open("latin1-content.txt", "wb").write(b"caf\xe9\n")
open("escaped.txt", "w").write("bin\\xe9.txt\n")
os.mkdir("deep")
os.chdir("deep")
for _ in range(20):
    os.mkdir("d" * 250)
    os.chdir("d" * 250)
open("far.txt", "w").write("far away\n")
"""


async def test_names_that_are_not_utf8_are_listed_losslessly_and_the_result_round_trips(box: LocalSandbox) -> None:
    await python_in(box, ODD_TREE)
    collected = await collect_files(box)
    parsed = round_trip(result_with(collected))

    raw_names = {base64.b64decode(odd.path_base64) for odd in parsed.files_non_utf8}
    assert raw_names == {b"bin\xe9.txt", b"blob\xfe.bin", b"dir\xff/inner.txt"}
    displayed = {odd.display for odd in parsed.files_non_utf8}
    assert displayed == {"bin\\xe9.txt", "blob\\xfe.bin", "dir\\xff/inner.txt"}
    deep = "deep/" + "/".join(["d" * 250] * 20) + "/far.txt"
    assert len(deep.encode()) > 4000
    assert parsed.files == {
        "caf\u00e9.txt": "utf-8 name\n",
        "line\nbreak.txt": "newline in the name\n",
        "n" * 255: "longest name\n",
        "escaped.txt": "bin\\xe9.txt\n",
        deep: "far away\n",
    }
    assert parsed.files_extra == ["latin1-content.txt"]


async def test_unreadable_directories_and_special_files_are_collected_without_failing(box: LocalSandbox) -> None:
    await python_in(
        box,
        "import os, socket\n"
        "os.mkdir('locked'); open('locked/secret.txt', 'w').write('kept\\n'); os.chmod('locked', 0)\n"
        "os.mkfifo('pipe')\n"
        "socket.socket(socket.AF_UNIX).bind('sock')\n"
        "os.symlink('/etc/passwd', 'passwd-link')\n"
        "os.symlink('/etc', 'etc-link')\n"
        "open('plain.txt', 'w').write('plain\\n')\n",
    )
    collected = await collect_files(box)
    parsed = round_trip(result_with(collected))
    assert parsed.files == {"locked/secret.txt": "kept\n", "plain.txt": "plain\n"}
    assert (parsed.files_extra, parsed.files_non_utf8) == ([], [])
    assert await read_tail(box, f"{WORKDIR}/sock") == ""
    assert await read_tail(box, f"{WORKDIR}/pipe") == ""
    assert await read_tail(box, f"{WORKDIR}/passwd-link") == ""


@pytest.mark.parametrize("replacement", ["ln -s /etc workdir", "touch workdir", "mkfifo workdir"])
async def test_a_work_dir_replaced_by_something_else_collects_nothing(box: LocalSandbox, replacement: str) -> None:
    result = await box.run(f"cd /home/user && rm -rf workdir && {replacement}", timeout_s=30, cwd="/home/user")
    assert result.exit_code == 0, result.stderr
    collected = await collect_files(box)
    assert round_trip(result_with(collected)).files == {}
    assert (collected.text, collected.extra, collected.non_utf8) == ({}, [], [])


async def test_a_huge_directory_is_read_only_up_to_the_per_directory_cap(
    box: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    await python_in(box, "import os\nos.mkdir('many')\nfor i in range(3000): open(f'many/{i:05}', 'w').close()")
    monkeypatch.setattr(hostfs, "MAX_DIR_ENTRIES", 500)
    listed = await box.list_files(f"{WORKDIR}/many", limit=10_000)
    assert len(listed) == 500
    assert [entry.path for entry in listed] == sorted(entry.path for entry in listed)


def non_finite_result() -> RolloutResult:
    turn = RolloutTurn(
        turn=0,
        completion_tokens=["a", "b", "c", "d", "e"],
        completion_token_ids=[1, 2, 3, 4, 5],
        per_token_logps=[-INF, NAN, INF, -9999.0, -0.5],
        top_logprobs=[[("a", -INF, 1), ("z", NAN, None)], [("b", INF, 2)], [], [("d", -9999.0, 4)], []],
        latency_s=INF,
        ttft_s=NAN,
        timestamp=-INF,
    )
    return RolloutResult(
        reward=NAN,
        wall_s=INF,
        proxy_turns=[turn],
        verify_results=[CommandResult(cmd="true", exit_code=0, duration_s=-INF)],
        timings=PhaseTimings(agent_s=NAN, verify_s=INF),
    )


def is_nan(value: float | None) -> bool:
    return value is not None and math.isnan(value)


def test_non_finite_floats_round_trip_as_standard_json() -> None:
    parsed = round_trip(non_finite_result())
    [turn] = parsed.proxy_turns
    logps = turn.per_token_logps
    assert (logps[0], is_nan(logps[1]), logps[2], logps[3], logps[4]) == (-INF, True, INF, -9999.0, -0.5)
    assert turn.top_logprobs[0][0] == ("a", -INF, 1)
    assert is_nan(turn.top_logprobs[0][1][1])
    assert turn.top_logprobs[1] == [("b", INF, 2)]
    assert (turn.latency_s, turn.timestamp) == (INF, -INF)
    assert is_nan(turn.ttft_s)
    assert is_nan(parsed.reward)
    assert (parsed.wall_s, parsed.verify_results[0].duration_s, parsed.timings.verify_s) == (INF, -INF, INF)
    assert is_nan(parsed.timings.agent_s)


def test_non_finite_floats_are_named_strings_on_the_wire() -> None:
    wire = standard_json(non_finite_result().model_dump_json())
    assert wire["proxy_turns"][0]["per_token_logps"] == ["-Infinity", "NaN", "Infinity", -9999.0, -0.5]
    assert wire["proxy_turns"][0]["top_logprobs"][0] == [["a", "-Infinity", 1], ["z", "NaN", None]]
    assert (wire["reward"], wire["wall_s"]) == ("NaN", "Infinity")


class PlainFloats(BaseModel):
    values: list[float]


def test_finite_floats_are_written_as_before() -> None:
    values = [-0.0, -1e300, 1e-7, 0.1, -123.456789012345, 1.2345678901234568e17]
    result = RolloutResult(proxy_turns=[RolloutTurn(turn=0, per_token_logps=values)])
    plain = PlainFloats(values=values).model_dump_json().removeprefix('{"values":').removesuffix("}")
    assert f'"per_token_logps":{plain},' in result.model_dump_json()
    assert RolloutResult.model_validate_json(result.model_dump_json()).proxy_turns[0].per_token_logps == values


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_javascript_reads_the_result_and_sees_named_non_finite_numbers() -> None:
    script = (
        "let t='';process.stdin.on('data',d=>t+=d).on('end',()=>{const r=JSON.parse(t);"
        "const l=r.proxy_turns[0].per_token_logps;console.log(JSON.stringify([l,l.map((x)=>String(Number(x)))]))})"
    )
    text = non_finite_result().model_dump_json()
    out = subprocess.run(["node", "-e", script], input=text, capture_output=True, text=True, check=True).stdout
    as_sent, as_numbers = json.loads(out)
    assert as_sent == ["-Infinity", "NaN", "Infinity", -9999.0, -0.5]
    assert as_numbers == ["-Infinity", "NaN", "Infinity", "-9999", "-0.5"]


def test_the_answer_carries_the_first_integrity_findings_and_counts_them_all(tmp_path: Path) -> None:
    """An agent that plants a file per name cannot push the MCP answer past a client's limit: the answer lists the
    first findings and counts them all; the whole list is in the result by reference."""
    planted = [
        IntegrityFinding(path=f"pkg{n}/conftest.py", kind="conftest", act="created", response="removed")
        for n in range(20_000)
    ]
    result = RolloutResult(task_id="planted", integrity=planted)
    store = ResultStore(tmp_path)
    tool = mcp_tool_result(result, store)
    answer = RolloutAnswer.model_validate(tool.structured_content)
    assert answer.integrity_total == 20_000
    assert [finding.path for finding in answer.integrity] == [finding.path for finding in planted[:ANSWER_LIST_MAX]]
    assert len(orjson.dumps(tool.structured_content)) < 256 * 1024


def test_a_store_that_cannot_keep_the_result_answers_it_inline(tmp_path: Path) -> None:
    """A finished rollout is never lost to the server's disk: when the store cannot write (here its directory became
    a file), every transport's answer carries the whole result inline, however large, and says it was not kept."""
    store = ResultStore(tmp_path / "by-reference")
    (tmp_path / "by-reference").rmdir()
    (tmp_path / "by-reference").write_text("not a directory any more")
    turns = [
        RolloutTurn(turn=n, completion_token_ids=list(range(4000)), completion_logprobs=[-0.5] * 4000)
        for n in range(20)
    ]
    result = RolloutResult(task_id="large", reward=1.0, proxy_turns=turns)
    tool = mcp_tool_result(result, store)
    answer = RolloutAnswer.model_validate(tool.structured_content)
    assert answer.result_ref is None
    assert answer.result is not None
    assert answer.result.model_dump_json() == result.model_dump_json()
    assert "the full RolloutResult was not kept" in tool.content[0].text  # type: ignore[union-attr]
    frame = session_tool_result(tool)
    assert RolloutResult.model_validate(frame["data"]["result"]).model_dump_json() == result.model_dump_json()
