#!/usr/bin/env python3
"""The best any policy can do for the 8-GPU requests `tessera sim scenario` submits at 0 h.

The scenario starts empty and every tenant submits its training requests at once (4 each, and
one more for each placed at once). This takes the number of 8-GPU requests among them (the
`training_submitted` of a run that stops after its first minute, below) and schedules only those
on the training pool's 16 nodes, shortest first: on identical machines with every job there at
0, shortest first gives the least total wait, and so the least mean wait, of any order.
Durations are drawn as the scenario draws them (uniform, 2-12 h). Prints, over many draws, that
least mean wait (a lower bound for any policy, which also runs the other sizes and the gangs
submitted with them), and how many start after the warm-up in that schedule, with their mean
wait.

Usage: scripts/scenario-burst-bound.py [COUNT ...]   (default: 63 60 68, seeds 1-3)
       COUNT for seed S: cargo run -q --release -p tessera-sched --example scenario -- 40 0.001 S \
                         | python3 -c 'import json,sys; print(json.load(sys.stdin)["training_submitted"]["8"])'
"""

import heapq
import random
import statistics
import sys

NODES = 16
WARMUP_H = 6.0
DRAWS = 4000


def shortest_first(durations):
    """Each job's wait when run shortest first on NODES nodes that are all free at 0."""
    free = [0.0] * NODES
    waits = []
    for d in sorted(durations):
        t = heapq.heappop(free)
        waits.append(t)
        heapq.heappush(free, t + d)
    return waits


def main():
    counts = [int(a) for a in sys.argv[1:]] or [63, 60, 68]
    rng = random.Random(1)
    for n in counts:
        means, late, late_waits = [], [], []
        for _ in range(DRAWS):
            waits = shortest_first([rng.uniform(2.0, 12.0) for _ in range(n)])
            means.append(statistics.mean(waits))
            after = [w for w in waits if w >= WARMUP_H]
            late.append(len(after))
            late_waits.append(statistics.mean(after) if after else 0.0)
        print(
            f"{n} 8-GPU requests at 0 h ({n * 7} node-hours expected): shortest first, "
            f"mean wait {statistics.mean(means):.2f} h; "
            f"{statistics.mean(late):.1f} start after the {WARMUP_H:.0f} h warm-up, "
            f"having waited {statistics.mean(late_waits):.1f} h on average"
        )


if __name__ == "__main__":
    main()
