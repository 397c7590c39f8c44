#!/usr/bin/python3
"""The same PyTorch DDP script (ddp.py) on the "tandem" backend and on gloo, side by side.

    bench/torch/run.py [--tandem build/default/bin/tandem] [--ranks 2,4] [--models lenet5,resnet18] [--repeats 2]

Every configuration runs under `tandem launch -n N` with both backends, alternating, --repeats times; the table shows
the best images/s of each (all ranks together) and tandem / gloo. Prints the CPU, the PyTorch version and threads.
Needs PyTorch for the Python that runs it (Debian: python3-torch) and the tandem package importable (PYTHONPATH is
set to bindings/python here).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_once(tandem, n, backend, model, steps, batch, transport):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1",
               TANDEM_TIMEOUT_MS="600000")
    if transport:
        env["TANDEM_TRANSPORT"] = transport
    cmd = [tandem, "launch", "-n", str(n), "--json", "--", sys.executable, os.path.join(HERE, "ddp.py"),
           "--backend", backend, "--model", model, "--steps", str(steps), "--batch", str(batch), "--warmup", "2"]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(cmd), p.stderr[-3000:]))
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return min(j["images_per_s"] for j in lines), lines[0]["torch"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tandem", default=shutil.which("tandem") or os.path.join(REPO, "build", "default", "bin", "tandem"))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--models", default="lenet5,resnet18")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--transport", default="", help="TANDEM_TRANSPORT for the tandem runs (default: auto)")
    ap.add_argument("--steps", default="lenet5=40,resnet18=6", help="timed steps per model")
    ap.add_argument("--batch", default="lenet5=64,resnet18=32", help="batch per rank per model")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    steps_of = dict((k, int(v)) for k, v in (kv.split("=") for kv in a.steps.split(",")))
    batch_of = dict((k, int(v)) for k, v in (kv.split("=") for kv in a.batch.split(",")))
    steps = {m: (steps_of[m], batch_of[m]) for m in steps_of}
    rows = []
    torch_version = "?"
    for model in a.models.split(","):
        for n in (int(x) for x in a.ranks.split(",")):
            best = {"tandem": 0.0, "gloo": 0.0}
            for _ in range(a.repeats):
                for backend in ("tandem", "gloo"):
                    ips, torch_version = run_once(a.tandem, n, backend, model, *steps[model], a.transport)
                    best[backend] = max(best[backend], ips)
            rows.append({"model": model, "ranks": n, "batch_per_rank": steps[model][1],
                         "tandem_images_per_s": best["tandem"], "gloo_images_per_s": best["gloo"],
                         "ratio": best["tandem"] / best["gloo"]})
            if not a.json:
                r = rows[-1]
                print("%-9s %d ranks  tandem %8.1f img/s  gloo %8.1f img/s  tandem/gloo %.2fx" %
                      (model, n, r["tandem_images_per_s"], r["gloo_images_per_s"], r["ratio"]), flush=True)
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch_version, "torch_threads_per_rank": 1,
            "tandem_transport": a.transport or "auto"}
    if a.json:
        print(json.dumps({"machine": info, "rows": rows}))
    else:
        print("CPU: %(cpu)s, %(cores)d cores; PyTorch %(torch)s, 1 thread per rank; tandem transport "
              "%(tandem_transport)s" % info)


if __name__ == "__main__":
    main()
