"""Run a command beside busy processes, to find verdicts that depend on the machine's speed.

    python -m bench.beside_load --hogs 6 -- ./dev test

Starts `--hogs` processes that spin on the CPU (each its own process, at the command's priority), runs the command,
then ends the hogs it started. Every `--every` seconds it reads the one-minute load average; at the end it prints the
command's exit code, its wall time and the load it ran under (min, median, max). A busy developer's machine or CI
host is what this imitates: the same suite at load ~10 on two cores is where a test that sleeps instead of waiting on
its event fails.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import subprocess
import sys
import threading
import time


def _spin() -> None:
    while True:
        pass


def _load_average() -> float:
    with open("/proc/loadavg") as loadavg:
        return float(loadavg.read().split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hogs", type=int, default=6, help="busy processes to run beside the command")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between load samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("command: give the command to run after --")
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(args.every):
            samples.append(_load_average())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        returncode = subprocess.call(command)
    finally:
        done.set()
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.join()
    wall = time.monotonic() - started
    load = (
        f"min {min(samples):.1f}, median {statistics.median(samples):.1f}, max {max(samples):.1f}"
        if samples
        else "not sampled"
    )
    print(f"beside {args.hogs} hogs: exit {returncode} in {wall:.0f} s; load average {load}", file=sys.stderr)
    return returncode


if __name__ == "__main__":
    sys.exit(main())
