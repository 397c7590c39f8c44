#!/usr/bin/python3
"""CI short version of bench/emu/validate_bench.py (issue #16: the simulator calibrated on one emulated host,
against jobs on several).

  validate_emu_test.py --tool tools/emu-cluster --tandem build/.../bin/tandem

Runs the benchmark itself for one case and two jobs: one emulated t2.micro host calibrated (`tandem calibrate`
of lenet5 at 0.5 core), then 2 hosts at 65 Mbit/s: Tandem DDP lenet5 with `--predict` and a 1 MiB
`tandem bench allreduce`, each predicted from the one-host profile. Checks: both rows present with finite
measured and predicted steps, the profile carries the host's quota, and each prediction within 25% of its
measurement (a sanity bound for a loaded CI machine; the benchmark's README reports the real accuracy).
Exit 0 / 1 / 77 (skipped, reason printed) as the other emu tests.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import emu_test  # noqa: E402

SKIP = 77


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tandem", required=True)
    a = ap.parse_args()
    checks = emu_test.Checks()
    t0 = time.monotonic()
    try:
        emu_test.preconditions(os.path.realpath(a.tool))
        why = emu_test.cgroups_writable(os.path.realpath(a.tool))
        if why:
            raise emu_test.Skip(f"the CPU quota needs writable cgroups: {why}")
    except emu_test.Skip as e:
        print(f"SKIPPED: {e}", flush=True)
        return SKIP
    with tempfile.TemporaryDirectory(prefix="tandem_validate_test_") as tmp:
        out = os.path.join(tmp, "v.json")
        p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "emu", "validate_bench.py"), "--tandem",
                            a.tandem, "--cases", "2x65", "--jobs", "tandem-lenet5,allreduce-1M", "--ar-iters", "3",
                            "--name", f"emuvt{os.getpid() % 10000}", "--json", out],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        print(p.stdout, flush=True)
        checks.check(p.returncode == 0, "validate_bench exits 0", f"exit {p.returncode}")
        res = json.load(open(out)) if os.path.exists(out) else {}
        prof = (res.get("profiles") or {}).get("tandem-lenet5") or {}
        checks.check(prof.get("cpu_quota") == 0.5, "the one-host profile carries the host's quota",
                     f"cpu_quota {prof.get('cpu_quota')}")
        # the shared-core figures tandem calibrate measures beside its passes (simulator/compute/profile.hpp)
        corun = prof.get("corun_slowdown") or []
        checks.check(len(corun) >= 2 and corun[0][1] == 1.0 and all(0.5 <= f <= 10 for _, f in corun),
                     "the profile carries a co-run table starting at 1.0 alone", f"corun_slowdown {corun}")
        wake = prof.get("wakeup_latency_s")
        checks.check(wake is not None and 0 <= wake < 0.1, "the profile carries a wake-up latency",
                     f"wakeup_latency_s {wake}")
        rows = {r["job"]: r for r in res.get("rows", []) if r.get("case") == "2x65"}
        for job in ("tandem-lenet5", "allreduce-1M"):
            r = rows.get(job, {})
            m, pr = r.get("measured_s"), r.get("predicted_s")
            ok = m is not None and pr is not None and math.isfinite(m) and math.isfinite(pr) and m > 0 and pr > 0
            checks.check(ok, f"{job}: a measured and a predicted time", f"{m} / {pr}")
            if ok:
                checks.check(abs(pr / m - 1) < 0.25, f"{job}: predicted within 25% of measured",
                             f"error {(pr / m - 1) * 100:+.1f}%")
    if checks.failed:
        print(f"{len(checks.failed)} check(s) failed: {checks.failed}")
    print(f"emu validate test took {time.monotonic() - t0:.1f} s")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
