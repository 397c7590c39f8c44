#!/usr/bin/python3
"""Allreduce against the peers, in one run: Tandem (tcp and zmq over TCP and over local sockets, ucx) vs PyTorch gloo and Open MPI's
MPI_Allreduce (TCP and shared memory), float32 sum, the same sizes at world sizes 2 and 4, on
loopback. Every runner uses one method (barrier, timed call, slowest rank per iteration, median
over iterations; busbw = algbw * 2(n-1)/n) and checks its results.

    bench/allreduce/run.py [--tandem build/default/bin/tandem] [--sizes 4K,64K,1M,16M]
                           [--worlds 2,4] [--iters 20] [--warmup 3] [--small-iters 200]
                           [--small-warmup 50] [--rounds 1] [--json results.json]

Sizes up to 64 KiB (latency-bound) are timed over --small-iters after --small-warmup untimed calls,
for every runner alike: with 3 warm-ups and 20 iterations the 4 KiB figure at 4 ranks swung from
40 to 550 us run to run here (every runner's first few dozen calls after start-up are slow).

Needs python3-torch and openmpi-bin/libopenmpi-dev (TANDEM_BENCH_DEPS=1 tools/install-deps); a
missing peer is reported and its columns left empty. Run it with Debian's /usr/bin/python3."""
import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL_BYTES = 64 * 1024  # sizes up to this are timed with --small-iters / --small-warmup
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def parse_size(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def human(b):
    for unit, m in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d%s" % (b // m, unit)
    return str(b)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        # `tandem launch` prefixes rank output; keep whatever JSON object a line carries.
        if "{" in line:
            try:
                out.append(json.loads(line[line.index("{"):]))
            except ValueError:
                pass
    return out


def run(cmd, env=None, timeout=900):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d:\n%s%s" % (" ".join(cmd[:6]), p.returncode, p.stdout[-2000:], p.stderr[-2000:]))
    return json_lines(p.stdout)


def find_tandem(arg):
    if arg:
        return arg
    built = glob.glob(os.path.join(REPO, "build", "*", "bin", "tandem"))
    if not built:
        sys.exit("run.py: no tandem executable under build/*/bin; pass --tandem")
    return max(built, key=os.path.getmtime)


def tandem_runner(exe, transport, **env):
    def go(world, sizes, iters, warmup):
        return run([exe, "bench", "allreduce", "-n", str(world), "--transport", transport, "--sizes",
                    ",".join(map(str, sizes)), "--iters", str(iters), "--warmup", str(warmup), "--json"],
                   env=dict(os.environ, **env))
    return go


def gloo_runner(world, sizes, iters, warmup):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    procs = []
    args = [str(iters), str(warmup)] + [str(s) for s in sizes]
    for r in range(world):
        procs.append(subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "gloo_allreduce.py")] + args,
                                      env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=900))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (o, e) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError("gloo rank exited %d: %s" % (p.returncode, e[-2000:]))
    return json_lines(outs[0][0])


def mpi_runner(binary, btl):
    def go(world, sizes, iters, warmup):
        cmd = ["mpirun", "-np", str(world), "--oversubscribe", "--bind-to", "none", "--mca", "pml", "ob1",
               "--mca", "btl", btl]
        if "tcp" in btl:
            cmd += ["--mca", "btl_tcp_if_include", "lo"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += [binary, str(iters), str(warmup)] + [str(s) for s in sizes]
        return run(cmd, env=dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1"))
    return go


def build_mpi(tmp):
    if not shutil.which("mpicc") or not shutil.which("mpirun"):
        return None, "mpicc/mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    out = os.path.join(tmp, "mpi_allreduce")
    p = subprocess.run(["mpicc", "-O2", "-o", out, os.path.join(HERE, "mpi_allreduce.c")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        return None, "mpicc failed: " + p.stdout
    return out, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tandem", help="the tandem executable (default: newest build/*/bin/tandem)")
    ap.add_argument("--sizes", default="4K,64K,1M,16M")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--small-iters", type=int, default=200, help="iterations for sizes up to 64 KiB")
    ap.add_argument("--small-warmup", type=int, default=50, help="warm-up calls for sizes up to 64 KiB")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every runner this many times, interleaved, and keep each runner's best round per size "
                         "(the shared machine's noise only ever slows a runner down)")
    ap.add_argument("--only", help="comma-separated subset of runners (tandem-shm, tandem-tcp, tandem-unix, tandem-zmq, tandem-zipc, "
                    "tandem-ucx, gloo, mpi-tcp, mpi-shm)")
    ap.add_argument("--json", help="also write every result to this file")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    worlds = [int(w) for w in a.worlds.split(",")]
    exe = find_tandem(a.tandem)

    tmp = tempfile.mkdtemp(prefix="tandem-bench-")
    # tandem-tcp and tandem-zmq keep every connection on TCP (the path gloo and mpi-tcp take);
    # tandem-unix and tandem-zipc reach the ranks of this host over local sockets (AF_UNIX streams;
    # ZeroMQ's ipc: zmq as it runs by default); tandem-shm is the tcp transport as it runs by default,
    # its frames between ranks of this host going through shared memory.
    runners = {"tandem-shm": tandem_runner(exe, "tcp", TANDEM_TCP_LOCAL="shm"),
               "tandem-tcp": tandem_runner(exe, "tcp", TANDEM_TCP_LOCAL="tcp"),
               "tandem-unix": tandem_runner(exe, "tcp", TANDEM_TCP_LOCAL="unix"),
               "tandem-zmq": tandem_runner(exe, "zmq", TANDEM_ZMQ_LOCAL="tcp"),
               "tandem-zipc": tandem_runner(exe, "zmq", TANDEM_ZMQ_LOCAL="ipc"),
               "tandem-ucx": tandem_runner(exe, "ucx")}
    notes = []
    try:
        import torch  # noqa: F401
        runners["gloo"] = gloo_runner
    except ImportError:
        notes.append("gloo: python3-torch is not installed for %s" % sys.executable)
    mpi, why = build_mpi(tmp)
    if mpi:
        runners["mpi-tcp"] = mpi_runner(mpi, "tcp,self")
        runners["mpi-shm"] = mpi_runner(mpi, "vader,self")
    else:
        notes.append("Open MPI: " + why)
    if a.only:
        keep = set(a.only.split(","))
        runners = {k: v for k, v in runners.items() if k in keep}

    load_start = os.getloadavg()
    results = {}  # (runner, world) -> {bytes: best row over the rounds}
    for rnd in range(a.rounds):
        for world in worlds:
            for name, go in runners.items():
                print("round %d/%d: running %s on %d ranks ..." % (rnd + 1, a.rounds, name, world), file=sys.stderr,
                      flush=True)
                try:
                    small = [b for b in sizes if b <= SMALL_BYTES]
                    large = [b for b in sizes if b > SMALL_BYTES]
                    rows = (go(world, small, a.small_iters, a.small_warmup) if small else []) + \
                        (go(world, large, a.iters, a.warmup) if large else [])
                    best = results.setdefault((name, world), {})
                    for r in rows:
                        r["round"] = rnd + 1
                        if r["bytes"] not in best or r["time_us"] < best[r["bytes"]]["time_us"]:
                            best[r["bytes"]] = r
                    bad = [r for r in rows if r.get("wrong")]
                    if bad:
                        notes.append("%s world %d: WRONG results at %s" % (name, world, [r["bytes"] for r in bad]))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    notes.append("%s world %d failed: %s" % (name, world, str(e).strip().splitlines()[0]))
    shutil.rmtree(tmp, ignore_errors=True)

    def busbw(name, world, b):
        r = results.get((name, world), {}).get(b)
        return r["busbw_gbps"] if r else None

    def time_us(name, world, b):
        r = results.get((name, world), {}).get(b)
        return r["time_us"] if r else None

    def fmt(v, spec="%7.2f"):
        return spec % v if v is not None else "%7s" % "-"

    def ratio(x, y):
        return "%6.2fx" % (x / y) if x is not None and y else "%7s" % "-"

    cols = list(runners)
    print("# allreduce float32 sum on loopback, busbw GB/s (median of %d iterations after %d warm-ups, %d after %d up to "
          "64K; time_us for the smallest size; best of %d interleaved round(s) per runner)" %
          (a.iters, a.warmup, a.small_iters, a.small_warmup, a.rounds))
    print("# %d CPUs; 1-minute load average %.1f at the start, %.1f at the end (other work skews every column)" %
          (os.cpu_count(), load_start[0], os.getloadavg()[0]))
    print("# ratios: shm (tcp through shared memory) against gloo and mpi-shm, tcp and zmq (every connection on TCP) "
          "against gloo and mpi-tcp, ucx against mpi-shm, unx and "
          "zipc (tcp and zmq over local sockets) against gloo, mpi-tcp and mpi-shm (busbw, higher is better); lat = "
          "mpi/tandem time (higher is better), the local-socket runners against mpi-tcp")
    pairs = [("shm/gloo", "tandem-shm", "gloo"), ("shm/mpiS", "tandem-shm", "mpi-shm"),
             ("tcp/gloo", "tandem-tcp", "gloo"), ("tcp/mpiT", "tandem-tcp", "mpi-tcp"),
             ("zmq/gloo", "tandem-zmq", "gloo"), ("zmq/mpiT", "tandem-zmq", "mpi-tcp"),
             ("ucx/mpiS", "tandem-ucx", "mpi-shm"), ("unx/gloo", "tandem-unix", "gloo"),
             ("unx/mpiT", "tandem-unix", "mpi-tcp"), ("unx/mpiS", "tandem-unix", "mpi-shm"),
             ("zipc/glo", "tandem-zipc", "gloo"), ("zipc/mpT", "tandem-zipc", "mpi-tcp")]
    lats = [("lat shm", "mpi-shm", "tandem-shm"), ("lat tcp", "mpi-tcp", "tandem-tcp"), ("lat zmq", "mpi-tcp", "tandem-zmq"),
            ("lat ucx", "mpi-shm", "tandem-ucx"), ("lat unx", "mpi-tcp", "tandem-unix"),
            ("lat zipc", "mpi-tcp", "tandem-zipc")]
    header = "%5s %6s " % ("world", "size") + " ".join("%10s" % c for c in cols) + "  " + \
        " ".join("%8s" % p[0] for p in pairs) + " " + " ".join("%9s" % l[0] for l in lats)
    print(header)
    for world in worlds:
        for b in sizes:
            line = "%5d %6s " % (world, human(b))
            line += " ".join("%10s" % fmt(busbw(c, world, b)).strip() for c in cols)
            line += "  " + " ".join("%8s" % ratio(busbw(x, world, b), busbw(y, world, b)) for _, x, y in pairs)
            line += " " + " ".join("%9s" % ratio(time_us(x, world, b), time_us(y, world, b)) for _, x, y in lats)
            print(line)
        small = min(sizes)
        print("%5d %6s " % (world, "t_us@" + human(small)) +
              " ".join("%10s" % fmt(time_us(c, world, small), "%7.1f").strip() for c in cols))
    for n in notes:
        print("# note: " + n)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([dict(r, runner=k[0]) for k, rows in results.items() for r in rows.values()], f, indent=1)
    return 1 if any("WRONG" in n for n in notes) else 0


if __name__ == "__main__":
    sys.exit(main())
