"""`python -m opencode_env.proxy.ping URL`: wait until the proxy answers, print its JSON (standard library only)."""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--method", default="GET")
    parser.add_argument("--wait", type=float, default=10.0, help="keep trying this long")
    parser.add_argument("--token-env", default="", help="env var holding the proxy's bearer token")
    args = parser.parse_args()
    deadline = time.monotonic() + args.wait
    while True:
        try:
            request = urllib.request.Request(args.url, method=args.method)
            if args.token_env:
                request.add_header("Authorization", f"Bearer {os.environ.get(args.token_env, '')}")
            with urllib.request.urlopen(request, timeout=max(deadline - time.monotonic(), 1.0)) as response:
                print(response.read().decode())
                return 0
        except (urllib.error.URLError, ConnectionError) as error:
            if time.monotonic() >= deadline:
                print(f"no answer from {args.url}: {error}", file=sys.stderr)
                return 1
            time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
