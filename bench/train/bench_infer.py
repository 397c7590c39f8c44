#!/usr/bin/env python3
"""Inference throughput (forward only, evaluation mode, one weight version) of a zoo model: Tandem through its
Python binding (tandem_model_forward) against PyTorch 2.x (model.eval(), torch.no_grad()), each in a process of
its own, at each batch size and thread count, optionally with both sides capped at an ISA (as bench_train.py:
TANDEM_CPU_MAX_ISA for Tandem, ATEN/MKL/oneDNN caps for PyTorch). This is where Tandem's kept Winograd weight
transforms (engine/compute/cpu: kept per weight version from its third use) matter: every forward after the third reuses
them, while a training step uses each version once per direction.

  flock /tmp/tandem-bench.lock python3 bench/train/bench_infer.py --lib build/default/lib/libtandem.so \\
      [--model resnet18] [--batches 64,1] [--threads 1,2] [--seconds 6] [--max-isa avx2] \\
      [--winograd auto,off] [--torch2 /opt/torch2/bin/python]

Prints one row per (cap, threads, batch): Tandem img/s for each TANDEM_CPU_WINOGRAD mode, PyTorch's, the ratio
of the first mode over PyTorch, and each side's peak RSS."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_train as bt  # noqa: E402  (caps, peer environment, RSS)

WORKER = r"""
import json, os, sys, time
import numpy as np
model, batch, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
shape = tuple(int(v) for v in sys.argv[4].split(","))
x = np.random.default_rng(0).standard_normal((batch,) + shape).astype(np.float32)
if sys.argv[5] == "tandem":
    from tandem import train as tandem
    m = tandem.Model(model, input_shape=shape, num_classes=10, seed=1)
    run = lambda: m.forward(x)
else:
    import torch, torch_models
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    m = torch_models.build(model, 10, shape)[0].eval()
    xt = torch.from_numpy(x)
    def run():
        with torch.no_grad():
            return m(xt)
for _ in range(2):
    run()
n, t0 = 0, time.perf_counter()
while True:
    run()
    n += 1
    dt = time.perf_counter() - t0
    if dt >= seconds and n >= 3:
        break
print(json.dumps({"ips": n * batch / dt, "calls": n}))
"""


def run_worker(python, env, args, model, batch, side):
    cmd = [python, "-c", WORKER, model, str(batch), str(args.seconds), ",".join(map(str, bt.input_shape(model))), side]
    out, rss = bt.run_with_rss(cmd, env=env)
    return json.loads(out.strip().splitlines()[-1])["ips"], rss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="libtandem.so to measure")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batches", default="64,1")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--max-isa", default="avx2", help="comma list of caps: avx2, avx512, sse41, all")
    ap.add_argument("--winograd", default="auto,off", help="TANDEM_CPU_WINOGRAD modes to run")
    ap.add_argument("--torch2", default="/opt/torch2/bin/python")
    args = ap.parse_args()
    lib = os.path.abspath(args.lib)
    bindings = os.path.join(HERE, "..", "..", "bindings", "python")
    modes = args.winograd.split(",")
    print("cpu: %s" % bt.cpu_description())
    print("tandem: %s; peer: PyTorch at %s" % (lib, args.torch2))
    head = "%-6s %3s %5s" % ("cap", "thr", "batch") + "".join(" %14s" % ("tandem %s" % m) for m in modes)
    print(head + " %12s %7s %12s %12s" % ("torch2 img/s", "ratio", "tandem RSS", "torch2 RSS"))
    rows = []
    for cap in args.max_isa.split(","):
        for threads in [int(t) for t in args.threads.split(",")]:
            for batch in [int(b) for b in args.batches.split(",")]:
                row = {"cap": cap, "threads": threads, "batch": batch}
                line = "%-6s %3d %5d" % (cap, threads, batch)
                for mode in modes:
                    env = bt.capped_env(dict(os.environ), cap, "tandem")
                    env.update({"TANDEM_LIBRARY": lib, "TANDEM_CPU_WINOGRAD": mode, "OMP_NUM_THREADS": str(threads),
                                "PYTHONPATH": os.path.abspath(bindings)})
                    ips, rss = run_worker(args.torch2, env, args, args.model, batch, "tandem")
                    row["tandem_" + mode] = ips
                    row.setdefault("tandem_rss_mib", rss)
                    line += " %14.1f" % ips
                env = bt.capped_env(bt.torch2_env(args.torch2), cap, "torch")
                env.update({"OMP_NUM_THREADS": str(threads), "PYTHONPATH": HERE})
                ips, rss = run_worker(args.torch2, env, args, args.model, batch, "torch")
                row.update({"torch2": ips, "torch2_rss_mib": rss})
                line += " %12.1f %6.2fx %8.0f MiB %8.0f MiB" % (ips, row["tandem_" + modes[0]] / ips,
                                                                 row["tandem_rss_mib"], rss)
                print(line, flush=True)
                rows.append(row)
    print(json.dumps({"model": args.model, "rows": rows}))


if __name__ == "__main__":
    main()
