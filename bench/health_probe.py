"""GET /health every 20 ms until stdin closes, then print {"latencies": [seconds, ...], "timeouts": n}; a probe with
no answer within 30 s counts in both (its latency is the 30 s waited).

A process of its own, so that the load generator's own work (a thousand clients in one interpreter) does not show
up as server latency.

    python -m bench.health_probe URL
"""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx

INTERVAL_S = 0.02
TIMEOUT_S = 30.0


def main() -> None:
    url = sys.argv[1].rstrip("/") + "/health"
    stop = threading.Event()

    def stop_at_end_of_input() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=stop_at_end_of_input, daemon=True).start()
    latencies: list[float] = []
    timeouts = 0
    with httpx.Client(timeout=TIMEOUT_S) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                client.get(url).raise_for_status()
            except httpx.TimeoutException:
                timeouts += 1
            latencies.append(time.perf_counter() - started)
            stop.wait(INTERVAL_S)
    print(json.dumps({"latencies": latencies, "timeouts": timeouts}))


if __name__ == "__main__":
    main()
