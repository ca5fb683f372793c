"""`python -m opencode_env.scripted --script FILE`: serve a scripted model on loopback in a process of its own."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path

from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m opencode_env.scripted", description=__doc__)
    parser.add_argument("--script", type=Path, required=True, help="a Script as JSON")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, required=True, help="the bound port is written here")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ScriptedModelServer(Script.model_validate_json(args.script.read_text()), port=args.port) as server:
        temporary = args.port_file.with_suffix(".tmp")
        temporary.write_text(str(server.port))
        os.replace(temporary, args.port_file)
        stop.wait()


if __name__ == "__main__":
    main()
