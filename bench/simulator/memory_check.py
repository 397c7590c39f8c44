#!/usr/bin/python3
"""The simulator's memory prediction beside the measured peak RSS of one training process, per model (issue #16).

  bench/simulator/memory_check.py [--tandem PATH] [--cases lenet5:64,mlp:64,mobilenetv2:32,resnet18:16]
                                  [--batches 8] [--train-limit 0] [--threads 1] [--optimizer sgd]
                                  [--check FRACTION] [--json OUT]
  bench/simulator/memory_check.py --cross lenet5,mlp,mobilenetv2,resnet18 --cal 32 --at 8,32,128

Per case MODEL:BATCH[:CALIBRATED_BATCH]:
  1. `tandem calibrate --model MODEL --batch CALIBRATED_BATCH --curve none` (default: BATCH; short: 1 warm-up, 3
     timed passes) writes a profile with its measured activation peak: activation_peak_bytes at the batch and
     activation_peak_curve at the batch and half of it, and primitive_bytes_curve, what one more batch shape's
     primitives keep resident at a quarter and half of it (one calibration per model and batch, shared by the cases;
     the prediction charges an epoch's short last batch with it and moves the runtime figure to the job's batch);
  2. `tandem train --model MODEL --dataset synthetic --batch BATCH --limit-batches N --predict --profile P --json`:
     the prediction (predicted_memory_bytes: parameters, gradients, optimizer state, activations, the runtime
     allowance and the loaded data sets) beside the process's measured peak RSS (VmHWM);
  3. the same run predicted from the profile less its curve -- the single measurement scaled in proportion to the
     batch, as before the curve existed ("one point");
  4. and less both -- the peak the job compiler derives for the cpu backend (StageMemory::cpu_activation_peak_bytes:
     1.25 x the padded activations + backward's scratch + the largest convolution's weight-gradient scratch; before
     issue #16's memory unification, 1.30 x the counted activations) with the profile's runtime size ("derived").
Every run also logs the runtime memory guard's own estimate (engine/train/memory_guard.cpp, TANDEM_LOG_LEVEL=debug)
before its first step: shown as "guard", its error against the same measured peak.
--cross MODELS --cal C --at B1,B2,...: the cases MODEL:B:C for every model and B, i.e. calibrated at one batch and
predicted at others (the cross-batch check).
Prints one row per case: measured MiB; predicted MiB and error (predicted - measured) / measured with the curve, with
one point, derived; the guard's estimate and error. --check F exits 1 when an error with the curve is
beyond +-F. Every run is its own process.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
INPUTS = {"lenet5": "1x28x28", "mlp": "1x28x28", "mobilenetv2": "3x32x32", "resnet18": "3x32x32"}


def run(cmd, timeout, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}")
    return p.stdout


def prediction(out):
    preds = [json.loads(l)["prediction"] for l in out.splitlines() if l.startswith('{"prediction"')]
    if len(preds) != 1:
        raise RuntimeError(f"expected one prediction line, got {len(preds)}:\n{out[-3000:]}")
    return preds[0]


UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def guard_estimate(out):
    """The memory guard's estimate from its debug line ("trainer: estimated memory 40.4 MiB (..."), or None."""
    m = re.search(r"trainer: estimated memory ([0-9.]+) (KiB|MiB|GiB) \(", out)
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def calibrate(tandem, model, cal_batch, a, d, cache):
    """The profile of MODEL at CAL_BATCH and its two reduced copies: (full, one point, fixed), written once."""
    key = (model, cal_batch)
    if key in cache:
        return cache[key]
    prof = os.path.join(d, f"{model}_{cal_batch}.json")
    run([tandem, "calibrate", "--model", model, "--input", INPUTS.get(model, "3x32x32"), "--batch", str(cal_batch),
         "--threads", str(a.threads), "--optimizer", a.optimizer, "--warmup", "1", "--iters", "3", "--curve", "none",
         "--out", prof], a.timeout)
    with open(prof) as f:
        p = json.load(f)
    paths = [prof]
    for suffix, drop in (("single", ["activation_peak_curve"]), ("fixed", ["activation_peak_curve", "activation_peak_bytes"])):
        q = {k: v for k, v in p.items() if k not in drop}
        paths.append(os.path.join(d, f"{model}_{cal_batch}_{suffix}.json"))
        with open(paths[-1], "w") as f:
            json.dump(q, f)
    cache[key] = (p, paths)
    return cache[key]


def case(tandem, model, batch, cal_batch, a, d, cache):
    shape = INPUTS.get(model, "3x32x32")
    p, (prof, prof_single, prof_fixed) = calibrate(tandem, model, cal_batch, a, d, cache)
    train = [tandem, "train", "--model", model, "--dataset", "synthetic", "--input", shape, "--batch", str(batch),
             "--threads", str(a.threads), "--optimizer", a.optimizer, "--limit-batches", str(a.batches),
             "--train-limit", str(a.train_limit), "--eval-limit-batches", "1", "--predict", "--json", "--profile"]
    env = dict(os.environ, TANDEM_LOG_LEVEL="debug")
    out = run(train + [prof], a.timeout, env)
    new = prediction(out)
    single = prediction(run(train + [prof_single], a.timeout))
    fixed = prediction(run(train + [prof_fixed], a.timeout))
    guard = guard_estimate(out)
    measured = new["measured_memory_bytes"]
    return {"model": model, "batch": batch, "calibrated_batch": cal_batch,
            "activation_peak_bytes": p.get("activation_peak_bytes"),
            "activation_peak_curve": p.get("activation_peak_curve"),
            "runtime_rss_bytes": p.get("runtime_rss_bytes"), "measured_bytes": measured,
            "predicted_bytes": new["predicted_memory_bytes"], "error": new["memory_error"],
            "measured_bytes_single_run": single["measured_memory_bytes"],
            "predicted_single_bytes": single["predicted_memory_bytes"], "error_single": single["memory_error"],
            "measured_bytes_fixed_run": fixed["measured_memory_bytes"],
            "predicted_fixed_bytes": fixed["predicted_memory_bytes"], "error_fixed": fixed["memory_error"],
            "guard_estimate_bytes": guard, "guard_error": (guard - measured) / measured if guard and measured else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "default", "bin", "tandem"))
    ap.add_argument("--cases", default="lenet5:64,mlp:64,mobilenetv2:32,resnet18:16")
    ap.add_argument("--batches", type=int, default=8, help="training batches per run (--limit-batches; 0: the epoch)")
    ap.add_argument("--train-limit", type=int, default=0,
                    help="training samples (tandem train --train-limit; 0: all 6000): with --batches 0 and a count "
                         "that is not a multiple of the batch, the epoch ends with a partial batch")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--optimizer", default="sgd", help="sgd, momentum, adam or adamw (calibrate and train)")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--check", type=float, default=None, help="fail when |error| with the field exceeds this")
    ap.add_argument("--json", default=None)
    ap.add_argument("--cross", default=None, help="models calibrated at --cal and predicted at each of --at")
    ap.add_argument("--cal", type=int, default=32, help="--cross: the calibrated batch")
    ap.add_argument("--at", default="8,32,128", help="--cross: the batches predicted")
    a = ap.parse_args()
    if a.cross:
        cases = [(m, int(b), a.cal) for m in a.cross.split(",") for b in a.at.split(",")]
    else:
        cases = []
        for c in a.cases.split(","):
            model, batch, *cal = c.split(":")
            cases.append((model, int(batch), int(cal[0]) if cal else int(batch)))
    rows = []
    mib = lambda b: (b or 0) / 2**20  # noqa: E731
    pct = lambda e: f"{e * 100:>+6.1f}%" if e is not None else "     -"  # noqa: E731
    with tempfile.TemporaryDirectory() as d:
        cache = {}
        for model, batch, cal in cases:
            rows.append(case(a.tandem, model, batch, cal, a, d, cache))
            r = rows[-1]
            if len(rows) == 1:
                print(f"{'model':<12} {'batch':>5} {'cal':>4} | {'act peak MiB':>12} {'runtime MiB':>11} | {'measured MiB':>12} | "
                      f"{'curve':>7} {'error':>7} | {'one point':>9} {'error':>7} | {'derived':>10} {'error':>7} | "
                      f"{'guard':>7} {'error':>7}")
            print(f"{r['model']:<12} {r['batch']:>5} {r['calibrated_batch']:>4} | {mib(r['activation_peak_bytes']):>12.1f} "
                  f"{mib(r['runtime_rss_bytes']):>11.1f} | {mib(r['measured_bytes']):>12.1f} | "
                  f"{mib(r['predicted_bytes']):>7.1f} {pct(r['error'])} | "
                  f"{mib(r['predicted_single_bytes']):>9.1f} {pct(r['error_single'])} | "
                  f"{mib(r['predicted_fixed_bytes']):>10.1f} {pct(r['error_fixed'])} | "
                  f"{mib(r['guard_estimate_bytes']):>7.1f} {pct(r['guard_error'])}", flush=True)
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
