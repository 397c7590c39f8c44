#!/usr/bin/python3
"""The CPU a TCP transfer costs per byte and per wake-up on the emulated hosts' own path, as their CPU quotas count it.

  sudo flock /tmp/tandem-emu.lock /usr/bin/python3 bench/emu/netcpu_calibrate.py --tandem build/default/bin/tandem \
       [--bw-mbit 65] [--cpu-quota 0.5] [--seconds 2,6] [--writes 500,2500] [--repeats 2] \
       [--profile calib.json --merged merged.json] --json netcpu.json

Two emulated hosts (tools/emu-cluster: a namespace each, a veth pair to a bridge, tbf at the link's rate, a CFS quota)
run `tandem calibrate --network` (cli/calibrate_network.hpp) host 0 -> host 1 once per plan point: every pair of a
bulk time (--seconds) and a paced phase's write count (--writes), --repeats times, no two-way phase. Around each run
this reads each host's cgroup CPU usage from outside (`emu-cluster status --json`: cpuacct.usage on cgroup v1,
cpu.stat usage_usec on v2) -- the runtime the CFS quota throttles on. Each host's usage over the runs is fitted by
least squares to

    usage = fixed + per_byte x bytes + per_wakeup x wake-ups

(bytes: the bulk and paced phases' payload; wake-ups: the sender's paced writes on host 0, the receiver's paced reads
on host 1; fixed: process start, the RTT phase, exit), so per_byte holds the wake-ups a bulk transfer takes at the
link's pace and per_wakeup what a paced wake-up adds -- the loopback calibration's definitions (api/src/comm_cpu_fit.hpp).
The profile's per-side figures are the means of the two hosts (the split follows where the kernel ran the work).

Why the cgroup and not the thread's CPU clock: without CONFIG_IRQ_TIME_ACCOUNTING (check /boot/config-*), softirq work
(veth receive, the bridge, tbf's dequeue, the TCP receive path and ACKs) that runs on return from a system call or
interrupts a task is charged to that task's runtime, hence to its cgroup's quota. That is the same runtime the thread
clock reads, but the cgroup also holds the host's other threads and processes, and work the other host's packets
cause in this host's context. Softirq work run by ksoftirqd, by the idle task or in another process's context lands
in no host's quota; the output puts beside the fit what the machine spent in softirq (/proc/stat) and in ksoftirqd
over the runs, so what the hosts did not pay is visible.

Output (--json): `tcp_cpu_s_per_byte` and `tcp_cpu_s_per_wakeup` (the means; what `bench/strategies/resimulate.py
--comm-cpu-from` and a profile take), per host fits, the thread-clock figures of the same runs, every run's numbers.
--profile P --merged M writes P with the two figures replaced (its copy_cpu_s_per_byte and the rest kept). Needs root.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import predict_lib  # noqa: E402

FIGURES = ("tcp_cpu_s_per_byte", "tcp_cpu_s_per_wakeup")


def solve3(a, b):
    """x with a x = b for a 3x3 a (Gaussian elimination, partial pivoting); ValueError when a is singular."""
    m = [list(map(float, row)) + [float(v)] for row, v in zip(a, b)]
    for c in range(3):
        p = max(range(c, 3), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12 * max(1.0, max(abs(x) for row in m for x in row[:3])):
            raise ValueError("singular system")
        m[c], m[p] = m[p], m[c]
        for r in range(3):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][3] / m[i][i] for i in range(3)]


def fit_usage(rows):
    """rows: [(bytes, wakeups, cpu_s)] -> {fixed_s, per_byte_s, per_wakeup_s, residual_s}: least squares of
    cpu = fixed + per_byte x bytes + per_wakeup x wakeups. The columns are scaled before solving (bytes are ~1e7).
    Needs at least 3 rows that vary bytes and wake-ups independently; raises ValueError naming what is missing."""
    if len(rows) < 3:
        raise ValueError(f"the fit needs at least 3 runs, got {len(rows)}")
    sb = max(abs(r[0]) for r in rows) or 1.0
    sw = max(abs(r[1]) for r in rows) or 1.0
    x = [(1.0, r[0] / sb, r[1] / sw) for r in rows]
    ata = [[sum(xi[i] * xi[j] for xi in x) for j in range(3)] for i in range(3)]
    atb = [sum(xi[i] * r[2] for xi, r in zip(x, rows)) for i in range(3)]
    try:
        c = solve3(ata, atb)
    except ValueError:
        raise ValueError("the runs do not separate bytes from wake-ups (vary --seconds and --writes)") from None
    fixed, per_byte, per_wakeup = c[0], c[1] / sb, c[2] / sw
    res = [r[2] - (fixed + per_byte * r[0] + per_wakeup * r[1]) for r in rows]
    rms = (sum(e * e for e in res) / len(res)) ** 0.5
    return {"fixed_s": fixed, "per_byte_s": per_byte, "per_wakeup_s": per_wakeup, "residual_rms_s": rms}


def run_rows(runs, host):
    """The fit's rows of host 0 (sender: paced writes) or host 1 (receiver: paced reads) from the recorded runs."""
    key = "sender_writes" if host == 0 else "receiver_reads"
    return [(r["bytes"], r["paced"][key], r["cgroup_cpu_s"][host]) for r in runs]


def figures(fits):
    """The profile's per-side figures from the two hosts' fits: their means (a per-wake-up figure below 0 as 0)."""
    b = sum(f["per_byte_s"] for f in fits) / len(fits)
    w = sum(max(0.0, f["per_wakeup_s"]) for f in fits) / len(fits)
    return {"tcp_cpu_s_per_byte": b, "tcp_cpu_s_per_wakeup": w}


def merge_profile(profile, figs):
    """A copy of a calibration profile with the transfer CPU figures replaced; the rest (copy_cpu_s_per_byte too)
    kept."""
    out = dict(profile)
    for k in FIGURES:
        if not isinstance(figs.get(k), (int, float)) or figs[k] < 0:
            raise ValueError(f"{k}: expected a figure >= 0, got {figs.get(k)!r}")
        out[k] = figs[k]
    return out


def plan(seconds, writes, repeats):
    return [(s, w) for _ in range(repeats) for s in seconds for w in writes]


def machine_snapshot(name):
    """The hosts' cgroup CPU (s) and throttling, the machine's softirq ticks and ksoftirqd's CPU ticks, now."""
    st = predict_lib.cluster_status(name)
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:9]]
    ksoft = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        if "(ksoftirqd/" in s:
            fields = s.rsplit(")", 1)[1].split()
            ksoft += int(fields[11]) + int(fields[12])  # utime, stime
    return {"hosts_s": [h["cpu_seconds"] for h in st["hosts"]],
            "throttled": [h["cpu_stat"].get("nr_throttled", 0) for h in st["hosts"]],
            "softirq_ticks": cpu[6], "ksoftirqd_ticks": ksoft, "t": time.monotonic()}


def one_run(tandem, name, addr1, seconds, writes, bw, tmp):
    before = machine_snapshot(name)
    lst = subprocess.Popen([predict_lib.TOOL, "exec", "--name", name, "1", "--", tandem, "calibrate", "--network",
                            "--listen", "0", "--timeout-s", "60"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        line = lst.stdout.readline()
        if not line.startswith("listening on port "):
            raise RuntimeError(f"the listener on host 1 did not start: {line.strip()!r}")
        port = int(line.split()[-1])
        out = os.path.join(tmp, f"net_{seconds}_{writes}.json")
        p = subprocess.run([predict_lib.TOOL, "exec", "--name", name, "0", "--", tandem, "calibrate", "--network",
                            "--peer", f"{addr1}:{port}", "--seconds", str(seconds), "--paced-writes", str(writes),
                            "--two-way-reps", "0", "--nominal-mbps", str(bw), "--out", out],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=seconds + 120)
        if p.returncode != 0:
            raise RuntimeError(f"calibrate --network on host 0 failed: {p.stdout.strip()[-400:]}")
        lst.communicate(timeout=60)
    finally:
        if lst.poll() is None:
            lst.kill()
            lst.wait()
    after = machine_snapshot(name)
    with open(out) as f:
        j = json.load(f)
    hz = os.sysconf("SC_CLK_TCK")
    c = j["comm_cpu"]
    return {"seconds": seconds, "writes": writes, "bytes": c["bulk"]["bytes"] + c["paced"]["bytes"],
            "bulk_bytes": c["bulk"]["bytes"], "paced": c["paced"], "goodput_mbps": j["goodput_mbps"],
            "thread": {"tcp_cpu_s_per_byte": j["tcp_cpu_s_per_byte"], "tcp_cpu_s_per_wakeup": j["tcp_cpu_s_per_wakeup"]},
            "cgroup_cpu_s": [b - a for a, b in zip(before["hosts_s"], after["hosts_s"])],
            "throttled": [b - a for a, b in zip(before["throttled"], after["throttled"])],
            "softirq_s": (after["softirq_ticks"] - before["softirq_ticks"]) / hz,
            "ksoftirqd_s": (after["ksoftirqd_ticks"] - before["ksoftirqd_ticks"]) / hz,
            "wall_s": after["t"] - before["t"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tandem", help="the tandem binary (default: the newest build/*/bin/tandem)")
    ap.add_argument("--name", default="netcpu", help="emulated cluster name (brought up and down here)")
    ap.add_argument("--bw-mbit", type=float, default=65.0)
    ap.add_argument("--cpu-quota", type=float, default=0.5)
    ap.add_argument("--seconds", default="2,6", help="bulk phase times, comma-separated (at least 2)")
    ap.add_argument("--writes", default="500,2500", help="paced phase write counts, comma-separated (at least 2)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile", help="a calibration profile to merge the figures into (--merged)")
    ap.add_argument("--merged", help="where the merged profile goes")
    ap.add_argument("--refit", nargs="+", metavar="JSON",
                    help="no cluster: fit the runs recorded in these outputs of this script together")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if bool(a.profile) != bool(a.merged):
        ap.error("--profile and --merged go together")
    seconds = [float(s) for s in a.seconds.split(",")]
    writes = [int(w) for w in a.writes.split(",")]
    if len(set(seconds)) < 2 or len(set(writes)) < 2:
        ap.error("--seconds and --writes each need at least 2 different values (the fit separates bytes from "
                 "wake-ups)")
    if a.refit:
        res = {"args": vars(a), "runs": []}
        for path in a.refit:
            with open(path) as f:
                res["runs"] += json.load(f)["runs"]
        return report(res, a)
    if not predict_lib.is_root("netcpu_calibrate.py"):
        return 77
    tandem = predict_lib.find_tandem(a.tandem, need=("calibrate",))
    res = {"args": vars(a), "load_start": os.getloadavg(), "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
           "runs": []}
    up = ["--bw-mbit", str(a.bw_mbit), "--cpu-quota", str(a.cpu_quota)]
    with predict_lib.emu_cluster(a.name, 2, up_args=up) as st, tempfile.TemporaryDirectory() as tmp:
        res["cluster"] = st["config"] if "config" in st else None
        addr1 = st["hosts"][1]["addr"]
        for s, w in plan(seconds, writes, a.repeats):
            r = one_run(tandem, a.name, addr1, s, w, a.bw_mbit, tmp)
            res["runs"].append(r)
            print(f"# {s:g} s bulk, {w} paced writes: {r['bytes'] / 1e6:.1f} MB, cgroup CPU host 0 / 1 "
                  f"{r['cgroup_cpu_s'][0]:.3f} / {r['cgroup_cpu_s'][1]:.3f} s, softirq {r['softirq_s']:.2f} s, "
                  f"ksoftirqd {r['ksoftirqd_s']:.2f} s, throttled {r['throttled']}", flush=True)
    res["load_end"] = os.getloadavg()
    return report(res, a)


def report(res, a):
    """Fits the recorded runs, writes --json (and --merged) and prints the figures."""
    fits = [fit_usage(run_rows(res["runs"], h)) for h in (0, 1)]
    res["cgroup_fit"] = {"sender": fits[0], "receiver": fits[1]}
    res.update(figures(fits))
    n = len(res["runs"])
    res["thread_clock_mean"] = {k: sum(r["thread"][k]["mean"] for r in res["runs"]) / n for k in FIGURES}
    tot = sum(r["cgroup_cpu_s"][0] + r["cgroup_cpu_s"][1] for r in res["runs"])
    # the machine's softirq time (tick-sampled, every CPU, whoever was interrupted; this job's packets and anyone
    # else's) against the same columns as host 0's: the path's kernel work, in the hosts' quotas or not
    soft = fit_usage([(r["bytes"], r["paced"]["sender_writes"], r["softirq_s"]) for r in res["runs"]])
    res["outside"] = {"softirq_fit": soft, "softirq_s": sum(r["softirq_s"] for r in res["runs"]),
                      "ksoftirqd_s": sum(r["ksoftirqd_s"] for r in res["runs"]), "hosts_cgroup_s": tot}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=2)
    if a.merged:
        with open(a.profile) as f:
            prof = json.load(f)
        with open(a.merged, "w") as f:
            json.dump(merge_profile(prof, res), f, indent=2)
    for side, f in res["cgroup_fit"].items():
        print(f"{side}: {f['per_byte_s']:.3g} s/B, {f['per_wakeup_s'] * 1e6:.1f} us/wake-up, fixed "
              f"{f['fixed_s'] * 1e3:.0f} ms (rms residual {f['residual_rms_s'] * 1e3:.1f} ms)")
    print(f"profile (mean of the hosts, cgroup): tcp_cpu_s_per_byte {res['tcp_cpu_s_per_byte']:.3g}, "
          f"tcp_cpu_s_per_wakeup {res['tcp_cpu_s_per_wakeup']:.3g}; thread clock: "
          f"{res['thread_clock_mean']['tcp_cpu_s_per_byte']:.3g}, {res['thread_clock_mean']['tcp_cpu_s_per_wakeup']:.3g}")
    print(f"outside the hosts over the runs: softirq {res['outside']['softirq_s']:.2f} s (machine-wide), ksoftirqd "
          f"{res['outside']['ksoftirqd_s']:.2f} s; the hosts' cgroups {tot:.2f} s; softirq per byte (both sides, "
          f"machine-wide) {soft['per_byte_s']:.3g} s, per paced write {soft['per_wakeup_s'] * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
