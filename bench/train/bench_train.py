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
                                          [--seconds 8] [--torch2 PY] [--torch1 PY] [--max-isa avx2,all] [--json]
The CPU model, its vector ISA and the load average are printed beside the figures: machines differ (AVX-512 on
some, AVX2 only on others) and a busy 2-core machine slows 2-thread runs many-fold, so compare ratios from one
run on one machine.

--max-isa caps the vector ISA of both sides, so an AVX-512 machine also measures the AVX2 code paths (same
clocks and caches, AVX2 instructions only): Tandem through TANDEM_CPU_MAX_ISA, PyTorch through
ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA and DNNL_MAX_CPU_ISA (oneDNN 2.x). A list
(avx2,all) runs every model under each cap, rows side by side; "all" is uncapped (those variables removed).
Before the rows of a cap, each side is probed and the ISA it really ran is printed: Tandem's own report
(tandem train's cpu_isa) and oneDNN's verbose "isa:" line; PyTorch's ATen capability, oneDNN's "isa:" line and,
where perf exists, which MKL SGEMM kernel family (mkl_blas_avx2_* / mkl_blas_avx512_*) a GEMM spends its time
in. Tandem's report is checked on every timed run too.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

TORCH_CHILD = r"""
import contextlib, sys, time, json, torch
%(capability)s
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
amp = %(amp)r if dev.type == "cuda" else ""
# fp16: autocast(float16) with GradScaler's dynamic loss scaling, as a user writes it (Tandem: --precision fp16)
scaler = None
if amp == "fp16":
    scaler = torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()
def step():
    opt.zero_grad(set_to_none=True)
    # autocast only when asked: Debian's PyTorch 1.13 (no CUDA) refuses even a disabled bf16 "cuda" autocast
    with torch.autocast("cuda", dtype=torch.bfloat16 if amp == "bf16" else torch.float16) if amp else contextlib.nullcontext():
        loss = loss_fn(model(x), y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
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
                  "threads": torch.get_num_threads(), "capability": aten_capability()}))
"""

# ATen's CPU capability (torch.backends.cpu in 2.x; 1.13 only states it in its build summary).
CAPABILITY = r"""
def aten_capability():
    import torch
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        for line in torch.__config__.show().splitlines():
            if "CPU capability usage:" in line:
                return line.split(":", 1)[1].strip()
    return "unknown"
"""

# A probe of the ISAs a PyTorch really runs: ATen's capability, and oneDNN's "isa:" line from one training step
# of a small convolution net under ONEDNN_VERBOSE / DNNL_VERBOSE.
TORCH_PROBE = CAPABILITY + r"""
import json, torch
torch.set_num_threads(1)
c = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 14 * 14, 10))
c(torch.randn(8, 16, 16, 16)).sum().backward()
print(json.dumps({"capability": aten_capability(), "torch": torch.__version__}))
"""

# A GEMM loop for perf: which MKL kernel family a PyTorch's SGEMM runs (MKL states no ISA on AMD CPUs).
TORCH_GEMM = r"""
import time, torch
torch.set_num_threads(1)
a, b = torch.randn(512, 512), torch.randn(512, 512)
t = time.perf_counter()
while time.perf_counter() - t < 1.5:
    a @ b
"""

# The environment each side gets under a cap. "all" removes every one of these variables.
TANDEM_CAP_VARS = ("TANDEM_CPU_MAX_ISA",)
TORCH_CAP_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
TORCH_CAPS = {
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512",
               "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX", "DNNL_MAX_CPU_ISA": "AVX512_CORE_AMX"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "DNNL_MAX_CPU_ISA": "AVX2"},
    "sse41": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41",
              "DNNL_MAX_CPU_ISA": "SSE41"},
}


def capped_env(env, cap, side):
    """env with side's ("tandem" or "torch") ISA cap variables set for cap, or all removed for "all"."""
    env = {k: v for k, v in env.items() if k not in TANDEM_CAP_VARS + TORCH_CAP_VARS}
    if cap == "all":
        return env
    if side == "tandem":
        env["TANDEM_CPU_MAX_ISA"] = cap
    else:
        env.update(TORCH_CAPS[cap])
    return env


def onednn_isa_line(text):
    """oneDNN's verbose "isa:" statement ("Intel AVX2", ...) in text, or "not reported"."""
    for line in text.splitlines():
        if ("onednn_verbose" in line or "dnnl_verbose" in line) and ",isa:" in line:
            return line.split(",isa:", 1)[1].strip()
    return "not reported"


def mkl_kernel_family(python, env):
    """The MKL symbol a 512x512 SGEMM loop spends most samples in (perf), e.g. mkl_blas_avx2_sgemm_kernel_0."""
    perf = shutil.which("perf")
    if not perf:
        return "perf not found"
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "perf.data")
        rec = subprocess.run([perf, "record", "-q", "-F", "499", "-o", data, "--", python, "-c", TORCH_GEMM], env=env,
                             capture_output=True, text=True, timeout=120)
        if rec.returncode != 0:
            return "perf record failed"
        rep = subprocess.run([perf, "report", "-i", data, "--stdio", "--sort", "sym", "--percent-limit", "2"],
                             capture_output=True, text=True, timeout=120).stdout
    for line in rep.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].endswith("%") and parts[-1].startswith("mkl_"):
            return "%s (%s of samples)" % (parts[-1], parts[0])
    return "no MKL symbol above 2% of samples"


def probe_torch(name, python, env, cap):
    """What a PyTorch peer really runs under cap: ATen capability, oneDNN isa, MKL kernel family (torch2)."""
    env = dict(capped_env(env, cap, "torch"), ONEDNN_VERBOSE="1", DNNL_VERBOSE="1", OMP_NUM_THREADS="1")
    out = subprocess.run([python, "-c", TORCH_PROBE], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("probe of %s failed: %s" % (name, out.stderr[-2000:]))
    info = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])
    info["onednn_isa"] = onednn_isa_line(out.stdout)
    if name == "torch2":
        gemm_env = {k: v for k, v in env.items() if k not in ("ONEDNN_VERBOSE", "DNNL_VERBOSE")}
        info["mkl_sgemm"] = mkl_kernel_family(python, gemm_env)
    return info


def probe_tandem(tandem, cap):
    """Tandem's report of its ISAs under cap (tandem train's cpu_isa) and oneDNN 2.6's verbose isa line."""
    cmd = [tandem, "train", "--model", "lenet5", "--input", "1x28x28", "--dataset", "synthetic", "--epochs", "1",
           "--batch", "8", "--threads", "1", "--limit-batches", "1", "--train-limit", "8", "--test-limit", "8",
           "--eval-limit-batches", "1", "--json"]
    env = dict(capped_env(dict(os.environ), cap, "tandem"), DNNL_VERBOSE="1", ONEDNN_VERBOSE="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("probe of tandem failed: %s" % out.stderr[-2000:])
    info = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1]).get("cpu_isa", {})
    info["onednn_isa"] = onednn_isa_line(out.stdout)
    return info


def expected_tandem_isa(cap, host):
    """The kernel variant Tandem must report under cap on a host whose best level is host."""
    order = ["baseline", "avx2", "avx512"]
    want = {"all": "avx512", "avx512": "avx512", "avx2": "avx2", "sse41": "baseline"}[cap]
    return order[min(order.index(want), order.index(host))]


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


def host_isa_level():
    """The best level of Tandem's kernels this CPU runs: avx512, avx2 or baseline (from /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "baseline"
    except OSError:
        pass
    return "baseline"


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


def tandem_run(tandem, model, threads, batch, seconds_hint, ips_guess, device="cpu", tf32=False, precision="f32",
               cap="all", want_isa=None):
    # Two epochs of a fixed number of batches; the second is warm (primitives created, caches filled).
    batches = max(5, int(seconds_hint * ips_guess / batch))
    cmd = [tandem, "train", "--device", device, "--precision", precision, "--model", model, "--input",
           "x".join(map(str, input_shape(model))), "--dataset", "synthetic", "--epochs", "2", "--batch", str(batch),
           "--lr", "0.01", "--momentum", "0.9", "--threads", str(threads), "--limit-batches", str(batches),
           "--train-limit", str(batch * batches), "--test-limit", str(batch), "--eval-limit-batches", "1", "--json"]
    env = dict(capped_env(dict(os.environ), cap, "tandem"), OMP_NUM_THREADS=str(threads),
               TANDEM_CUDA_ALLOW_TF32="1" if tf32 else "0")
    out, rss = run_with_rss(cmd, env)
    epochs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    got = epochs[-1].get("cpu_isa", {}).get("kernels")
    if want_isa is not None and device == "cpu" and got != want_isa:
        raise RuntimeError("tandem ran kernels %s under cap %s, not %s" % (got, cap, want_isa))
    return epochs[-1]["images_per_sec"], rss


def torch_run(python, env, model, threads, batch, seconds, device="cpu", tf32=False, precision="f32", cap="all"):
    code = TORCH_CHILD % {"here": HERE, "capability": CAPABILITY, "threads": threads, "model": model, "batch": batch, "seconds": seconds,
                          "device": device, "warmup": 3 if device == "cpu" else 20, "tf32": bool(tf32),
                          "amp": "" if precision == "f32" else precision,
                          "shape": input_shape(model)}
    env = dict(capped_env(env, cap, "torch"), OMP_NUM_THREADS=str(threads))
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
    ap.add_argument("--precision", default="f32", choices=("f32", "bf16", "fp16"),
                    help="cuda: bf16 trains Tandem with --precision bf16 (bf16 tensor-core convolutions and GEMMs, f32 "
                         "tensors) and PyTorch under torch.autocast(bfloat16) (bf16 activations too); fp16 the same "
                         "in half precision, both sides with dynamic loss scaling (PyTorch: GradScaler)")
    ap.add_argument("--max-isa", default="all",
                    help="comma list of vector ISA caps for both sides, each a set of rows: all (uncapped), avx512, "
                         "avx2, sse41 (e.g. avx2,all: the AVX2 code paths, and the uncapped ones beside them)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    caps = args.max_isa.split(",")
    for cap in caps:
        if cap not in ("all", "avx512", "avx2", "sse41"):
            sys.exit("bench_train: --max-isa %r: each cap must be all, avx512, avx2 or sse41" % cap)
    if args.device == "cpu" and args.precision != "f32":
        sys.exit("bench_train: --precision %s needs --device cuda (on a CPU Tandem's fp16 is an emulation and "
                 "PyTorch's CPU autocast is another thing)" % args.precision)
    if args.device != "cpu" and caps != ["all"]:
        sys.exit("bench_train: --max-isa applies to --device cpu only")
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
            "f32" if args.precision == "f32" else "%s (Tandem: %s math%s; PyTorch: autocast%s)" % (
                args.precision, args.precision, ", dynamic loss scaling" if args.precision == "fp16" else "",
                " + GradScaler" if args.precision == "fp16" else ""))
    load_before = os.getloadavg()
    busy = cpu_busy_fraction()
    quiet = busy < 0.10
    note = ("machine quiet: %.0f%% CPU busy before the runs" % (100 * busy) if quiet else
            "WARNING: machine NOT quiet (%.0f%% CPU busy before the runs); timings are unreliable" % (100 * busy))
    if not args.json:
        print("CPU: %s" % cpu)
        print("load average before: %.2f %.2f %.2f; %s" % (load_before + (note,)))
    # What each side really runs under each cap, probed before the timed rows.
    host = host_isa_level()
    probes = {}
    if args.device == "cpu" and caps != ["all"]:
        for cap in caps:
            p = {"tandem": probe_tandem(tandem, cap)}
            for name, python, env in peers:
                p[name] = probe_torch(name, python, env, cap)
            probes[cap] = p
            if not args.json:
                t = p["tandem"]
                print("cap %s (%s): tandem: kernels %s, oneDNN %s (verbose isa: %s)" % (
                    cap, "uncapped" if cap == "all" else "TANDEM_CPU_MAX_ISA=%s; peers: %s" % (
                        cap, " ".join("%s=%s" % kv for kv in TORCH_CAPS[cap].items())),
                    t.get("kernels"), t.get("onednn"), t["onednn_isa"]))
                for name, _, _ in peers:
                    q = p[name]
                    print("    %s (PyTorch %s): ATen %s, oneDNN isa: %s%s" % (
                        name, q["torch"], q["capability"], q["onednn_isa"],
                        ", MKL SGEMM in " + q["mkl_sgemm"] if "mkl_sgemm" in q else
                        (", BLAS: %s" % "Debian's reference BLAS (baseline x86-64 code; no cap applies)"
                         if name == "torch1" else "")))
    if not args.json:
        head = "%-12s %3s  %12s %12s %7s" % ("model", "thr", "tandem img/s", "torch2 img/s", "ratio")
        if caps != ["all"]:
            head = "%-6s " % "cap" + head
        if len(peers) > 1:
            head += " %12s %7s" % ("torch1 img/s", "ratio")
        print(head + "   %10s %10s" % ("tandem RSS", "torch2 RSS"))
    rows = []
    for model in args.models.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            for cap in caps:
                row = {"model": model, "threads": threads, "batch": args.batch, "max_isa": cap}
                for name, python, env in peers:
                    t, t_rss = torch_run(python, env, model, threads, args.batch, args.seconds, args.device, args.tf32,
                                         args.precision, cap)
                    row.update({name + "_images_per_sec": t["images_per_sec"], name + "_peak_rss_mib": t_rss,
                                name + "_version": t["torch"], name + "_capability": t.get("capability")})
                want = expected_tandem_isa(cap, host) if caps != ["all"] else None
                ips, rss = tandem_run(tandem, model, threads, args.batch, args.seconds, row["torch2_images_per_sec"],
                                      args.device, args.tf32, args.precision, cap, want)
                row.update({"tandem_images_per_sec": ips, "tandem_peak_rss_mib": rss})
                for name, _, _ in peers:
                    row["ratio_" + name] = ips / row[name + "_images_per_sec"]
                rows.append(row)
                if not args.json:
                    line = "%-12s %3d  %12.0f %12.0f %6.2fx" % (model, threads, ips, row["torch2_images_per_sec"],
                                                              row["ratio_torch2"])
                    if caps != ["all"]:
                        line = "%-6s " % cap + line
                    if len(peers) > 1:
                        line += " %12.0f %6.2fx" % (row["torch1_images_per_sec"], row["ratio_torch1"])
                    print(line + "   %6.0f MiB %6.0f MiB" % (rss, row["torch2_peak_rss_mib"]), flush=True)
    load_after = os.getloadavg()
    if args.json:
        print(json.dumps({"cpu": cpu, "quiet": quiet, "cpu_busy_before": busy, "load_before": load_before,
                          "load_after": load_after, "note": note, "max_isa": caps, "probes": probes,
                          "results": rows}, indent=1))
    else:
        print("peers: %s; load average after: %.2f %.2f %.2f" % (
            ", ".join("%s = PyTorch %s" % (n, rows[0][n + "_version"]) for n, _, _ in peers) if rows else "-",
            *load_after))
        if not quiet:
            print(note)


if __name__ == "__main__":
    main()
