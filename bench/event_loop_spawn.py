"""What the event loop under a rollout costs it: oracle rollouts on the local backend in a process on uvloop against
one on the standard library's loop, each process as large as a server or a Ray runner, side by side in one run.

    uv run python -m bench.event_loop_spawn [--pairs 20] [--rss-mib 200] [--spawns 200]

uvloop starts a subprocess with a fork of the whole process (libuv), so each spawn copies the page tables of
everything the process holds; the standard loop spawns through `_posixsubprocess` with vfork, which copies nothing.
A rollout starts dozens of subprocesses (the sandbox, its commands, the grader's box), so the difference grows with
the process: the server idles at about 200 MiB, a Ray runner's worker at about as much. Both run rollouts on the
standard loop (server/app.py's UVICORN_OPTIONS, cluster/node.py's RUNNER_ENV); the capture proxy, which starts no
subprocess, keeps uvloop.

Two workers (bench.rollout_measure's RolloutWorker), each holding --rss-mib of touched memory, run --pairs oracle
rollouts each, interleaved one by one after a warm-up. Printed per rollout: CPU seconds (the worker and its waited-for
children: the sandboxes) and wall seconds, mean and 95% bootstrap interval, and the ratio; then --spawns bare spawns
of /bin/true in each worker.
"""

from __future__ import annotations

import argparse
import statistics

from bench.rollout_measure import LOOPS, RolloutWorker, check, load_line, oracle
from bench.stats import mean_ci


def bench(args: argparse.Namespace) -> None:
    print(f"at start: {load_line()}")
    workers = {loop: RolloutWorker(loop, args.rss_mib) for loop in LOOPS}
    figures: dict[str, dict[str, list[float]]] = {loop: {"cpu": [], "wall": []} for loop in LOOPS}
    try:
        for index in range(args.pairs + 1):
            for loop, each in workers.items():
                result, wall, cpu = each.rollout(oracle(f"{loop}-{index}"))
                check(result)
                if index:  # the first warms the worker's caches
                    figures[loop]["cpu"].append(cpu)
                    figures[loop]["wall"].append(wall)
        spawns = {loop: each.spawns(args.spawns) for loop, each in workers.items()}
    finally:
        for each in workers.values():
            each.close()
    print(f"\nper oracle rollout, {args.pairs} interleaved pairs, each worker holding {args.rss_mib} MiB")
    for loop in LOOPS:
        print(f"{loop:8} CPU s  {mean_ci(figures[loop]['cpu'])}")
        print(f"{loop:8} wall s {mean_ci(figures[loop]['wall'])}")
    for measure in ("cpu", "wall"):
        ratio = statistics.fmean(figures["uvloop"][measure]) / statistics.fmean(figures["asyncio"][measure])
        print(f"uvloop / asyncio, {measure}: {ratio:.3f}")
    print(f"\n{args.spawns} spawns of /bin/true, per spawn")
    for loop, (wall_s, cpu_s) in spawns.items():
        print(f"{loop:8} CPU {cpu_s / args.spawns * 1000:6.2f} ms  wall {wall_s / args.spawns * 1000:6.2f} ms")
    print(f"at end: {load_line()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20, help="interleaved rollouts on each loop (default 20)")
    parser.add_argument("--rss-mib", type=int, default=200, help="memory each worker holds (default 200)")
    parser.add_argument("--spawns", type=int, default=200, help="bare spawns on each loop (default 200)")
    bench(parser.parse_args())


if __name__ == "__main__":
    main()
