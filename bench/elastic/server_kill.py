#!/usr/bin/env python3
"""A parameter server lost and its shard taken over from a replica (issue #17), on loopback tcp.

1. Recovery: `tandem launch -n 4 --min-ranks 3 --transport tcp -- tandem train --strategy STRATEGY --servers 2
   --server-replicas 1` (LeNet-5; workers: world ranks 0 and 1, servers: 2 and 3); world rank 3 (server 1) is
   SIGKILLed at a random moment of epoch 2 (0-300 ms after rank 0 reported epoch 1), TRIALS times. Per trial:
   kill -> go on, from the SIGKILL (as this script sends it) to rank 0's log line "elastic: world rank(s) 3 lost
   (...); 3 ranks go on ... after T ms", printed right before the first step of the re-formed job (the step in flight
   redone or counted); T is the survivors' own share (from their first failed operation). "continued": the launcher
   exits 0 and the last epoch reports a world of 3.
2. Cost of replication: the same job without a kill, with --server-replicas 0 and 1, alternately REPEATS times each;
   the step time is the epochs' time_split.step_s (rank 0's reports, epochs 2.. so that start-up is left out).

Standard library only.

  python3 bench/elastic/server_kill.py --cli build/default/bin/tandem --trials 10 --repeats 3
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tests", "integration")]
from grow_curve import launch  # noqa: E402
from test_elastic_cli import rank_pid  # noqa: E402

GO_ON = re.compile(r"\[rank 0\] .*elastic: world rank\(s\) 3 lost .*; 3 ranks go on .* after (\d+) ms")
FIRST_EPOCH = re.compile(r'\[rank 0\] \{.*"epoch":1,')


def train(a, replicas):
    return ["train", "--json", "--model", "lenet5", "--dataset", "synthetic", "--strategy", a.strategy,
            "--servers", "2", "--server-replicas", str(replicas), "--batch", str(a.batch), "--epochs", str(a.epochs),
            "--limit-batches", str(a.batches), "--eval-limit-batches", "2", "--threads", "1", "--seed", "3",
            "--lr", "0.01"] + (["--elastic"] if a.strategy == "ps" else [])


def command(a, replicas):
    return [a.cli, "launch", "-n", "4", "--min-ranks", "3", "--transport", "tcp", "--", a.cli] + train(a, replicas)


def kill_trial(a, rng):
    delay = rng.uniform(0.0, 0.3)
    state = {"kill_at": None, "go_on_ms": None, "own_ms": None}

    def on_line(line, t, p):
        if state["kill_at"] is None and FIRST_EPOCH.match(line.strip()):
            time.sleep(delay)
            os.kill(rank_pid(p.pid, 3), signal.SIGKILL)
            state["kill_at"] = time.monotonic()
        m = GO_ON.search(line)
        if m and state["kill_at"] is not None and state["go_on_ms"] is None:
            state["go_on_ms"] = 1000 * (t - state["kill_at"])
            state["own_ms"] = int(m.group(1))

    rec = {"delay_ms": round(1000 * delay)}
    try:
        ep, _ = launch(command(a, 1), on_line, timeout=300)  # rank 0's epoch reports
        rec["continued"] = bool(ep) and ep[max(ep)]["world"] == 3
    except SystemExit as e:
        rec["continued"] = False
        rec["error"] = str(e)[-300:]
    rec["kill_to_go_on_ms"] = state["go_on_ms"]
    rec["survivors_ms"] = state["own_ms"]
    return rec


def step_times(a, replicas):
    ep, _ = launch(command(a, replicas), timeout=600)
    return [ep[e]["time_split"]["step_s"] for e in sorted(ep) if e >= 2 and "time_split" in ep[e]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default="tandem")
    ap.add_argument("--strategy", default="ps", choices=["ps", "ps-async", "ssp"])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    trials = [kill_trial(a, rng) for _ in range(a.trials)]
    ok = [t for t in trials if t["continued"] and t["kill_to_go_on_ms"] is not None]
    print("%s, server 1 SIGKILLed: %d of %d continued" % (a.strategy, len(ok), len(trials)))
    if ok:
        k = [t["kill_to_go_on_ms"] for t in ok]
        s = [t["survivors_ms"] for t in ok]
        print("  kill -> go on: median %.1f ms (min %.1f, max %.1f); the survivors' own share: median %.0f ms" %
              (statistics.median(k), min(k), max(k), statistics.median(s)))
    cost = {0: [], 1: []}
    for _ in range(a.repeats):
        for r in (0, 1):
            cost[r] += step_times(a, r)
    for r in (0, 1):
        if cost[r]:
            m = statistics.median(cost[r])
            print("  --server-replicas %d: step %.2f ms (median of %d epochs), %.1f steps/s" %
                  (r, 1000 * m, len(cost[r]), 1 / m))
    if cost[0] and cost[1]:
        print("  replication costs %+.1f%% per step" % (100 * (statistics.median(cost[1]) / statistics.median(cost[0]) - 1)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"strategy": a.strategy, "trials": trials, "step_s": {str(k): v for k, v in cost.items()}}, f,
                      indent=1)


if __name__ == "__main__":
    main()
