#!/usr/bin/python3
"""Training throughput: Tandem vs PyTorch in the same run.

For each model (lenet5, resnet18, mobilenetv2, mlp) and thread count (1, 2): images/s of forward + backward +
SGD-momentum step at batch 64 on synthetic data of the model's usual input (1x28x28 for lenet5 and mlp, 3x32x32
otherwise), and the peak RSS of each run (every run is its own process). PyTorch runs the same architectures
(bench/train/torch_models.py); Tandem runs `tandem train --dataset synthetic` and reports the second (warm) epoch.

Usage: /usr/bin/python3 bench/train/bench_train.py [--tandem build/x/bin/tandem] [--models m1,m2] [--threads 1,2]
                                                   [--seconds 8] [--json]
Needs python3-torch (Debian's 1.13: apt-get install -y python3-torch). Results are only meaningful on a quiet
machine: the benchmark measures the load first and says whether it was.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

TORCH_CHILD = r"""
import sys, time, json, torch
sys.path.insert(0, %(here)r)
import torch_models
torch.set_num_threads(%(threads)d)
torch.manual_seed(0)
model, shape = torch_models.build(%(model)r)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.randn(%(batch)d, *shape)
y = torch.randint(0, 10, (%(batch)d,))
model.train()
def step():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
for _ in range(3):
    step()
n, t0 = 0, time.perf_counter()
while True:
    step()
    n += 1
    dt = time.perf_counter() - t0
    if dt >= %(seconds)f and n >= 5:
        break
print(json.dumps({"images_per_sec": n * %(batch)d / dt, "steps": n, "torch": torch.__version__,
                  "threads": torch.get_num_threads()}))
"""


def run_with_rss(cmd, env=None):
    """Runs cmd as a child and returns (stdout, peak RSS MiB) from wait4's rusage of exactly that child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        try:
            os.execvpe(cmd[0], cmd, env if env is not None else os.environ)
        finally:
            os._exit(127)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status, ru = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError("command failed (%d): %s" % (code, " ".join(cmd)))
    return b"".join(chunks).decode(), ru.ru_maxrss / 1024.0


def cpu_busy_fraction(seconds=2.0):
    """Fraction of all CPU time spent busy over `seconds` (from /proc/stat), before any benchmark runs."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]
        return sum(v), idle
    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def find_tandem(arg):
    if arg:
        return arg
    found = sorted(glob.glob(os.path.join(REPO, "build", "*", "bin", "tandem")), key=os.path.getmtime, reverse=True)
    if not found:
        sys.exit("bench_train: no tandem binary under build/*/bin; pass --tandem")
    return found[0]


def tandem_run(tandem, model, threads, batch, seconds_hint, ips_guess):
    # Two epochs of a fixed number of batches; the second is warm (primitives created, caches filled).
    batches = max(5, int(seconds_hint * ips_guess / batch))
    cmd = [tandem, "train", "--model", model, "--dataset", "synthetic", "--epochs", "2", "--batch", str(batch),
           "--lr", "0.01", "--momentum", "0.9", "--threads", str(threads), "--limit-batches", str(batches),
           "--train-limit", str(batch * batches), "--test-limit", str(batch), "--eval-limit-batches", "1", "--json"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out, rss = run_with_rss(cmd, env)
    epochs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return epochs[-1]["images_per_sec"], rss


def torch_run(model, threads, batch, seconds):
    code = TORCH_CHILD % {"here": HERE, "threads": threads, "model": model, "batch": batch, "seconds": seconds}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out, rss = run_with_rss(["/usr/bin/python3", "-c", code], env)
    return json.loads(out.strip().splitlines()[-1]), rss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem", default="")
    ap.add_argument("--models", default="lenet5,resnet18,mobilenetv2,mlp")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8.0, help="timed seconds per run (each side)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tandem = find_tandem(args.tandem)
    busy = cpu_busy_fraction()
    quiet = busy < 0.10
    note = ("machine quiet: %.0f%% CPU busy before the runs" % (100 * busy) if quiet else
            "WARNING: machine NOT quiet (%.0f%% CPU busy before the runs); OpenMP timings are unreliable" % (100 * busy))
    if not args.json:
        print(note)
        print("%-12s %3s  %12s %12s %7s   %10s %10s" % ("model", "thr", "tandem img/s", "torch img/s", "ratio",
                                                     "tandem RSS", "torch RSS"))
    rows = []
    for model in args.models.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            t, t_rss = torch_run(model, threads, args.batch, args.seconds)
            ips, rss = tandem_run(tandem, model, threads, args.batch, args.seconds, t["images_per_sec"])
            row = {"model": model, "threads": threads, "batch": args.batch, "tandem_images_per_sec": ips,
                   "torch_images_per_sec": t["images_per_sec"], "ratio": ips / t["images_per_sec"],
                   "tandem_peak_rss_mib": rss, "torch_peak_rss_mib": t_rss, "torch_version": t["torch"]}
            rows.append(row)
            if not args.json:
                print("%-12s %3d  %12.0f %12.0f %6.2fx   %8.0f MiB %6.0f MiB" % (
                    model, threads, ips, t["images_per_sec"], row["ratio"], rss, t_rss), flush=True)
    if args.json:
        print(json.dumps({"quiet": quiet, "cpu_busy_before": busy, "note": note, "results": rows}, indent=1))
    elif not quiet:
        print(note)


if __name__ == "__main__":
    main()
