#!/usr/bin/env python3
"""What checking for joiners costs a parameter-server job (issue #17).

LeNet-5 on Fashion-MNIST, 2 workers + 1 server on loopback (`tandem launch -n 3`), --elastic. Each strategy runs
with a check at every step (--max-ranks 4 --join-poll-steps 1, nobody joining) and without any check (no
--max-ranks), for every binary given (e.g. the one before a change and the one after), interleaved, --repeats times
each. Prints the median images/s and step time of each, and the check's cost: 1 - (images/s with checks) / (without).

    flock /tmp/tandem-bench.lock python3 bench/elastic/join_check_cost.py \
        --cli before=/path/to/old/tandem --cli after=build/default/bin/tandem --repeats 5
"""
import argparse
import json
import platform
import statistics
import subprocess
import sys


def run(cli, strategy, check, batches):
    cmd = [cli, "launch", "-n", "3"]
    if check:
        cmd += ["--max-ranks", "4"]
    cmd += ["--", cli, "train", "--strategy", strategy, "--servers", "1", "--elastic", "--model", "lenet5",
            "--epochs", "1", "--limit-batches", str(batches), "--join-poll-steps", "1", "--json"]
    if strategy == "ssp":
        cmd += ["--staleness", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
    for line in out.stdout.splitlines():
        if line.startswith("[rank 0] {"):
            r = json.loads(line[len("[rank 0] "):])
            return r["images_per_sec"], r["time_split"]["step_s"]
    sys.exit(f"no JSON line from rank 0: {' '.join(cmd)}\n{out.stdout[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", action="append", required=True, help="NAME=PATH of a tandem binary (repeatable)")
    ap.add_argument("--strategies", default="ps,ssp")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", type=int, default=200, help="steps per run (--limit-batches)")
    a = ap.parse_args()
    clis = [c.split("=", 1) for c in a.cli]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"# {platform.node()}: {cpu}; {a.batches} steps per run, {a.repeats} runs each, interleaved")
    results = {}
    for _ in range(a.repeats):
        for strategy in a.strategies.split(","):
            for name, cli in clis:
                for check in (False, True):
                    results.setdefault((strategy, name, check), []).append(run(cli, strategy, check, a.batches))
    print("| strategy | binary | images/s, no check | images/s, check every step | step ms (no check / check) | cost |")
    print("|---|---|---:|---:|---|---:|")
    for strategy in a.strategies.split(","):
        for name, _ in clis:
            off = results[(strategy, name, False)]
            on = results[(strategy, name, True)]
            ips_off = statistics.median(r[0] for r in off)
            ips_on = statistics.median(r[0] for r in on)
            ms_off = 1000 * statistics.median(r[1] for r in off)
            ms_on = 1000 * statistics.median(r[1] for r in on)
            print(f"| {strategy} | {name} | {ips_off:,.0f} | {ips_on:,.0f} | {ms_off:.2f} / {ms_on:.2f} | "
                  f"{100 * (1 - ips_on / ips_off):+.1f}% |")


if __name__ == "__main__":
    main()
