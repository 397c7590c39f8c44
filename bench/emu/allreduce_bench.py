#!/usr/bin/python3
"""Allreduce on an emulated cluster of t2.micro hosts, against the link-bound time 2(n-1)/n * S/B.

  bench/emu/allreduce_bench.py [--hosts 4] [--preset t2.micro] [--bw-mbit R] [--latency-ms L]
                               [--sizes 1M,4M,16M] [--iters 3] [--tandem PATH] [--transport tcp[,zmq]]
                               [--no-tandem] [--no-ring] [-- CMD...]

Brings up the cluster (tools/emu-cluster, name emub<pid>), then:
  1. link check: TCP goodput host 0 -> host 1 (bench/../tests/emu/netprobe.py);
  2. ring: a plain Python/numpy ring allreduce over TCP, one process per host (bench/emu/ring_allreduce.py):
     what the emulated links allow, independent of Tandem's library (placed by `tandem launch
     --host-exec` when a tandem binary with `launch` exists, else by one `emu-cluster exec` per host);
  3. tandem: `tandem launch --host-exec 'tools/emu-cluster exec --name NAME {rank} --' --master-addr
     <host 0> -n N -- tandem bench allreduce --json ...`, rank i on emulated host i;
  4. with `-- CMD...`: CMD instead of `tandem bench allreduce`, through the same launcher (output streamed).
Prints one table: size, measured median time (slowest rank), link-bound time, efficiency = bound/measured.
B is the configured link rate; TCP over Ethernet carries at most 1448/1514 = 95.6% of it as payload, so
that is the ceiling of the efficiency. The cluster is always torn down. Needs root.
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(REPO, "tools", "emu-cluster")
PROBE = os.path.join(REPO, "tests", "emu", "netprobe.py")
RING = os.path.join(HERE, "ring_allreduce.py")
PY = "/usr/bin/python3"
PAYLOAD_FRACTION = 1448 / 1514


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def find_tandem(explicit):
    """(path, has `bench`, why not found): the newest tandem binary that has `launch`."""
    cands = [explicit] if explicit else []
    if os.environ.get("TANDEM_BIN"):
        cands.append(os.environ["TANDEM_BIN"])
    cands += sorted(glob.glob(os.path.join(REPO, "build", "*", "bin", "tandem")), key=os.path.getmtime, reverse=True)
    for c in cands:
        if not (os.path.isfile(c) and os.access(c, os.X_OK)):
            continue
        h = subprocess.run([c, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if re.search(r"^\s+launch\s", h.stdout, re.M):
            return os.path.realpath(c), bool(re.search(r"^\s+bench\s", h.stdout, re.M)), None
    return None, False, "no tandem binary with `launch` (looked at --tandem, $TANDEM_BIN, build/*/bin/tandem)"


def emu(args, check=True, timeout=120):
    p = subprocess.run([TOOL] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"emu-cluster {' '.join(args)} failed: {p.stderr.strip()}")
    return p


def exec_cmd(name, host, cmd):
    return [TOOL, "exec", "--name", name, str(host), "--"] + cmd


def link_check(name, addrs):
    rx = subprocess.Popen(exec_cmd(name, 1, [PY, PROBE, "tcp-recv", "6000", "4", "1"]), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)
    subprocess.run(exec_cmd(name, 0, [PY, PROBE, "tcp-send", addrs[1], "6000", "4.3"]), timeout=30,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out, _ = rx.communicate(timeout=30)
    try:
        return json.loads(out)["mbit"]
    except (ValueError, KeyError):
        return None


def ring_rows(outputs):
    """Rows from every rank's JSON lines: per iteration the slowest rank, then the median."""
    per_rank = [[json.loads(line) for line in out] for out in outputs]
    rows = []
    for k in range(len(per_rank[0])):
        times = [max(r[k]["times_s"][j] for r in per_rank) for j in range(len(per_rank[0][k]["times_s"]))]
        rows.append({"bytes": per_rank[0][k]["bytes"], "time_s": statistics.median(times),
                     "wrong": sum(r[k]["wrong"] for r in per_rank)})
    return rows


def run_ring(name, addrs, sizes, iters, tandem=None):
    """The Python ring on every host: through `tandem launch --host-exec` when a launcher is there (the
    same placement Tandem's own runs get), else one `emu-cluster exec` per host."""
    ring = [PY, RING, "--addrs", ",".join(addrs), "--sizes", sizes, "--iters", str(iters)]
    if tandem:
        p = subprocess.run(launcher_cmd(tandem, name, addrs[0], len(addrs), ring), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"ring allreduce through tandem launch failed (exit {p.returncode}):\n{p.stdout[-3000:]}")
        outs = [[] for _ in addrs]
        for line in p.stdout.splitlines():
            m = re.match(r"^\[rank (\d+)\] (\{.*\})\s*$", line)
            if m:
                outs[int(m.group(1))].append(m.group(2))
        what = "ring (python, launch)"
    else:
        procs = [subprocess.Popen(exec_cmd(name, i, ring + ["--rank", str(i)]), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(len(addrs))]
        outs = []
        for i, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"ring allreduce rank {i} timed out")
            if p.returncode != 0:
                raise RuntimeError(f"ring allreduce rank {i} failed (exit {p.returncode}): {err.strip()[-2000:]}")
            outs.append([line for line in out.splitlines() if line.startswith("{")])
        what = "ring (python, exec)"
    if any(not o for o in outs):
        raise RuntimeError(f"ring allreduce: no result from ranks {[i for i, o in enumerate(outs) if not o]}")
    return [dict(r, what=what) for r in ring_rows(outs)]


def launcher_cmd(tandem, name, addr0, n, cmd):
    return [tandem, "launch", "--host-exec", f"{TOOL} exec --name {name} {{rank}} --", "--master-addr", addr0,
            "-n", str(n), "--"] + cmd


def run_tandem(tandem, name, addrs, sizes, iters, transport):
    cmd = [tandem, "bench", "allreduce", "--sizes", sizes, "--iters", str(iters), "--warmup", "1", "--json",
           "--transport", transport, "--timeout-ms", "300000"]
    p = subprocess.run(launcher_cmd(tandem, name, addrs[0], len(addrs), cmd), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900)
    rows = []
    for line in p.stdout.splitlines():
        m = re.match(r"^(\[rank 0\] )?(\{.*\})\s*$", line)
        if m:
            j = json.loads(m.group(2))
            rows.append({"bytes": j["bytes"], "time_s": j["time_us"] * 1e-6, "wrong": j.get("wrong", 0),
                         "what": f"tandem {j.get('algo', '?')}/{j.get('transport', transport)}"})
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"tandem launch failed (exit {p.returncode}):\n{p.stdout[-3000:]}")
    return rows


def main():
    argv = sys.argv[1:]
    user_cmd = []
    if "--" in argv:
        k = argv.index("--")
        argv, user_cmd = argv[:k], argv[k + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--preset", default="t2.micro")
    ap.add_argument("--bw-mbit", type=float)
    ap.add_argument("--latency-ms", type=float)
    ap.add_argument("--sizes", default="1M,4M,16M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--tandem")
    ap.add_argument("--transport", default="tcp",
                    help="comma-separated transports for tandem, each run in turn (default tcp; e.g. tcp,zmq)")
    ap.add_argument("--no-tandem", action="store_true")
    ap.add_argument("--no-ring", action="store_true")
    ap.add_argument("--name", default=f"emub{os.getpid() % 100000}")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("allreduce_bench: needs root (network namespaces); not run", file=sys.stderr)
        return 77
    tandem, has_bench, why_not = (None, False, "--no-tandem") if a.no_tandem else find_tandem(a.tandem)
    if user_cmd and tandem is None:
        print(f"allreduce_bench: a command was given but {why_not}", file=sys.stderr)
        return 2
    up = ["up", "--name", a.name, "--hosts", str(a.hosts), "--preset", a.preset]
    if a.bw_mbit is not None:
        up += ["--bw-mbit", str(a.bw_mbit)]
    if a.latency_ms is not None:
        up += ["--latency-ms", str(a.latency_ms)]
    rc = 0
    try:
        emu(up)
        st = json.loads(emu(["status", "--name", a.name, "--json"]).stdout)
        cfg, addrs = st["config"], [h["addr"] for h in st["hosts"]]
        n, bw = len(addrs), cfg["bw_mbit"]
        print(f"# emulated cluster {a.name}: {n} hosts, preset {cfg['preset']}, link {bw} Mbit/s, one-way latency "
              f"{cfg['latency_ms']} ms, cpu {cfg['cpu_quota']} core, memory {cfg['mem_mb']} MiB")
        print(f"# {st['caveat']}")
        if user_cmd:
            p = subprocess.run(launcher_cmd(tandem, a.name, addrs[0], n, user_cmd))
            return p.returncode
        if n >= 2 and bw:
            g = link_check(a.name, addrs)
            if g is not None:
                print(f"# link check: TCP goodput host 0 -> 1 {g:.1f} Mbit/s of {bw:g} "
                      f"({g / bw * 100:.1f}%; payload ceiling {PAYLOAD_FRACTION * 100:.1f}%)")
        rows = []
        if not a.no_ring:
            rows += run_ring(a.name, addrs, a.sizes, a.iters, tandem)
        if tandem and has_bench:
            try:
                for t in a.transport.split(","):
                    rows += run_tandem(tandem, a.name, addrs, a.sizes, a.iters, t)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"# tandem: FAILED: {e}")
                rc = 1
        else:
            print(f"# tandem bench allreduce: not run: {why_not or f'{tandem} has no `bench` subcommand yet'}")
        print(f"# link-bound time = 2(n-1)/n * S / B with B = {bw} Mbit/s; efficiency = bound / measured "
              f"(median of {a.iters}, slowest rank)")
        print(f"{'what':<24} {'bytes':>10} {'measured_s':>11} {'bound_s':>9} {'efficiency':>10} {'wrong':>6}")
        for r in rows:
            bound = 2 * (n - 1) / n * r["bytes"] / (bw * 1e6 / 8) if bw else float("nan")
            eff = bound / r["time_s"] if r["time_s"] > 0 else float("nan")
            print(f"{r['what']:<24} {r['bytes']:>10} {r['time_s']:>11.4f} {bound:>9.4f} {eff * 100:>9.1f}% "
                  f"{r['wrong']:>6}")
            if r["wrong"]:
                rc = 1
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"allreduce_bench: {e}", file=sys.stderr)
        rc = 1
    finally:
        emu(["down", "--name", a.name], check=False)
    return rc


if __name__ == "__main__":
    sys.exit(main())
