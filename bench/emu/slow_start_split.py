#!/usr/bin/python3
"""Slow start after idle in a validate_bench.py run, re-simulated three ways (run 11 in README.md):

  bench/emu/slow_start_split.py RUN.json CASE NEW_TANDEM OLD_TANDEM

NEW_TANDEM counts idle from the previous step's tail (on) and runs with it off; OLD_TANDEM (a build before that
change, which also lacks the shared-core profile fields: they are left out for it) counts from the step's start.
Each row's job as validate_bench.py predicts it, with `tandem simulate` (the Tandem jobs too).
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import validate_bench as vb  # noqa: E402

run = json.load(open(sys.argv[1]))
case, NEW, OLD = sys.argv[2], sys.argv[3], sys.argv[4]
print("| job | measured | tail, on | error | step start, on (main) | error | off | error |\n|---|---:|---:|---:|---:|---:|---:|---:|")
with tempfile.TemporaryDirectory() as tmp:
    lp = run["profiles"]["tandem-lenet5"]
    for r in run["rows"]:
        if r.get("case") != case or "measured_s" not in r: continue
        job = r["job"]; model = job.split("-", 1)[1]; out = []
        for tag, binary, ss in (("new", NEW, True), ("old", OLD, True), ("off", NEW, False)):
            b = vb.Bench(argparse.Namespace(width_mult=0.25, batch=32), binary, tmp)
            b.mem_bps = lp.get("memory_bytes_per_s", 8e9)
            keep = vb.COMM_CPU + (vb.SHARED_CORES if tag != "old" else ())
            b.comm_cpu = {k: lp[k] for k in keep if k in lp}
            cl = json.loads(json.dumps(run["clusters"][case])); cl["nodes"][0]["tcp_slow_start_after_idle"] = ss
            cfile = os.path.join(tmp, f"c-{tag}.json"); json.dump(cl, open(cfile, "w"))
            if job.startswith("allreduce"):
                args = b.allreduce_model(vb.SIZES[model]) + ["--batch", "1", "--strategy", "ddp", "--bucket-mb", "64", "--no-overlap", "--algo", r["algo"]]
            else:
                prof = {k: x for k, x in run["profiles"][job].items() if tag != "old" or k not in vb.SHARED_CORES}
                pf = os.path.join(tmp, f"{job}-{tag}.json"); json.dump(prof, open(pf, "w"))
                if job.startswith("tandem-"):
                    shape = "x".join(str(d) for d in prof["input"])
                    args = vb.model_args(model, 0.25) + ["--dataset", "", "--samples", "960", "--input", shape, "--batch", "32", "--strategy", "ddp", "--profile", pf]
                else:
                    args = vb.model_args(model, 0.25) + ["--dataset", "fashion-mnist", "--batch", "32", "--strategy", "ddp", "--framework", "pytorch-ddp", "--profile", pf]
            t = b.simulate(cfile, args)["step_time_s"]
            out.append(f"{t*1e3:.2f} ms | {(t/r['measured_s']-1)*100:+.1f}%")
        print(f"| {job} | {r['measured_s']*1e3:.2f} ms | " + " | ".join(out) + " |")
