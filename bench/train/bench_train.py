#!/usr/bin/python3
"""Training throughput: Tandem vs PyTorch 2.x (and Debian's PyTorch 1.13) in the same run.

For each model (lenet5, resnet18, mobilenetv2, mlp) and thread count (1, 2): images/s of forward + backward +
SGD-momentum step at batch 64 on synthetic data of the model's usual input (1x28x28 for lenet5 and mlp, 3x32x32
otherwise), and the peak RSS of each run (every run is its own process). PyTorch runs the same architectures
(bench/train/torch_models.py); Tandem runs `tandem train --dataset synthetic` and reports the second (warm) epoch.

The primary peer is PyTorch 2.x from PyPI (MKL, oneDNN 3.x), the one a user would install, run by --torch2
(default /opt/torch2/bin/python, installed as ../shared/TESTBED.md says); the ratio column is Tandem over it.
Debian's python3-torch 1.13 (--torch1, default /usr/bin/python3) is a second column; --torch1 "" leaves it out.

Usage: python3 bench/train/bench_train.py [--tandem build/x/bin/tandem] [--models m1,m2] [--threads 1,2]
                                          [--seconds 8] [--torch2 PY] [--torch1 PY] [--json]
The CPU model, its vector ISA and the load average are printed beside the figures: machines differ (AVX-512 on
some, AVX2 only on others) and a busy 2-core machine slows 2-thread runs many-fold, so compare ratios from one
run on one machine.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

TORCH_CHILD = r"""
import contextlib, sys, time, json, torch
sys.path.insert(0, %(here)r)
import torch_models
torch.set_num_threads(%(threads)d)
torch.manual_seed(0)
dev = torch.device(%(device)r)
model, shape = torch_models.build(%(model)r, shape=%(shape)r)
model = model.to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.randn(%(batch)d, *shape, device=dev)
y = torch.randint(0, 10, (%(batch)d,), device=dev)
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
if dev.type == "cuda":  # the same arithmetic as Tandem's side: TF32 tensor cores on or off for both
    torch.backends.cudnn.allow_tf32 = %(tf32)s
    torch.backends.cuda.matmul.allow_tf32 = %(tf32)s
model.train()
amp = %(bf16)s and dev.type == "cuda"
def step():
    opt.zero_grad(set_to_none=True)
    # autocast only when asked: Debian's PyTorch 1.13 (no CUDA) refuses even a disabled bf16 "cuda" autocast
    with torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext():
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
for _ in range(%(warmup)d):
    step()
sync()
n, t0 = 0, time.perf_counter()
while True:
    step()
    n += 1
    if n %% 10 == 0 or dev.type != "cuda":
        sync()
    dt = time.perf_counter() - t0
    if dt >= %(seconds)f and n >= 5 and (n %% 10 == 0 or dev.type != "cuda"):
        break
print(json.dumps({"images_per_sec": n * %(batch)d / dt, "steps": n, "torch": torch.__version__,
                  "threads": torch.get_num_threads()}))
"""


def run_with_rss(cmd, env=None):
    """Runs cmd as a child and returns (stdout, peak RSS MiB) from wait4's rusage of exactly that child."""
    r, w = os.pipe()
    err = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        os.dup2(err.fileno(), 2)
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
        err.seek(0)
        tail = err.read().decode(errors="replace")[-2000:]
        raise RuntimeError("command failed (%d): %s\n%s" % (code, " ".join(cmd), tail))
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


def cpu_description():
    """CPU model and the vector ISA level PyTorch and oneDNN will use (from /proc/cpuinfo)."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    if "avx512f" in flags:
        extras = [n for f, n in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"), ("amx_tile", "AMX")) if f in flags]
        isa = "AVX-512" + ("" if not extras else " (" + ", ".join(extras) + ")")
    elif "avx2" in flags:
        isa = "AVX2" + ("+FMA" if "fma" in flags else "")
    else:
        isa = "SSE only"
    return "%s, %s, %d logical CPUs" % (model, isa, os.cpu_count() or 0)


def gpu_description():
    """The GPU's name, memory and driver (nvidia-smi), printed beside GPU figures."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        return out.splitlines()[0] if out else "no GPU reported by nvidia-smi"
    except (OSError, subprocess.SubprocessError):
        return "nvidia-smi not found"


def torch2_env(python):
    """The environment PyTorch 2.x's CUDA wheel needs to import without a GPU (../shared/TESTBED.md)."""
    env = dict(os.environ)
    site = glob.glob(os.path.join(os.path.dirname(os.path.dirname(python)), "lib", "python3*", "site-packages",
                                  "nvidia"))
    if site:
        libs = [os.path.join(site[0], d, "lib") for d in ("cu13", "nccl", "nvshmem")] + ["/usr/local/cuda/lib64"]
        env["LD_LIBRARY_PATH"] = ":".join([p for p in libs if os.path.isdir(p)] +
                                          [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p])
    return env


def input_shape(model):
    """The sample shape both sides train on (Tandem's synthetic data takes it through --input)."""
    return (1, 28, 28) if model in ("lenet5", "mlp") else (3, 32, 32)


def tandem_run(tandem, model, threads, batch, seconds_hint, ips_guess, device="cpu", tf32=False, precision="f32"):
    # Two epochs of a fixed number of batches; the second is warm (primitives created, caches filled).
    batches = max(5, int(seconds_hint * ips_guess / batch))
    cmd = [tandem, "train", "--device", device, "--precision", precision, "--model", model, "--input",
           "x".join(map(str, input_shape(model))), "--dataset", "synthetic", "--epochs", "2", "--batch", str(batch),
           "--lr", "0.01", "--momentum", "0.9", "--threads", str(threads), "--limit-batches", str(batches),
           "--train-limit", str(batch * batches), "--test-limit", str(batch), "--eval-limit-batches", "1", "--json"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TANDEM_CUDA_ALLOW_TF32="1" if tf32 else "0")
    out, rss = run_with_rss(cmd, env)
    epochs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return epochs[-1]["images_per_sec"], rss


def torch_run(python, env, model, threads, batch, seconds, device="cpu", tf32=False, precision="f32"):
    code = TORCH_CHILD % {"here": HERE, "threads": threads, "model": model, "batch": batch, "seconds": seconds,
                          "device": device, "warmup": 3 if device == "cpu" else 20, "tf32": bool(tf32),
                          "bf16": precision == "bf16",
                          "shape": input_shape(model)}
    env = dict(env, OMP_NUM_THREADS=str(threads))
    out, rss = run_with_rss([python, "-c", code], env)
    return json.loads(out.strip().splitlines()[-1]), rss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem", default="")
    ap.add_argument("--models", default="lenet5,resnet18,mobilenetv2,mlp")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8.0, help="timed seconds per run (each side)")
    ap.add_argument("--torch2", default="/opt/torch2/bin/python", help="python with PyTorch 2.x (the primary peer)")
    ap.add_argument("--torch1", default="/usr/bin/python3", help='python with Debian\'s PyTorch 1.13; "" for none')
    ap.add_argument("--device", default="cpu", help="cpu, or cuda[:N]: both sides train on that GPU (f32)")
    ap.add_argument("--tf32", type=int, default=0, choices=(0, 1),
                    help="cuda: 1 lets both sides use TF32 tensor cores for convolutions and GEMMs (PyTorch's own "
                         "default is on for cuDNN convolutions, off for GEMMs); 0, strict f32 on both")
    ap.add_argument("--precision", default="f32", choices=("f32", "bf16"),
                    help="cuda: bf16 trains Tandem with --precision bf16 (bf16 tensor-core convolutions and GEMMs, f32 "
                         "tensors) and PyTorch under torch.autocast(bfloat16) (bf16 activations too)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tandem = find_tandem(args.tandem)
    if not os.access(args.torch2, os.X_OK):
        sys.exit("bench_train: no PyTorch 2.x python at %s (install it as ../shared/TESTBED.md says, or pass --torch2)"
                 % args.torch2)
    peers = [("torch2", args.torch2, torch2_env(args.torch2))]
    if args.torch1:
        peers.append(("torch1", args.torch1, dict(os.environ)))
    cpu = cpu_description()
    if args.device != "cpu":
        cpu += "; device %s: %s; TF32 %s on both sides; precision %s" % (
            args.device, gpu_description(), "allowed" if args.tf32 else "off",
            "f32" if args.precision == "f32" else "bf16 (Tandem: bf16 math; PyTorch: autocast)")
    load_before = os.getloadavg()
    busy = cpu_busy_fraction()
    quiet = busy < 0.10
    note = ("machine quiet: %.0f%% CPU busy before the runs" % (100 * busy) if quiet else
            "WARNING: machine NOT quiet (%.0f%% CPU busy before the runs); timings are unreliable" % (100 * busy))
    if not args.json:
        print("CPU: %s" % cpu)
        print("load average before: %.2f %.2f %.2f; %s" % (load_before + (note,)))
        head = "%-12s %3s  %12s %12s %7s" % ("model", "thr", "tandem img/s", "torch2 img/s", "ratio")
        if len(peers) > 1:
            head += " %12s %7s" % ("torch1 img/s", "ratio")
        print(head + "   %10s %10s" % ("tandem RSS", "torch2 RSS"))
    rows = []
    for model in args.models.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            row = {"model": model, "threads": threads, "batch": args.batch}
            for name, python, env in peers:
                t, t_rss = torch_run(python, env, model, threads, args.batch, args.seconds, args.device, args.tf32,
                                     args.precision)
                row.update({name + "_images_per_sec": t["images_per_sec"], name + "_peak_rss_mib": t_rss,
                            name + "_version": t["torch"]})
            ips, rss = tandem_run(tandem, model, threads, args.batch, args.seconds, row["torch2_images_per_sec"],
                                  args.device, args.tf32, args.precision)
            row.update({"tandem_images_per_sec": ips, "tandem_peak_rss_mib": rss})
            for name, _, _ in peers:
                row["ratio_" + name] = ips / row[name + "_images_per_sec"]
            rows.append(row)
            if not args.json:
                line = "%-12s %3d  %12.0f %12.0f %6.2fx" % (model, threads, ips, row["torch2_images_per_sec"],
                                                          row["ratio_torch2"])
                if len(peers) > 1:
                    line += " %12.0f %6.2fx" % (row["torch1_images_per_sec"], row["ratio_torch1"])
                print(line + "   %6.0f MiB %6.0f MiB" % (rss, row["torch2_peak_rss_mib"]), flush=True)
    load_after = os.getloadavg()
    if args.json:
        print(json.dumps({"cpu": cpu, "quiet": quiet, "cpu_busy_before": busy, "load_before": load_before,
                          "load_after": load_after, "note": note, "results": rows}, indent=1))
    else:
        print("peers: %s; load average after: %.2f %.2f %.2f" % (
            ", ".join("%s = PyTorch %s" % (n, rows[0][n + "_version"]) for n, _, _ in peers) if rows else "-",
            *load_after))
        if not quiet:
            print(note)


if __name__ == "__main__":
    main()
