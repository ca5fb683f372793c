"""GET /health every 20 ms until stdin closes, then print the latencies (seconds) as one JSON list.

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


def main() -> None:
    url = sys.argv[1].rstrip("/") + "/health"
    stop = threading.Event()

    def stop_at_end_of_input() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=stop_at_end_of_input, daemon=True).start()
    latencies: list[float] = []
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            started = time.perf_counter()
            response = client.get(url)
            latencies.append(time.perf_counter() - started)
            response.raise_for_status()
            stop.wait(INTERVAL_S)
    print(json.dumps(latencies))


if __name__ == "__main__":
    main()
