#!/usr/bin/python3
"""The simulator's memory prediction beside the measured peak RSS of one training process, per model (issue #16).

  bench/simulator/memory_check.py [--tandem PATH] [--cases lenet5:64,mlp:64,mobilenetv2:32,resnet18:16]
                                  [--batches 8] [--threads 1] [--optimizer sgd] [--check FRACTION] [--json OUT]

Per case MODEL:BATCH[:CALIBRATED_BATCH]:
  1. `tandem calibrate --model MODEL --batch CALIBRATED_BATCH --curve none` (default: BATCH; short: 1 warm-up, 3
     timed passes) writes a profile with its measured activation_peak_bytes;
  2. `tandem train --model MODEL --dataset synthetic --batch BATCH --limit-batches N --predict --profile P --json`:
     the prediction (predicted_memory_bytes: parameters, gradients, optimizer state, activations, the runtime
     allowance and the loaded data sets) beside the process's measured peak RSS (VmHWM);
  3. the same run predicted from the profile without activation_peak_bytes -- the simulator's fixed factor
     (kTandemCpuActivationPeak, 1.30) over the activations it counts, as before the field existed.
Prints one row per case: measured MiB, predicted MiB with the field and without, the errors (predicted - measured)
/ measured. --check F exits 1 when an error with the field is beyond +-F. Every run is its own process.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
INPUTS = {"lenet5": "1x28x28", "mlp": "1x28x28", "mobilenetv2": "3x32x32", "resnet18": "3x32x32"}


def run(cmd, timeout):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}")
    return p.stdout


def prediction(out):
    preds = [json.loads(l)["prediction"] for l in out.splitlines() if l.startswith('{"prediction"')]
    if len(preds) != 1:
        raise RuntimeError(f"expected one prediction line, got {len(preds)}:\n{out[-3000:]}")
    return preds[0]


def case(tandem, model, batch, cal_batch, a, d):
    shape = INPUTS.get(model, "3x32x32")
    prof = os.path.join(d, f"{model}_{batch}.json")
    run([tandem, "calibrate", "--model", model, "--input", shape, "--batch", str(cal_batch), "--threads",
         str(a.threads), "--optimizer", a.optimizer, "--warmup", "1", "--iters", "3", "--curve", "none", "--out", prof],
        a.timeout)
    with open(prof) as f:
        p = json.load(f)
    old = dict(p)
    old.pop("activation_peak_bytes", None)
    prof_old = os.path.join(d, f"{model}_{batch}_old.json")
    with open(prof_old, "w") as f:
        json.dump(old, f)
    train = [tandem, "train", "--model", model, "--dataset", "synthetic", "--input", shape, "--batch", str(batch),
             "--threads", str(a.threads), "--optimizer", a.optimizer, "--limit-batches", str(a.batches), "--eval-limit-batches", "1", "--predict",
             "--json", "--profile"]
    new = prediction(run(train + [prof], a.timeout))
    before = prediction(run(train + [prof_old], a.timeout))
    return {"model": model, "batch": batch, "calibrated_batch": cal_batch, "activation_peak_bytes": p.get("activation_peak_bytes"),
            "runtime_rss_bytes": p.get("runtime_rss_bytes"), "measured_bytes": new["measured_memory_bytes"],
            "predicted_bytes": new["predicted_memory_bytes"], "error": new["memory_error"],
            "measured_bytes_fixed_run": before["measured_memory_bytes"],
            "predicted_fixed_bytes": before["predicted_memory_bytes"], "error_fixed": before["memory_error"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "default", "bin", "tandem"))
    ap.add_argument("--cases", default="lenet5:64,mlp:64,mobilenetv2:32,resnet18:16")
    ap.add_argument("--batches", type=int, default=8, help="training batches per run (--limit-batches)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--optimizer", default="sgd", help="sgd, momentum, adam or adamw (calibrate and train)")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--check", type=float, default=None, help="fail when |error| with the field exceeds this")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for c in a.cases.split(","):
            model, batch, *cal = c.split(":")
            rows.append(case(a.tandem, model, int(batch), int(cal[0]) if cal else int(batch), a, d))
            r = rows[-1]
            mib = lambda b: b / 2**20  # noqa: E731
            if len(rows) == 1:
                print(f"{'model':<12} {'batch':>5} {'cal':>4} | {'act peak MiB':>12} {'runtime MiB':>11} | {'measured MiB':>12} "
                      f"{'predicted':>9} {'error':>7} | {'fixed 1.30':>10} {'error':>7}")
            print(f"{r['model']:<12} {r['batch']:>5} {r['calibrated_batch']:>4} | {mib(r['activation_peak_bytes'] or 0):>12.1f} "
                  f"{mib(r['runtime_rss_bytes'] or 0):>11.1f} | {mib(r['measured_bytes']):>12.1f} "
                  f"{mib(r['predicted_bytes']):>9.1f} {r['error'] * 100:>+6.1f}% | "
                  f"{mib(r['predicted_fixed_bytes']):>10.1f} {r['error_fixed'] * 100:>+6.1f}%", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.check is not None:
        bad = [r for r in rows if r["activation_peak_bytes"] is None or abs(r["error"]) > a.check]
        for r in bad:
            print(f"memory_check: {r['model']} batch {r['batch']}: error {r['error'] * 100:+.1f}% beyond "
                  f"+-{a.check * 100:.0f}% (activation_peak_bytes {r['activation_peak_bytes']})", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
