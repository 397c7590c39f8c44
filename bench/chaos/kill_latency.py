#!/usr/bin/env python3
"""Time from a SIGKILL mid-all-reduce to every survivor's error, over many runs (issue #17).

Runs `tandem launch -n RANKS --transport T -- fault_rank kill` (tests/integration/fault_rank.c: the last rank kills
itself inside a 16 MiB all-reduce; the others ignore the launcher's SIGTERM, so what they report is the library's own
detection) RUNS times and prints per run each survivor's report and teardown time, then the distribution. On ucx it
also counts the runs where a survivor's shared-memory receive queue was left blocked by the dead rank (a "deaf"
worker: the transport logs "... can receive nothing more") -- see transports/ucx/ucx_transport.cpp, check_hearing.
Hold the bench lock: flock /tmp/tandem-bench.lock python3 bench/chaos/kill_latency.py --build build/default"""
import argparse
import os
import re
import subprocess


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build/default", help="build folder (bin/tandem, tests/integration/fault_rank)")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--transport", default="ucx")
    ap.add_argument("--keep", help="folder for the output of slow or deaf runs")
    a = ap.parse_args()
    env = dict(os.environ, TANDEM_TIMEOUT_MS="4000")
    cmd = [os.path.join(a.build, "bin/tandem"), "launch", "-n", str(a.ranks), "--transport", a.transport,
           "--grace-ms", "14000", "--", os.path.join(a.build, "tests/integration/fault_rank"), "kill"]
    reports, teardowns, deaf_runs, missing = [], [], 0, 0
    for i in range(a.runs):
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=120).stdout
        rep = {int(r): int(ms) for r, ms in re.findall(r"EXPECTED rank (\d+): allreduce with a dead rank -> .+? "
                                                       r"after (\d+) ms", out)}
        des = {int(r): int(ms) for r, ms in re.findall(r"DESTROYED rank (\d+) after (\d+) ms", out)}
        deaf = sorted({int(r) for r in re.findall(r"error\] ucx: rank (\d+): .* can receive nothing more", out)})
        missing += (a.ranks - 1) - len(rep)
        deaf_runs += bool(deaf)
        reports += rep.values()
        teardowns += des.values()
        slow = not rep or max(rep.values()) > 1000
        if a.keep and (deaf or slow or "UNEXPECTED" in out):
            os.makedirs(a.keep, exist_ok=True)
            with open(os.path.join(a.keep, "run_%d.log" % i), "w") as f:
                f.write(out)
        print(i, "report ms", dict(sorted(rep.items())), "teardown ms", dict(sorted(des.items())),
              "deaf", deaf, "UNEXPECTED" if "UNEXPECTED" in out else "", flush=True)
    reports.sort()
    teardowns.sort()

    def q(xs, f):
        return xs[min(len(xs) - 1, int(f * len(xs)))] if xs else None

    print("runs %d, deaf runs %d, survivors without a report %d" % (a.runs, deaf_runs, missing))
    print("report ms p50 %s p90 %s max %s; > 1 s: %d" % (q(reports, .5), q(reports, .9), reports[-1] if reports else None,
                                                         sum(1 for v in reports if v > 1000)))
    print("teardown ms p50 %s max %s" % (q(teardowns, .5), teardowns[-1] if teardowns else None))


if __name__ == "__main__":
    main()
