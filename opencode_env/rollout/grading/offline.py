"""Offline truths (pure): a verify that failed because it could not reach the network (most public Harbor test.sh
install uv from the internet, then `uvx ... pytest`) graded the sandbox's network, not the agent's work. The
result says so (`verify_network_failure`, a warning) and check-task calls such a run inconclusive, never the task
solved or unsolved."""

from __future__ import annotations

import re

from opencode_env.wire import CommandResult, Network, RolloutResult

_NETWORK_FAILURE = re.compile(
    r"(?:curl: \((?:5|6|7|28|35|56)\)|curl: \(22\) The requested URL returned error: 403|Could not resolve host|"
    r"Temporary failure in name resolution|"
    r"Temporary failure resolving|Name or service not known|Network is unreachable|Failed to establish a new "
    r"connection|NewConnectionError|ProxyError|CONNECT tunnel failed|Tunnel connection failed|getaddrinfo failed|"
    r"dns error|Could not connect to|Failed to fetch|Failed to download|\(from versions: none\))[^\n]*"
)
MAX_SCAN_CHARS = 200_000


def network_failure(results: list[CommandResult]) -> str | None:
    """The first line of verify's output that says a connection or a name lookup failed, when a verify command
    failed or wrote such a line (a test.sh whose installer failed may still exit 0 after writing reward 0)."""
    for result in results:
        for text in (result.stderr, result.stdout):
            found = _NETWORK_FAILURE.search(text[-MAX_SCAN_CHARS:])
            if found is not None:
                return found.group(0).strip()[:300]
    return None


def record_network_failure(result: RolloutResult, network: Network) -> None:
    """The result says when its verify failed to reach the network, in its own field and a warning (a verify that
    reached full marks is not suspected: a test may expect a blocked connection)."""
    offline = network_failure(result.verify_results)
    if offline is None or result.reward == 1.0:
        return
    result.verify_network_failure = offline
    result.warn(
        "verify_offline",
        f"verify failed to reach the network ({offline}): its reward {result.reward} grades the sandbox's network "
        f"({network}), not the agent's work",
        fix="give the task what its tests download (in its image, or in setup)",
    )
