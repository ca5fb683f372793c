"""A verify that failed to reach the network is told apart from the agent's failure, whatever else its output
holds: the lines curl, pip, uv and apt print when a name lookup or a connection fails, found among generated
output; ordinary test failures never are."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from opencode_env.rollout.grading.offline import network_failure, record_network_failure
from opencode_env.wire import CommandResult, RolloutResult

FAILURES = [
    "curl: (6) Could not resolve host: astral.sh",
    "curl: (56) CONNECT tunnel failed, response 403",
    "curl: (22) The requested URL returned error: 403",
    "curl: (7) Failed to connect to example.com port 443 after 3 ms: Couldn't connect to server",
    "WARNING: Retrying after connection broken by 'ProxyError('Cannot connect to proxy.')': /simple/pytest/",
    "ERROR: Could not find a version that satisfies the requirement pytest==8.4.1 (from versions: none)",
    "  Failed to establish a new connection: [Errno -3] Temporary failure in name resolution",
    "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease",
    "Err:1 http://deb.debian.org/debian bookworm InRelease Temporary failure resolving 'deb.debian.org'",
    "error: Failed to download `pytest==8.4.1`",
    "  Caused by: dns error: failed to lookup address information",
]
ORDINARY = st.text(alphabet=st.characters(codec="ascii", exclude_characters="\x00"), max_size=300).filter(
    lambda text: network_failure([CommandResult(cmd="t", exit_code=1, stdout=text)]) is None
)


def _verify(stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult(cmd="bash /tests/test.sh", exit_code=1, stdout=stdout, stderr=stderr)


@given(before=ORDINARY, after=ORDINARY, line=st.sampled_from(FAILURES), on_stderr=st.booleans())
def test_a_network_failure_line_is_found_among_any_output(before: str, after: str, line: str, on_stderr: bool) -> None:
    text = f"{before}\n{line}\n{after}"
    result = _verify(stderr=text) if on_stderr else _verify(stdout=text)
    found = network_failure([result])
    assert found is not None
    assert found in line


def test_ordinary_test_failures_are_the_agents() -> None:
    output = "FAILED tests/test_outputs.py::test_add - assert 1 == 5\n1 failed in 0.02s\nConnectionError expected\n"
    assert network_failure([_verify(stdout=output)]) is None


def test_the_result_says_so_unless_verify_reached_full_marks() -> None:
    failed = RolloutResult(reward=0.0, verify_results=[_verify(stderr=FAILURES[0])])
    record_network_failure(failed, "model_only")
    assert failed.verify_network_failure == FAILURES[0]
    assert "grades the sandbox's network (model_only), not the agent's work" in failed.warnings[0]
    passed = RolloutResult(reward=1.0, verify_results=[_verify(stdout="blocked as expected: " + FAILURES[0])])
    record_network_failure(passed, "model_only")
    assert (passed.verify_network_failure, passed.warnings) == (None, [])
