#!/usr/bin/python3
"""CI short version of bench/strategies/strategy_bench.py (issue #13).

  strategy_emu_test.py --tool tools/emu-cluster --tandem build/.../bin/tandem

Runs the benchmark with --quick: 2 emulated t2.micro worker hosts (+ 1 server host), LeNet-5 on a slice of
Fashion-MNIST, a few steps (rounds) of every strategy -- DDP, PS sync, PS async, SSP, asgd, EASGD, local SGD, FedAvg
IID and Dirichlet -- each with `--predict` and `tandem simulate` of the same job, then DDP ring against PS sync with
1 server. Checks that the harness produces a complete table: a row per strategy that ran (exit 0), with finite
positive measured and predicted step (round) times from both predictions, finite errors, a test accuracy in [0, 1],
bytes sent by every worker's emulated NIC, and the PS/ring rows with throughput and the busiest NIC's bytes; and that
the printed tables carry every strategy. The figures themselves are not bounded here (few steps on a loaded
machine): the benchmark reports them.
Exit 0 pass, 1 fail, 77 (CTest SKIP_RETURN_CODE) where the machine cannot host the cluster or lacks the dataset,
with the reason printed. The benchmark tears its cluster down; this test also does, by name, if it had to stop it.
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import emu_test  # noqa: E402  (preconditions and checks shared with the cluster's own test)

BENCH = os.path.join(REPO, "bench", "strategies", "strategy_bench.py")
SKIP = 77
# What --quick runs (strategy_bench.strategies() less the 2-server PS, which needs a fourth host).
QUICK = ["ddp", "ps1", "ps-async", "ssp", "asgd", "easgd", "localsgd", "fedavg-iid", "fedavg-dir"]


def finite_pos(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--timeout-s", type=float, default=150)
    a = ap.parse_args()
    t0 = time.monotonic()
    checks = emu_test.Checks()
    name = f"sbq{os.getpid() % 100000}"
    try:
        emu_test.preconditions(os.path.realpath(a.tool))
        why = emu_test.cgroups_writable(os.path.realpath(a.tool))
        if why:
            raise emu_test.Skip(f"the CPU quota and memory limit need writable cgroups: {why}")
    except emu_test.Skip as e:
        print(f"SKIPPED: {e}", flush=True)
        return SKIP
    with tempfile.TemporaryDirectory(prefix="tandem_strategy_emu_") as tmp:
        out = os.path.join(tmp, "quick.json")
        p = subprocess.Popen([sys.executable, BENCH, "--quick", "--tandem", a.tandem, "--name", name, "--json", out],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            text, _ = p.communicate(timeout=a.timeout_s)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)  # the bench tears its cluster down on SIGTERM
            try:
                text, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
            subprocess.run([a.tool, "down", "--name", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(text)
            print(f"FAIL: strategy_bench --quick did not finish in {a.timeout_s:.0f} s")
            return 1
        print(text, flush=True)
        if p.returncode == SKIP:
            print("SKIPPED: the benchmark could not run here (reason above)")
            return SKIP
        checks.check(p.returncode == 0, "strategy_bench --quick exits 0", f"exit {p.returncode}")
        if not os.path.exists(out):
            print("FAIL: no JSON written")
            return 1
        with open(out) as f:
            res = json.load(f)

    rows = {r["key"]: r for r in res["rows"]}
    checks.check(sorted(rows) == sorted(QUICK), "a row for every strategy", f"{sorted(rows)}")
    for key in QUICK:
        r = rows.get(key)
        if r is None:
            continue
        ok = (r["rc"] == 0 and finite_pos(r["measured_s"]) and finite_pos(r["predicted_s"])
              and math.isfinite(r["error"]) and abs(r["predicted_s"] / r["measured_s"] - 1 - r["error"]) < 1e-6)
        checks.check(ok, f"{key}: measured and predicted per {r['unit']} are finite, the error is theirs",
                     f"rc {r['rc']}, measured {r['measured_s']}, predicted {r['predicted_s']}, error {r['error']}")
        checks.check(finite_pos(r.get("sim_predicted_s")) and math.isfinite(r.get("sim_error") or math.nan),
                     f"{key}: `tandem simulate` of the same job gives a finite step ({r['unit']})",
                     f"{r.get('sim_predicted_s')}, error {r.get('sim_error')}")
        acc = r["final_accuracy"]
        checks.check(r["evals"] >= 1 and isinstance(acc, float) and 0.0 <= acc <= 1.0,
                     f"{key}: a test accuracy per evaluation", f"{r['evals']} evaluations, final {acc}")
        sent = [u for u, _ in r["links"][:r["workers"]]]
        checks.check(len(sent) == r["workers"] and all(s > 0 for s in sent),
                     f"{key}: every worker's emulated NIC sent bytes", f"{sent}")
        if r["servers"]:
            # the server host (the last rank's) carries traffic too: the placement is the one described
            checks.check(len(r["links"]) == r["workers"] + r["servers"] and r["links"][-1][1] > 0,
                         f"{key}: the server's own host receives the pushes", f"{r['links']}")
    ring = [r for r in res["psring"]]
    checks.check([r["servers"] for r in ring] == [0, 1], "PS against ring: DDP ring and PS with 1 server",
                 f"{[r['label'] for r in ring]}")
    for r in ring:
        checks.check(r["rc"] == 0 and finite_pos(r["images_per_sec"]) and finite_pos(r["busiest_nic_bytes_per_step"]),
                     f"{r['label']}: throughput and busiest NIC", f"{r['images_per_sec']} images/s, "
                     f"{r['busiest_nic_bytes_per_step']} B/step on host {r['busiest_host']}")
    labels = [r["label"] for r in res["rows"]]
    table = text.split("## predicted beside measured", 1)
    checks.check(len(table) == 2 and all(f"| {lab} |" in table[1] for lab in labels) and
                 all(f"| {lab} |" in table[0] for lab in labels),
                 "the printed tables list every strategy (time to accuracy, predicted/measured)", "")
    print(f"strategy emu test took {time.monotonic() - t0:.1f} s")
    if checks.failed:
        print(f"{len(checks.failed)} check(s) failed: {checks.failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
