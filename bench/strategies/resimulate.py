#!/usr/bin/env python3
"""Re-predicts recorded strategy_bench runs with today's simulator, without re-running the emulated cluster.

  bench/strategies/resimulate.py [--tandem build/default/bin/tandem] [RESULTS.json ...]

For each results file (default: results/run1.json, run2.json, run3_lr0.005.json) it rebuilds what the harness
gave `tandem simulate` in that run -- the cluster description of the emulated cluster (predict_lib's, from the
recorded cluster_config) and a calibration profile with the run's recorded figures: forward, backward and
optimizer totals at batch 32, memory bandwidth and the p2p bandwidth and latency (--profile-network) -- and
simulates every recorded row again with the harness's own flags. The run's profile file itself was temporary;
only its per-layer split is not recorded, so the split comes from a `tandem calibrate` of LeNet-5 here, scaled to
the run's forward and backward totals (LeNet-5 is one gradient bucket, so the split moves only where in backward
its single push starts). Nothing is taken from the training measurements. Today's prediction is given the
training runs' seed (strategy_bench's SEED: FedAvg's shares, asgd's matching); the runs' own `tandem simulate`
had no --seed, so --check-old leaves it out for them. From run 4 on the results JSON holds the run's profile
itself, which is used as it is.

Prints, per row: the prediction recorded in the run (`tandem simulate`'s where the run has it, else `train
--predict`'s), today's, the measured step (round) and both errors. --check-old: fail when a row's recomputed
prediction with this same simulator differs from the recorded one by more than 2% (the reconstruction's check;
run it at the commit that recorded the figures).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench", "emu"))
sys.path.insert(0, HERE)
from strategy_bench import SEED, cluster_json, model_args, strategies  # noqa: E402

DEFAULT_RUNS = ["run1.json", "run2.json", "run3_lr0.005.json"]
# the profile's communication CPU figures (simulator/comm_cpu.hpp), absent from runs 1-8's profiles
COMM_CPU_KEYS = ("tcp_cpu_s_per_byte", "tcp_cpu_s_per_wakeup", "copy_cpu_s_per_byte")


def local_split(tandem, tmp):
    """Per-layer forward/backward shares of LeNet-5 at batch 32, measured here (1 thread)."""
    out = os.path.join(tmp, "split.json")
    subprocess.run([tandem, "calibrate", "--model", "lenet5", "--dataset", "synthetic", "--batch", "32", "--iters",
                    "8", "--threads", "1", "--out", out, "--json"], check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def run_profile(split, cal):
    """The split's layers scaled to a run's recorded totals, with its optimizer, memory and p2p figures."""
    p = json.loads(json.dumps(split))
    f = sum(layer["forward_s"] for layer in p["layers"])
    b = sum(layer["backward_s"] for layer in p["layers"])
    for layer in p["layers"]:
        layer["forward_s"] *= cal["forward_s"] / f
        layer["backward_s"] *= cal["backward_s"] / b
    p["batch"] = cal["batch"]
    p["optimizer_step_s"] = cal["optimizer_step_s"]
    p["memory_bytes_per_s"] = cal["memory_bytes_per_s"]
    p["p2p"] = {"bandwidth_bytes_per_s": cal["p2p_bytes_per_s"], "latency_s": cal["p2p_latency_s"]}
    p["machine"] = "reconstructed from " + cal.get("out", "a recorded calibration")
    return p


def takes_limit_batches(tandem):
    """Whether this tandem's simulate has --limit-batches (older builds: the data set is shrunk instead)."""
    p = subprocess.run([tandem, "simulate", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return "--limit-batches" in p.stdout


def simulate(tandem, cluster, profile, flags, args, fed, seed):
    a = argparse.Namespace(**{"model": "lenet5", "width_mult": 0.25, "ranks_per_host": 1, **args})
    samples = args.get("train_limit") or 60000
    limit = []
    if fed and args.get("fedavg_limit"):
        if takes_limit_batches(tandem):  # the run's own job: each client's local epoch capped
            limit = ["--limit-batches", str(args["fedavg_limit"])]
        else:  # the run's own `tandem simulate` (before --limit-batches): a smaller data set instead
            samples = min(samples, args["fedavg_limit"] * args["batch"] * args["workers"])
    cmd = [tandem, "simulate", "--cluster", cluster] + model_args(a) + ["--dataset", "fashion-mnist", "--samples",
           str(samples), "--batch", str(args["batch"]), "--dp", str(args["workers"]), "--profile", profile,
           "--profile-network", "--json"] + limit + flags + ([] if seed is None else ["--seed", str(seed)])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()[-400:]}")
    return json.loads(p.stdout)


def step_split(row, sim):
    """Worker 0's step split, measured (where the run recorded it) and simulated, as table cells."""
    def ms(x):
        return f"{x * 1e3:.1f}" if isinstance(x, (int, float)) else "--"
    w0 = sim["step_ranks"][0]
    return (f" {ms(row.get('compute_s'))} / {ms(row.get('measured_comm_s'))} ms |"
            f" {ms(w0['compute_s'] + w0['throttled_s'])} / {ms(w0['comm_exposed_s'])} ms |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="results JSON files (default: results/run1, run2, run3)")
    ap.add_argument("--tandem", default=os.path.join(REPO, "build", "default", "bin", "tandem"))
    ap.add_argument("--check-old", action="store_true")
    ap.add_argument("--cv-from", metavar="PROFILE",
                    help="a calibration profile (tandem calibrate --out) whose compute_cv replaces the recorded "
                         "profile's: for runs recorded before calibrate measured it (recalibrate on one host)")
    ap.add_argument("--strategies", help="only these rows (strategy_bench keys, comma-separated)")
    ap.add_argument("--tcp-two-way-factor", type=float,
                    help="every node's tcp_two_way_factor in place of the run's own (0: none), e.g. one measured by "
                         "two_way_calibrate.sh on a fresh pair")
    ap.add_argument("--step-overhead-from", metavar="FILE",
                    help="a JSON file whose step_overhead_cpu_s (compute_probe.py's one-host measurement of the job's "
                         "data path beyond the calibrated pass) goes into every run's profile")
    ap.add_argument("--comm-cpu-from", metavar="PROFILE",
                    help="a one-host calibration profile (tandem calibrate --out) whose communication CPU figures "
                         "(tcp_cpu_s_per_byte, tcp_cpu_s_per_wakeup, copy_cpu_s_per_byte) go into every run's profile "
                         "that has none of them: runs recorded before calibrate measured them")
    ap.add_argument("--no-comm-cpu", action="store_true",
                    help="what-if: every run's profile without its communication CPU figures (the charge's size)")
    ap.add_argument("--split", action="store_true",
                    help="also print worker 0's step split: the recorded compute and exposed communication "
                         "(time_split, train --predict) beside today's simulated ones (compute with the CPU it lost "
                         "to throttling and to moving messages, and the exposed wait)")
    ap.add_argument("--tcp-fanout-cv", type=float,
                    help="every node's tcp_fanout_cv in place of the run's own (0: none), e.g. one measured by "
                         "fanout_calibrate.py on a fresh cluster")
    ap.add_argument("--tcp-fanout-corr", type=float,
                    help="every node's tcp_fanout_corr (from the same calibration as --tcp-fanout-cv)")
    ap.add_argument("--compute-cv", type=float,
                    help="what-if: this compute_cv in every run's profile (a sensitivity, not a prediction)")
    a = ap.parse_args()
    runs = a.runs or [os.path.join(HERE, "results", r) for r in DEFAULT_RUNS]
    table = strategies()
    bad = []
    split_head = (" measured compute / exposed | simulated compute / exposed |", "---:|---:|") if a.split else ("", "")
    print("| run | strategy | measured | old prediction | error | new prediction | error |" + split_head[0])
    print("|---|---|---:|---:|---:|---:|---:|" + split_head[1])
    with tempfile.TemporaryDirectory(prefix="tandem_resim_") as tmp:
        split = None
        for path in runs:
            with open(path) as f:
                run = json.load(f)
            name = os.path.splitext(os.path.basename(path))[0]
            profile = os.path.join(tmp, f"{name}_profile.json")
            with open(profile, "w") as f:  # the run's own profile where it recorded it (from run 4 on)
                if not run.get("profile") and split is None:
                    split = local_split(a.tandem, tmp)
                prof = run.get("profile") or run_profile(split, run["calibration"])
                if a.cv_from:
                    with open(a.cv_from) as g:
                        prof["compute_cv"] = json.load(g).get("compute_cv", 0.0)
                if a.compute_cv is not None:
                    prof["compute_cv"] = a.compute_cv
                if a.comm_cpu_from and not any(prof.get(k) for k in COMM_CPU_KEYS):
                    with open(a.comm_cpu_from) as g:
                        one_host = json.load(g)
                    prof.update({k: one_host[k] for k in COMM_CPU_KEYS if one_host.get(k)})
                if a.no_comm_cpu:
                    for k in COMM_CPU_KEYS:
                        prof.pop(k, None)
                if a.step_overhead_from:
                    with open(a.step_overhead_from) as g:
                        prof["step_overhead_cpu_s"] = float(json.load(g)["step_overhead_cpu_s"])
                json.dump(prof, f)
            status = {"config": run["cluster_config"], "hosts": [None] * run["hosts"]}
            for row in run["rows"]:
                key = row["key"]
                if key not in table or not row.get("measured_s") or (a.strategies and key not in a.strategies.split(",")):
                    continue
                label, servers, flags = table[key]
                cluster = os.path.join(tmp, f"{name}_cluster{run['args']['workers'] + servers}.json")
                with open(cluster, "w") as f:
                    ra = argparse.Namespace(**{"ranks_per_host": 1, **run["args"]})
                    if a.tcp_two_way_factor is not None:
                        ra.tcp_two_way_factor = a.tcp_two_way_factor
                    if a.tcp_fanout_cv is not None:
                        ra.tcp_fanout_cv = a.tcp_fanout_cv
                    if a.tcp_fanout_corr is not None:
                        ra.tcp_fanout_corr = a.tcp_fanout_corr
                    f.write(cluster_json(ra, status, run["args"]["workers"] + servers, run.get("profile")))
                fed = key.startswith("fedavg")
                # runs 1-3's own `tandem simulate` had no --seed (the harness passes it from run 4 on)
                old_seedless = a.check_old and os.path.basename(path) in DEFAULT_RUNS
                sim = simulate(a.tandem, cluster, profile, flags, run["args"], fed, None if old_seedless else SEED)
                new = sim["step_time_s"]
                old = row.get("sim_predicted_s") or row["predicted_s"]
                m = row["measured_s"]
                if a.check_old and abs(new / old - 1) > 0.02:
                    bad.append(f"{name} {key}: recorded {old * 1e3:.2f} ms, recomputed {new * 1e3:.2f} ms")
                print(f"| {name} | {label} | {m * 1e3:.2f} ms | {old * 1e3:.2f} ms | {(old / m - 1) * 100:+.1f}% | "
                      f"{new * 1e3:.2f} ms | {(new / m - 1) * 100:+.1f}% |" + (step_split(row, sim) if a.split else ""),
                      flush=True)
    for b in bad:
        print("reconstruction differs:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
