"""Red-team attacks on the grader that got through: each is a WRONG solution plus one trick, run through the real
pipeline (oracle rollouts on the local backend), asserting what the design promises (0.0, a policy status, a
finding). They fail until the hole is closed.
"""

from __future__ import annotations

import tracemalloc

from opencode_env.rollout.grading.graded_tests import MAX_JUNIT_BYTES, parse_junit
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from tests.integration.test_grader_integrity import shell_file
from tests.integration.test_test_grader_isolation import WORKDIR, WRONG_ADD, graded_task, image

__all__ = ["image"]

TELLS_CANARIES_APART = f"""\
import gc

import pytest
from _pytest.config import Config


def _imports_something(item):
    try:
        with open(item.module.__file__) as source:
            return "import" in source.read()
    except Exception:
        return False


class _PassTheGradedOnly:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.failed and _imports_something(item):
            report.outcome, report.longrepr = "passed", None


for _config in [obj for obj in gc.get_objects() if isinstance(obj, Config)]:
    if not _config.pluginmanager.has_plugin("zz"):
        _config.pluginmanager.register(_PassTheGradedOnly(), "zz")
{WRONG_ADD}"""


async def test_a_hook_that_spares_the_canaries_gets_no_reward(
    backend: LocalBackend, no_leaks: None, image: str
) -> None:
    """Canaries never import anything, graded tests import the solution: a hook registered at import flips only
    failures of test files that import something, so the canaries fail as they must, pytest exits 1, its summary
    and the report agree, and a wrong add.py scores 1.0 with status `completed`."""
    result = await run_rollout(graded_task(image, [shell_file(f"{WORKDIR}/add.py", TELLS_CANARIES_APART)]), backend)
    assert result.reward == 0.0, (result.status, result.test_outcomes, result.integrity)


async def test_a_package_marker_beside_the_handed_tests_does_not_shadow_their_helper(
    backend: LocalBackend, no_leaks: None
) -> None:
    """The README-style task (tests handed over as verify_files under tests/, verify `python3 -m pytest -q tests`
    from the work dir), graded in the grader's box. The agent adds `tests/__init__.py` (a regular file, on no list,
    carried) and a no-op `helper.py` at the top of its work dir: pytest's prepend import mode then puts the work dir,
    not tests/, on sys.path, so the handed `from helper import check` imports the agent's helper."""
    from tests.integration.test_grader_integrity import base_image, task

    wrong = [
        shell_file(f"{WORKDIR}/add.py", WRONG_ADD),
        shell_file(f"{WORKDIR}/tests/__init__.py", ""),
        shell_file(f"{WORKDIR}/helper.py", "def check(add):\n    pass\n"),
    ]
    result = await run_rollout(task(base_image(), wrong), backend)
    assert result.grade_isolation == "fresh_box"
    assert result.reward == 0.0, (result.status, result.verify_results, result.integrity)


def entity_bomb(padding: int, copies: int) -> bytes:
    """A JUnit report whose DTD expands to about 86 times its size, just under expat's amplification limit (100):
    the padding raises the direct bytes the limit is measured against."""
    entities = '<!ENTITY a "' + "A" * 1000 + '"><!ENTITY b "' + "&a;" * 10 + '"><!ENTITY c "' + "&b;" * 10 + '">'
    case = '<testcase classname="test_calc" name="test_add">' + "&c;" * copies + "</testcase>"
    return (
        f'<?xml version="1.0"?><!DOCTYPE t [{entities}]><!--{"p" * padding}-->'
        f"<testsuites><testsuite>{case}</testsuite></testsuites>"
    ).encode()


def test_a_report_with_an_entity_bomb_is_not_expanded_by_the_host() -> None:
    """Code under test writes the JUnit report at exit (the grader's box lets it: the report is the tripwires' job),
    and the host parses it with ElementTree, on the event loop, up to MAX_JUNIT_BYTES (64 MiB). Expat stops a billion
    laughs only past 100x amplification, so a 64 MiB report expands to about 5.5 GB of text in the server's process
    (a quarter-MiB one here: about 22 MB). pytest never writes a DTD: the host should refuse one."""
    raw = entity_bomb(padding=256 * 1024, copies=220)
    assert len(raw) < MAX_JUNIT_BYTES
    tracemalloc.start()
    try:
        parse_junit(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(raw), f"{len(raw)} bytes of report took {peak} bytes to parse"


MANY_DEEP_LINKS = (
    "python3 -c \"import os; d = os.path.join(*['d' * 250] * 14); os.makedirs(d); "
    "[os.symlink('x', os.path.join(d, str(i).zfill(245))) for i in range(8000)]\""
)


async def test_what_the_copy_leaves_out_is_recorded_within_a_bound(backend: LocalBackend, no_leaks: None) -> None:
    """Every entry the copy does not carry becomes an IntegrityFinding with its whole path, with no cap on their
    number: within the copy's own caps (100,000 entries, 4,096-byte paths) an agent makes the result about 400 MB,
    held in the server's memory, stored and sent to the caller. Here 8,000 links 3.8 KB deep make it about 30 MB."""
    from tests.integration.test_grader_integrity import base_image, task

    wrong = [shell_file(f"{WORKDIR}/add.py", WRONG_ADD), f"cd {WORKDIR} && {MANY_DEEP_LINKS}"]
    result = await run_rollout(task(base_image(), wrong), backend)
    assert result.grade_isolation == "fresh_box", (result.status, result.error)
    size = len(result.model_dump_json())
    assert size < 8 * 2**20, f"{len(result.integrity)} findings, a result of {size} bytes"


TEST_CLI = (
    "import subprocess, sys\n\n\ndef test_add():\n"
    "    run = subprocess.run([sys.executable, 'add.py', '2', '3'], capture_output=True, text=True)\n"
    "    assert run.stdout.strip() == '5'\n"
)
WRONG_CLI = "import sys\nprint(int(sys.argv[1]) - int(sys.argv[2]))\n"


async def test_a_test_module_of_the_agents_beside_the_handed_tests_is_not_run(
    backend: LocalBackend, no_leaks: None
) -> None:
    """A task whose tests never import the agent's code (they run add.py as a program), handed over in tests/ and
    run as `python3 -m pytest -q tests`, graded in the grader's box. The agent adds `tests/test_zz.py`, a regular
    file on no list, carried: pytest collects it with the handed tests, and its `os._exit(0)` at import ends the run
    with status 0 before any test ran, so the wrong program scores 1.0."""
    from tests.integration.test_grader_integrity import base_image, task

    wrong = [
        shell_file(f"{WORKDIR}/add.py", WRONG_CLI),
        shell_file(f"{WORKDIR}/tests/test_zz.py", "import os\nos._exit(0)\n"),
    ]
    request = task(base_image(), wrong, verify_files={"tests/test_add.py": TEST_CLI})
    result = await run_rollout(request, backend)
    assert result.grade_isolation == "fresh_box"
    assert result.reward == 0.0, (result.status, result.verify_results, result.integrity)


async def test_a_declared_repository_runs_no_filter_of_the_agents(backend: LocalBackend, no_leaks: None) -> None:
    """A task that grades the agent's repository declares `.git` in `solution_files`, so the copy carries it; its
    `.git/config` and hooks are restored from the task's and the settings that run a program are pinned. But
    `.git/commondir` is neither: it names a directory of the work dir (carried as plain files) whose `config` holds a
    `filter.x.clean`, and `.gitattributes` applies it. verify's `git status` re-reads the carried add.py (its stat
    changed in the copy) through the filter, which runs as the grader and writes reward.txt."""
    from tests.integration.test_grader_integrity import REWARD, base_image, task

    hostile = f"[filter \"x\"]\n\tclean = sh -c 'echo 1 > {REWARD} && cat'\n\tsmudge = cat\n"
    git = "git -c user.name=a -c user.email=a@a"
    wrong = [
        shell_file(f"{WORKDIR}/add.py", WRONG_ADD),
        f"cd {WORKDIR} && echo '* filter=x' > .gitattributes && {git} add add.py .gitattributes && {git} commit -qm x",
        f"cd {WORKDIR} && cp -r .git common && rm -rf common/hooks",
        shell_file(f"{WORKDIR}/common/config", "[core]\n\trepositoryformatversion = 0\n" + hostile),
        f"cd {WORKDIR} && echo ../common > .git/commondir",
    ]
    result = await run_rollout(task(base_image(), wrong, solution_files=[".git"]), backend)
    assert result.grade_isolation == "fresh_box"
    assert result.reward == 0.0, (result.status, result.reward_source, result.verify_results, result.integrity)


async def test_code_under_test_cannot_write_the_reward_file(backend: LocalBackend, no_leaks: None) -> None:
    """The README-style task graded by verify's pass rate (its verify writes no reward file). Code under test runs
    as the grader, which owns the verifier directory, so a wrong add.py that writes reward.txt when the tests import
    it scores 1.0 although pytest failed: the reward file beats the pass rate."""
    from tests.integration.test_grader_integrity import REWARD, base_image, task

    wrong = [shell_file(f"{WORKDIR}/add.py", f"open({REWARD!r}, 'w').write('1')\n{WRONG_ADD}")]
    result = await run_rollout(task(base_image(), wrong), backend)
    assert result.grade_isolation == "fresh_box"
    assert result.reward == 0.0, (result.status, result.reward_source, result.integrity)


VERIFIER_REWARD = "/home/user/logs/verifier/reward.txt"
TEST_SH = f"""#!/bin/bash
cd {WORKDIR}
python3 -m pytest -q /tests/test_cli.py
if [ $? -eq 0 ]; then echo 1 > {VERIFIER_REWARD}; else echo 0 > {VERIFIER_REWARD}; fi
"""
REWRITES_TEST_SH = """import sys
with open('/tests/test.sh', 'r+b') as script:
    text = script.read()
    script.seek(text.index(b'if ['))
    script.write(b'echo 1 > /home/user/logs/verifier/reward.txt; exit 0\\n')
    script.truncate()
print(int(sys.argv[1]) - int(sys.argv[2]))
"""


async def test_code_under_test_cannot_rewrite_the_running_test_script(backend: LocalBackend, no_leaks: None) -> None:
    """A Harbor-style task (verify `bash /tests/test.sh`, which runs pytest and then writes the reward from its
    status), graded in the grader's box. The handed files are the grader's, and the program the tests run is run as
    the grader, so it rewrites test.sh in place past the line bash is running: bash reads on from its offset, and
    the wrong program's run ends `echo 1 > reward.txt; exit 0`."""
    from tests.integration.test_grader_integrity import base_image, task

    files = {"/tests/test.sh": TEST_SH, "/tests/test_cli.py": TEST_CLI}
    wrong = [shell_file(f"{WORKDIR}/add.py", REWRITES_TEST_SH)]
    result = await run_rollout(task(base_image(), wrong, verify=["bash /tests/test.sh"], verify_files=files), backend)
    assert result.grade_isolation == "fresh_box", (result.status, result.error)
    assert result.reward == 0.0, (result.status, result.reward_source, result.verify_results)


WRITES_REWARD_JSON = """import sys
open('/home/user/logs/verifier/reward.json', 'w').write('{"reward": 1}')
print(int(sys.argv[1]) - int(sys.argv[2]))
"""


async def test_a_reward_json_of_the_code_under_test_does_not_beat_the_scripts_reward_txt(
    backend: LocalBackend, no_leaks: None
) -> None:
    """The same Harbor-style test.sh, which always writes reward.txt after pytest (0 here: the program is wrong).
    The program the tests run, as the grader, writes reward.json beside it, and the host reads reward.json first."""
    from tests.integration.test_grader_integrity import base_image, task

    files = {"/tests/test.sh": TEST_SH, "/tests/test_cli.py": TEST_CLI}
    wrong = [shell_file(f"{WORKDIR}/add.py", WRITES_REWARD_JSON)]
    result = await run_rollout(task(base_image(), wrong, verify=["bash /tests/test.sh"], verify_files=files), backend)
    assert result.grade_isolation == "fresh_box", (result.status, result.error)
    assert result.reward == 0.0, (result.status, result.reward_source, result.verify_results)
