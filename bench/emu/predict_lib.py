"""Shared by bench/emu/predict_bench.py and tests/emu/predict_emu_test.py (issue #6): Tandem jobs on an emulated
cluster (tools/emu-cluster), rank i on host i through `tandem launch --host-exec`, calibrated with `tandem calibrate`
on the hosts themselves and predicted by the simulator (`tandem train --predict`) for a cluster description that
matches the emulation.

The description: one custom node per emulated host with the host's memory limit (no OS reserve: the cgroup limit
is what the process gets), its link rate, and compute from the calibration profile -- measured on the emulated
hosts, so the CPU quota (0.5 core per t2.micro host; see the CPU caveat of tools/emu-cluster) is in the profile's
times rather than in the node's peak figures (which the roofline would use and the profile replaces).
"""
import argparse
import contextlib
import glob
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(REPO, "tools", "emu-cluster")


class NotReady(Exception):
    """The build at hand cannot run the benchmark (a subcommand or option is missing)."""


def find_tandem(explicit=None, need=("launch", "calibrate", "train"), need_train_flags=("--predict", "--strategy")):
    """The newest tandem binary (explicit, $TANDEM_BIN, build/*/bin/tandem) that has the subcommands and train flags
    needed; raises NotReady saying what is missing."""
    cands = [explicit] if explicit else []
    if os.environ.get("TANDEM_BIN"):
        cands.append(os.environ["TANDEM_BIN"])
    cands += sorted(glob.glob(os.path.join(REPO, "build", "*", "bin", "tandem")), key=os.path.getmtime, reverse=True)
    why = "no tandem binary (looked at --tandem, $TANDEM_BIN, build/*/bin/tandem)"
    for c in cands:
        if not (c and os.path.isfile(c) and os.access(c, os.X_OK)):
            continue
        h = subprocess.run([c, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
        missing = [s for s in need if not re.search(rf"^\s+{s}\s", h, re.M)]
        if not missing and "train" in need:
            th = subprocess.run([c, "train", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
            missing = [f"train {f}" for f in need_train_flags if f not in th]
        if not missing:
            return os.path.realpath(c)
        why = f"{c} lacks {', '.join(missing)}"
    raise NotReady(why)


def emu(args, check=True, timeout=120):
    p = subprocess.run([TOOL] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"emu-cluster {' '.join(args)} failed: {p.stderr.strip()}")
    return p


def cluster_status(name):
    return json.loads(emu(["status", "--name", name, "--json"]).stdout)


def cpu_snapshot(name):
    """For cpu_use: the machine's CPU counters (/proc/stat, in USER_HZ ticks) and the CPU seconds the cluster's
    hosts used (their cgroups), now."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    hosts = sum(h["cpu_seconds"] or 0.0 for h in cluster_status(name)["hosts"])
    return {"t": time.monotonic(), "ticks": v, "hosts_s": hosts}


def cpu_use(a, b):
    """CPU between two snapshots, in cores: the hosts' processes, every other process on the machine (`outside`:
    what could slow the hosts down besides their quotas), interrupts and softirqs (the emulated network's packet
    work), and steal (vCPU time the hypervisor gave to someone else)."""
    hz = os.sysconf("SC_CLK_TCK")
    wall = max(1e-9, b["t"] - a["t"])
    d = [(y - x) / hz / wall for x, y in zip(a["ticks"], b["ticks"])]
    user, nice, system, _idle, _iowait, irq, softirq, steal = d
    hosts = (b["hosts_s"] - a["hosts_s"]) / wall
    return {"hosts": hosts, "outside": max(0.0, user + nice + system - hosts), "irq": irq + softirq, "steal": steal}


def tbf_limit_bytes(rate_mbit, latency_ms):
    """The queue (bytes) emu-cluster gives a host's tbf for this rate and added one-way latency: its own
    tbf_args, so that the simulator is told the queue the emulated NIC really has."""
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader
    loader = SourceFileLoader("emu_cluster_tool", TOOL)
    mod = module_from_spec(spec_from_loader("emu_cluster_tool", loader))
    loader.exec_module(mod)
    args = mod.tbf_args(rate_mbit, latency_ms)
    return int(args[args.index("limit") + 1])


def cluster_description(status, hosts=None):
    """The simulator's cluster (JSON text) for an emulated cluster's `status --json`. A host's tbf is a FIFO
    (bfifo) of the tool's limit: `nic_queue_bytes` (the simulator's queue-at-the-sender model)."""
    cfg = status["config"]
    n = hosts or len(status["hosts"])
    node = {"name": f"emu-{cfg.get('preset') or 'host'}", "count": n, "vcpus": 1, "os_reserved_mib": 0,
            # Roofline figures are placeholders: with a calibration profile the compute comes from the profile.
            "peak_gflops": 20.0 * float(cfg.get("cpu_quota") or 1.0), "mem_gbps": 8}
    node["memory_mib"] = cfg["mem_mb"] if cfg.get("mem_mb") else 65536
    node["nic_mbps"] = cfg["bw_mbit"] if cfg.get("bw_mbit") else 10000
    # The bridge and veth pairs add tens of microseconds; the option adds its one-way delay on top.
    node["nic_latency_us"] = 50 + 1000.0 * float(cfg.get("latency_ms") or 0.0)
    if cfg.get("bw_mbit") and os.environ.get("TANDEM_SIM_NIC_QUEUE", "1") != "0":
        node["nic_queue_bytes"] = tbf_limit_bytes(cfg["bw_mbit"], float(cfg.get("latency_ms") or 0.0))
    return json.dumps({"nodes": [node], "topology": {"kind": "star"}})


# tcp by default: plain sockets driven by the caller, no I/O thread on the host's 0.5 core; as good as zmq or better
# through the emulated links (bench/emu/README.md, run 5). Not UCX (`auto` where it is built): it finds the
# emulated hosts on one machine and moves their bytes through shared memory, past the emulated links.
DEFAULT_TRANSPORT = "tcp"
TRANSPORTS = ("tcp", "zmq")


def launch_cmd(tandem, name, addr0, n, cmd, timeout_ms=120000, transport=DEFAULT_TRANSPORT):
    """Rank i on emulated host i, talking over `transport`."""
    return [tandem, "launch", "--transport", transport, "--host-exec", f"{TOOL} exec --name {name} {{rank}} --",
            "--master-addr", addr0, "--timeout-ms", str(timeout_ms), "-n", str(n), "--"] + cmd


def run_launch(tandem, name, addr0, n, cmd, timeout=600, env=None, transport=DEFAULT_TRANSPORT):
    """Runs cmd on hosts 0..n-1; returns (exit code, {rank: [lines]}, full output)."""
    p = subprocess.run(launch_cmd(tandem, name, addr0, n, cmd, transport=transport), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env)
    per_rank = {}
    for line in p.stdout.splitlines():
        m = re.match(r"^\[rank (\d+)\] (.*)$", line)
        if m:
            per_rank.setdefault(int(m.group(1)), []).append(m.group(2))
    return p.returncode, per_rank, p.stdout


def json_lines(lines, key=None):
    out = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if key is None or key in j:
            out.append(j)
    return out


def calibrate(tandem, name, addr0, n, model_args, batch, out, iters=8, threads=1, timeout=600,
              transport=DEFAULT_TRANSPORT):
    """`tandem calibrate` on hosts 0..n-1 at once (compute averaged over them, p2p between hosts 0 and 1); returns
    the summary rank 0 printed."""
    cmd = [tandem, "calibrate"] + model_args + ["--batch", str(batch), "--iters", str(iters), "--warmup", "2",
                                                "--threads", str(threads), "--out", out, "--json"]
    rc, per_rank, text = run_launch(tandem, name, addr0, n, cmd, timeout=timeout, transport=transport)
    got = json_lines(per_rank.get(0, []), "out")
    if rc != 0 or not got:
        raise RuntimeError(f"tandem calibrate failed (exit {rc}):\n{text[-3000:]}")
    return got[-1]


def train_predict(tandem, name, addr0, n, train_args, cluster, profile, timeout=900, transport=DEFAULT_TRANSPORT):
    """`tandem train ... --predict --json` on hosts 0..n-1; returns (prediction dict of rank 0, per-epoch dicts)."""
    cmd = [tandem, "train"] + train_args + ["--predict", "--predict-cluster", cluster, "--profile", profile,
                                            "--profile-network", "--json"]
    rc, per_rank, text = run_launch(tandem, name, addr0, n, cmd, timeout=timeout, transport=transport)
    pred = json_lines(per_rank.get(0, []), "prediction")
    if rc != 0 or not pred:
        raise RuntimeError(f"tandem train failed (exit {rc}):\n{text[-3000:]}")
    return pred[-1]["prediction"], json_lines(per_rank.get(0, []), "epoch")


# The scaffolding of the one-off probes in bench/strategies (ps_trace.py, asgd_trace.py, fanout_calibrate.py,
# ps_capture.py, compute_probe.py): their common flags, the root check, a cluster brought up and always down, and
# the JSON they leave.

def probe_args(doc, name_prefix, tandem=True, full_doc=False):
    """An argument parser with the probes' common flags: --tandem (the binary; find_tandem's search without it),
    --name (the emulated cluster's name: name_prefix and this process's id, so that two probes never share one) and
    --json (where the results go). The description is the docstring's first paragraph, or all of it."""
    if full_doc:
        ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if tandem:
        ap.add_argument("--tandem", help="the tandem binary (default: $TANDEM_BIN, then the newest build/*/bin/tandem)")
    ap.add_argument("--name", default=f"{name_prefix}{os.getpid() % 100000}", help="the emulated cluster's name")
    ap.add_argument("--json", help="write the results here")
    return ap


def is_root(prog, needs="network namespaces, cgroups"):
    """True as root; otherwise says why `prog` did not run (the caller then exits 77, CTest's skip)."""
    if os.geteuid() == 0:
        return True
    print(f"{prog}: needs root ({needs}); not run", file=sys.stderr)
    return False


@contextlib.contextmanager
def emu_cluster(name, hosts, preset="t2.micro", up_args=()):
    """`emu-cluster up` of `hosts` hosts, yielding its `status --json`; brought down on every exit."""
    try:
        emu(["up", "--name", name, "--hosts", str(hosts), "--preset", preset] + list(up_args), timeout=300)
        yield cluster_status(name)
    finally:
        emu(["down", "--name", name], check=False, timeout=300)


def probe_results(a):
    """The record a probe starts: its arguments and the machine's load averages now (write_probe_results adds the
    load at the end)."""
    return {"args": vars(a), "load_start": os.getloadavg()}


def write_probe_results(res, path):
    """Adds the load averages at the end and writes res to path as JSON (nothing without a path)."""
    res["load_end"] = os.getloadavg()
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
