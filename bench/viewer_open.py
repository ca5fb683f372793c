"""How long the viewer page takes to open in headless Chromium, lazy turn rendering vs eager, side by side.

    uv run python -m bench.viewer_open [--turns 10 100 1000] [--tokens 300]

Each synthetic turn has `--tokens` completion tokens with top-5 alternatives and a 2 KB user message. "Open" is the
page's load event (parse the embedded JSON, build the page); eager is the same page with IntersectionObserver
removed, so every turn body is built at once, as a page without lazy rendering would.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from selenium.webdriver.remote.webdriver import WebDriver

from opencode_env.testing.chromium import chromium
from opencode_env.viewer import render_page
from opencode_env.wire import RolloutResult, RolloutTurn

NO_OBSERVER = "delete window.IntersectionObserver;"
OPEN_MS = "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime;"


def synthetic(turns: int, tokens: int) -> RolloutResult:
    def turn(index: int) -> RolloutTurn:
        return RolloutTurn(
            turn=index,
            completion_tokens=[f" w{k}" for k in range(tokens)],
            completion_token_ids=list(range(tokens)),
            per_token_logps=[-0.01 * (k % 300) for k in range(tokens)],
            top_logprobs=[[(f" a{j}", -0.5 * j, j) for j in range(5)] for _ in range(tokens)],
            request={"messages": [{"role": "user", "content": "tool output " * 170}]},
        )

    return RolloutResult(task_id=f"bench-{turns}", proxy_turns=[turn(i) for i in range(turns)])


def open_page(browser: WebDriver, url: str) -> tuple[float, int, int]:
    browser.get(url)
    opened: float = browser.execute_script(OPEN_MS)
    built: int = browser.execute_script("return document.querySelectorAll('.turn[data-rendered]').length")
    nodes: int = browser.execute_script("return document.getElementsByTagName('*').length")
    return opened, built, nodes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--tokens", type=int, default=300)
    args = parser.parse_args()
    print(
        f"{'turns':>6} {'page MB':>8} {'python ms':>10} {'lazy ms':>9} {'built':>6} {'nodes':>8} "
        f"{'eager ms':>9} {'built':>6} {'nodes':>8} {'eager/lazy':>10}"
    )
    with tempfile.TemporaryDirectory() as directory, chromium() as lazy, chromium() as eager:
        eager.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": NO_OBSERVER})
        for turns in args.turns:
            result = synthetic(turns, args.tokens)
            started = time.perf_counter()
            page = render_page(result)
            python_ms = 1000 * (time.perf_counter() - started)
            path = Path(directory) / f"turns-{turns}.html"
            path.write_text(page)
            lazy_ms, lazy_built, lazy_nodes = open_page(lazy, path.as_uri())
            eager_ms, eager_built, eager_nodes = open_page(eager, path.as_uri())
            print(
                f"{turns:>6} {len(page) / 1e6:>8.1f} {python_ms:>10.0f} {lazy_ms:>9.0f} {lazy_built:>6} "
                f"{lazy_nodes:>8} {eager_ms:>9.0f} {eager_built:>6} {eager_nodes:>8} {eager_ms / lazy_ms:>10.1f}"
            )


if __name__ == "__main__":
    main()
