#!/usr/bin/python3
"""The shared-core wake-up figure (`wakeup_latency_s`, issue #16) measured where validate_bench calibrates, and
checked against recorded 4r2c rows it was not fitted to.

  flock /tmp/tandem-emu.lock bench/emu/wakeup_check.py [--tandem PATH] [--reps 3] [--burst-us 0]
        [--bare] [RESULTS.json ...]

1. `tandem calibrate` of LeNet-5 (batch 32, one thread, as validate_bench runs it) `--reps` times on one emulated
   t2.micro host (CFS quota 0.5 core, 5 ms periods; tools/emu-cluster), and with --bare as many times on the
   machine itself (no quota): per run, the figure and the wake-up distribution the profile's machine text gives,
   with the machine's load.
2. The median of the emulated host's figures (with --no-emu: the machine's), handed to resimulate.py for each
   RESULTS.json (validate_bench runs from run 12 on): its 4r2c rows re-predicted with the recorded profiles and with
   the figure, beside what was measured then.
Needs root (the emulated host).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import predict_lib  # noqa: E402
import validate_bench as vb  # noqa: E402


def calibrate(tandem, prefix, out, burst_us):
    cmd = prefix + [tandem, "calibrate", "--model", "lenet5", "--dataset", "synthetic", "--batch", "32", "--threads",
                    "1", "--iters", "30", "--curve", "none", "--wakeup-burst-us", str(burst_us), "--out", out]
    load = os.getloadavg()[0]
    rc, text = vb.sh(cmd)
    if rc != 0:
        raise RuntimeError(f"tandem calibrate failed ({rc}):\n{text[-2000:]}")
    with open(out) as f:
        prof = json.load(f)
    note = re.search(r"wake-up on shared cores: [^;]*", prof.get("machine", ""))
    return prof.get("wakeup_latency_s", 0.0), load, note.group(0) if note else "(no wake-up note)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tandem")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--burst-us", type=float, default=0,
                    help="--wakeup-burst-us (0: calibrate's default, one chunk's reduction)")
    ap.add_argument("--bare", action="store_true", help="also calibrate on the machine itself (no quota)")
    ap.add_argument("--name", default="wkchk")
    ap.add_argument("--no-emu", action="store_true", help="only the machine itself (implies --bare)")
    ap.add_argument("results", nargs="*")
    a = ap.parse_args()
    tandem = predict_lib.find_tandem(a.tandem, need=("calibrate", "simulate"))
    figs = {}
    with tempfile.TemporaryDirectory(prefix="tandem_wakeup_") as tmp:
        places = ([] if a.no_emu else [("emulated t2.micro host (0.5 core)", "emu")]) + (
            [("this machine (no quota)", "bare")] if a.bare or a.no_emu else [])
        for label, where in places:
            figs[where] = []
            try:
                if where == "emu":
                    vb.up(a.name, 1, 65.0, 0.0, vb.CALIB_QUOTA)
                    prefix = vb.host_exec(a.name, 0)
                else:
                    prefix = []
                for i in range(a.reps):
                    w, load, note = calibrate(tandem, prefix, os.path.join(tmp, f"{where}{i}.json"), a.burst_us)
                    figs[where].append(w)
                    print(f"{label} #{i + 1} (load {load:.2f}): wakeup_latency_s {w * 1e6:.0f} us; {note}", flush=True)
            finally:
                if where == "emu":
                    predict_lib.emu(["down", "--name", a.name], check=False)
            print(f"{label}: median {statistics.median(figs[where]) * 1e6:.0f} us of "
                  f"{', '.join(f'{w * 1e6:.0f}' for w in figs[where])} us", flush=True)
    where = "emu" if "emu" in figs else "bare"
    w = statistics.median(figs[where])
    for r in a.results:
        print(f"\n{r}: 4r2c re-predicted with wakeup_latency_s {w * 1e6:.0f} us (the {where} median)", flush=True)
        subprocess.run([sys.executable, os.path.join(HERE, "resimulate.py"), "--tandem", tandem, "--cases", "4r2c",
                        "--wakeup-latency-s", repr(w), r], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
