#!/usr/bin/python3
"""The same PyTorch DDP script (ddp.py) on the "tandem" backend and on gloo, side by side.

    bench/torch/run.py [--tandem build/default/bin/tandem] [--ranks 2,4] [--models lenet5,resnet18] [--repeats 2]
                       [--pythons /opt/torch2/bin/python,/usr/bin/python3]

Every configuration runs under `tandem launch -n N` with both backends, alternating, --repeats times, once per Python
of --pythons (default: PyTorch 2.x from /opt/torch2 first when it is there, then Debian's 1.13); the table shows the
best images/s of each (all ranks together) and tandem / gloo, with the PyTorch version and tandem.torch's
implementation (cpp or python; TANDEM_TORCH_IMPL picks it). Prints the CPU and the load average before and after.

    bench/torch/run.py --emu 4:65 [--emu-quota 0.5] ...     (root: tools/emu-cluster)

runs rank i on emulated host i (its own network namespace, a `tbf` link of MBIT Mbit/s, optionally `:DELAY_MS` of
one-way delay, and a CFS quota of --emu-quota cores) instead of on this host's loopback: the case where
communication matters. --ranks must then equal the host count.
The tandem package must be importable (PYTHONPATH is set to bindings/python here).
"""
import argparse
import contextlib
import glob
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


def torch_env(python):
    """A PyPI torch wheel's bundled NVIDIA libraries on the loader path (it imports them even on a CPU-only run)."""
    env = dict(os.environ)
    site = glob.glob(os.path.join(os.path.dirname(os.path.dirname(python)), "lib", "python3*", "site-packages"))
    libs = sorted(glob.glob(os.path.join(site[0], "nvidia", "*", "lib"))) if site else []
    libs += [d for d in ("/usr/local/cuda/lib64",) if os.path.isdir(d)]
    if libs:
        env["LD_LIBRARY_PATH"] = ":".join(libs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    return env


def impl_of(python):
    """Which tandem.torch implementation `python` gets (building the C++ one once, before any timing)."""
    env = dict(torch_env(python), PYTHONPATH=os.path.join(REPO, "bindings", "python"))
    p = subprocess.run([python, "-c", "import tandem.torch as t; print(t.IMPL)"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit("%s cannot import tandem.torch:\n%s" % (python, p.stderr[-3000:]))
    return p.stdout.strip().splitlines()[-1]


EMU_TOOL = os.path.join(REPO, "tools", "emu-cluster")


class EmuCluster:
    """`--emu HOSTS:MBIT[:DELAY_MS]`: hosts brought up for the run and always brought down."""

    def __init__(self, spec, quota, name):
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise SystemExit("--emu takes HOSTS:MBIT[:DELAY_MS], got %r" % spec)
        self.hosts, self.mbit = int(parts[0]), float(parts[1])
        self.delay_ms = float(parts[2]) if len(parts) == 3 else 0.0
        self.quota, self.name = quota, name

    def __enter__(self):
        subprocess.run([EMU_TOOL, "down", "--name", self.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cmd = [EMU_TOOL, "up", "--name", self.name, "--hosts", str(self.hosts), "--bw-mbit", str(self.mbit),
               "--cpu-quota", str(self.quota)]
        if self.delay_ms:
            cmd += ["--latency-ms", str(self.delay_ms)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=300)
        self.addr0 = subprocess.run([EMU_TOOL, "addr", "--name", self.name, "0"], check=True, stdout=subprocess.PIPE,
                                    text=True).stdout.strip()
        return self

    def __exit__(self, *exc):
        subprocess.run([EMU_TOOL, "down", "--name", self.name], stdout=subprocess.DEVNULL, timeout=300)

    def launch_args(self):
        return ["--host-exec", "%s exec --name %s {rank} --" % (EMU_TOOL, self.name), "--master-addr", self.addr0]

    def describe(self):
        return "%d emulated hosts, %g Mbit/s%s, %g core each" % (
            self.hosts, self.mbit, " + %g ms one-way" % self.delay_ms if self.delay_ms else "", self.quota)


def run_once(python, tandem, n, backend, model, steps, batch, transport, emu=None):
    env = dict(torch_env(python), PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1",
               TANDEM_TIMEOUT_MS="600000")
    if transport:
        env["TANDEM_TRANSPORT"] = transport
    launch = [tandem, "launch", "-n", str(n), "--json"]
    if emu:
        launch += emu.launch_args()
        env["GLOO_SOCKET_IFNAME"] = "eth0"  # the emulated host's link, not its loopback
    cmd = launch + ["--", python, os.path.join(HERE, "ddp.py"),
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
    ap.add_argument("--transport", default="", help="TANDEM_TRANSPORT for the tandem runs (default: tcp)")
    ap.add_argument("--steps", default="lenet5=40,resnet18=6", help="timed steps per model")
    ap.add_argument("--batch", default="lenet5=64,resnet18=32", help="batch per rank per model")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--emu", default="", help="HOSTS:MBIT[:DELAY_MS]: run on emulated hosts (root; see above)")
    ap.add_argument("--emu-quota", type=float, default=0.5, help="CPU quota per emulated host, cores")
    ap.add_argument("--emu-name", default="tb%d" % os.getpid())
    ap.add_argument("--pythons", default=",".join(p for p in ("/opt/torch2/bin/python", "/usr/bin/python3")
                                                  if os.path.exists(p)) or sys.executable,
                    help="interpreters with PyTorch, comma-separated; the first is the primary column")
    a = ap.parse_args()
    steps_of = dict((k, int(v)) for k, v in (kv.split("=") for kv in a.steps.split(",")))
    batch_of = dict((k, int(v)) for k, v in (kv.split("=") for kv in a.batch.split(",")))
    steps = {m: (steps_of[m], batch_of[m]) for m in steps_of}
    pythons = a.pythons.split(",")
    impls = {py: impl_of(py) for py in pythons}
    emu = EmuCluster(a.emu, a.emu_quota, a.emu_name) if a.emu else None
    if emu and any(int(x) != emu.hosts for x in a.ranks.split(",")):
        raise SystemExit("--emu %s: --ranks must be %d (one rank per emulated host)" % (a.emu, emu.hosts))
    load_before = os.getloadavg()
    rows = []
    with contextlib.ExitStack() as stack:
        if emu:
            stack.enter_context(emu)
        run_all(a, steps, pythons, impls, emu, rows)
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads_per_rank": 1,
            "tandem_transport": a.transport or "tcp", "load_before": "%.1f %.1f %.1f" % load_before,
            "load_after": "%.1f %.1f %.1f" % os.getloadavg(), "hosts": emu.describe() if emu else "this host, loopback"}
    if a.json:
        print(json.dumps({"machine": info, "rows": rows}))
    else:
        print("CPU: %(cpu)s, %(cores)d cores; ranks on %(hosts)s; 1 torch thread per rank; tandem transport "
              "%(tandem_transport)s; load average (1, 5, 15 min) before %(load_before)s, after %(load_after)s" % info)


def run_all(a, steps, pythons, impls, emu, rows):
    for model in a.models.split(","):
        for n in (int(x) for x in a.ranks.split(",")):
            for py in pythons:
                best = {"tandem": 0.0, "gloo": 0.0}
                version = "?"
                for _ in range(a.repeats):
                    for backend in ("tandem", "gloo"):
                        ips, version = run_once(py, a.tandem, n, backend, model, *steps[model], a.transport, emu)
                        best[backend] = max(best[backend], ips)
                rows.append({"model": model, "ranks": n, "batch_per_rank": steps[model][1], "torch": version,
                             "impl": impls[py], "timed_steps": steps[model][0],
                             "tandem_images_per_s": best["tandem"], "gloo_images_per_s": best["gloo"],
                             "ratio": best["tandem"] / best["gloo"]})
                if not a.json:
                    r = rows[-1]
                    print("%-9s %d ranks  torch %-14s (%-6s)  tandem %8.1f img/s  gloo %8.1f img/s  tandem/gloo "
                          "%.2fx" % (model, n, r["torch"], r["impl"], r["tandem_images_per_s"],
                                     r["gloo_images_per_s"], r["ratio"]), flush=True)


if __name__ == "__main__":
    main()
