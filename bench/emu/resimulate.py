#!/usr/bin/env python3
"""Re-predicts a recorded validate_bench run with today's simulator, without the emulated cluster.

  bench/emu/resimulate.py [--tandem build/default/bin/tandem] [--cases 4r2c,...] RESULTS.json

A validate_bench results file (from run 12 on) holds what the simulator was given: each case's cluster
description (`clusters`) and each job's calibration profile (`profiles`). For every measured row this runs
`tandem simulate` again with them, as validate_bench does:
- all-reduce rows: the same synthetic model and profile (no compute, the host's memory bandwidth, communication
  CPU and shared-core figures of the Tandem LeNet-5 profile) and the algorithm the bench ran;
- PyTorch rows: `--framework pytorch-ddp` with the PyTorch profile;
- Tandem rows: the run's own prediction came from `train --predict`, so today's is that prediction times today's
  `tandem simulate` of the job over the run's (`simulate_with_s`).
Nothing is taken from the measurements but the error column. Prints the rows and the summary, old beside new.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import predict_lib  # noqa: E402
import validate_bench as vb  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tandem")
    ap.add_argument("--cases", help="only these cases (comma-separated)")
    ap.add_argument("--torch-mobilenetv2-compute-cv", type=float,
                    help="compute_cv for a PyTorch MobileNetV2 profile that lacks it (runs before torch_job.py recorded it): "
                         "the CV of a PyTorch pass's CPU time measured on one emulated host")
    ap.add_argument("--comm-cpu-from", metavar="JSON",
                    help="replace every profile's tcp_cpu_s_per_byte and tcp_cpu_s_per_wakeup with this file's (e.g. "
                         "netcpu_calibrate.py's output: the emulated path's figures, where the run has loopback ones)")
    ap.add_argument("--wakeup-latency-s", type=float, metavar="S",
                    help="also predict every row with this wakeup_latency_s in every profile (e.g. a new `tandem "
                         "calibrate`'s figure) and print it beside today's prediction with the recorded profiles")
    ap.add_argument("results")
    a = ap.parse_args()
    tandem = predict_lib.find_tandem(a.tandem, need=("simulate",))
    with open(a.results) as f:
        run = json.load(f)
    for key in ("clusters", "profiles", "rows"):
        if key not in run:
            print(f"{a.results}: no '{key}' (validate_bench records it from run 12 on)", file=sys.stderr)
            return 2
    cases = set(a.cases.split(",")) if a.cases else None
    if a.comm_cpu_from:
        with open(a.comm_cpu_from) as f:
            src = json.load(f)
        figs = {k: src[k] for k in ("tcp_cpu_s_per_byte", "tcp_cpu_s_per_wakeup") if isinstance(src.get(k), (int, float))}
        if len(figs) != 2:
            print(f"--comm-cpu-from {a.comm_cpu_from}: needs tcp_cpu_s_per_byte and tcp_cpu_s_per_wakeup", file=sys.stderr)
            return 2
        for prof in run["profiles"].values():
            prof.update(figs)
    with tempfile.TemporaryDirectory(prefix="tandem_emu_resim_") as tmp:
        def write(name, obj):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                json.dump(obj, f)
            return path

        def simulate(case, args):
            p = subprocess.run([tandem, "simulate", "--cluster", write(f"cluster-{case}.json", run["clusters"][case]),
                                "--json"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"tandem simulate failed ({p.returncode}): {p.stderr.strip()[-800:]}")
            return json.loads(p.stdout[p.stdout.index("{"):])["step_time_s"]

        def predict(r, profiles):
            case, job = r["case"], r["job"]
            lp = profiles["tandem-lenet5"]
            comm = {k: lp[k] for k in vb.COMM_CPU + vb.SHARED_CORES if k in lp}
            if job.startswith("allreduce-"):
                n = vb.SIZES[job.split("-", 1)[1]]
                spec = write(f"ar{n}.json", {"name": f"allreduce{n}", "input": [1, 1, 1], "layers": [
                    {"name": "flatten0", "type": "flatten", "inputs": ["input"]},
                    {"name": "fc1", "type": "linear", "inputs": ["flatten0"], "out_features": n // 8, "bias": True}]})
                prof = write(f"ar{n}-profile.json", {
                    "format": "tandem-calibration", "version": 1, "backend": "cpu", "model": f"allreduce{n}",
                    "batch": 1, "optimizer_step_s": 1e-9, "memory_bytes_per_s": lp["memory_bytes_per_s"], **comm,
                    "layers": [{"name": "flatten0", "forward_s": 1e-9, "backward_s": 1e-9},
                               {"name": "fc1", "forward_s": 1e-9, "backward_s": 1e-9}]})
                return simulate(case, ["--model-file", spec, "--profile", prof, "--dataset", "", "--samples", "64",
                                       "--input", "1x1x1", "--batch", "1", "--strategy", "ddp", "--bucket-mb", "64",
                                       "--no-overlap", "--algo", r["algo"]])
            model = job.split("-", 1)[1]
            p = dict(profiles[job])
            if job == "torch-mobilenetv2" and a.torch_mobilenetv2_compute_cv is not None and "compute_cv" not in p:
                p["compute_cv"] = a.torch_mobilenetv2_compute_cv
            prof = write(f"{job}.json", p)
            if job.startswith("tandem-"):
                shape = "x".join(str(d) for d in profiles[job]["input"])
                s = simulate(case, vb.model_args(model, 0.25) + [
                    "--dataset", "", "--samples", "960", "--input", shape, "--batch", "32", "--strategy", "ddp",
                    "--profile", prof])
                return r["predicted_s"] * s / r["simulate_with_s"]
            return simulate(case, vb.model_args(model, 0.25) + [
                "--dataset", "fashion-mnist", "--batch", "32", "--strategy", "ddp", "--framework",
                "pytorch-ddp", "--profile", prof])

        woken = None
        if a.wakeup_latency_s is not None:
            woken = {k: dict(p, wakeup_latency_s=a.wakeup_latency_s) for k, p in run["profiles"].items()}
        head = "| case | job | measured | recorded prediction | error | today's | error |"
        if woken:
            head += f" wakeup_latency_s {a.wakeup_latency_s * 1e6:.0f} us | error |"
        print(head + "\n|---|---|" + "---:|" * (head.count("|") - 3))
        old_e, new_e, wk_e = [], [], []
        for r in run["rows"]:
            if "measured_s" not in r or (cases and r["case"] not in cases):
                continue
            case, job = r["case"], r["job"]
            new = predict(r, run["profiles"])
            m, old = r["measured_s"], r["predicted_s"]
            old_e.append(abs(old / m - 1))
            new_e.append(abs(new / m - 1))
            print(f"| {case} | {job} | {m * 1e3:.2f} ms | {old * 1e3:.2f} ms | {(old / m - 1) * 100:+.1f}% | "
                  f"{new * 1e3:.2f} ms | {(new / m - 1) * 100:+.1f}% |", end="")
            if woken:
                w = predict(r, woken)
                wk_e.append(abs(w / m - 1))
                print(f" {w * 1e3:.2f} ms | {(w / m - 1) * 100:+.1f}% |", end="")
            print(flush=True)
    for name, e in (("recorded", old_e), ("today's", new_e), ("with the wake-up figure", wk_e)):
        if e:
            print(f"{name}: {len(e)} rows, max |error| {max(e) * 100:.1f}%, median {statistics.median(e) * 100:.1f}%, "
                  f"within 10%: {sum(x <= 0.10 for x in e)}, within 5%: {sum(x <= 0.05 for x in e)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
