#!/usr/bin/python3
"""What asgd's TCP sockets do in training: `ss -tmi` of every emulated host while a run goes, and its nstat deltas.

  bench/strategies/asgd_sockets.py [--workers 4] [--steps 600] [--every-ms 100] [--tandem PATH] [--name N] [--json OUT]

Brings up W emulated t2.micro hosts, runs asgd_trace.py's job (`tandem train --strategy asgd --trace`, LeNet-5,
batch 32, lr 0.02, seed 1) for --steps steps and meanwhile, outside the hosts' cgroups (so the 0.5-core quota is
not charged), samples `ss -tmiHn state established` in each host's network namespace every --every-ms. Reads:

  sockets   per worker-to-worker connection (the ones that carried over 1 MB): the send buffer (skmem tb) and what
            the socket held unsent/unacknowledged (w), cwnd and ssthresh, srtt, and its cumulative counters at the
            last sample: segments and bytes retransmitted, `lost`, the time it was busy, rwnd- and sndbuf-limited
  nstat     each host's TCP counter deltas over the run (retransmissions, timeouts, loss probes, HyStart exits,
            delayed ACKs, drops)
  qdiscs    each host's emulated NIC (tbf) drops, upload and download
  trace     asgd_trace.py's per-step figures of the same run (step, swap, transfer, the partner's lateness)

Needs root; exit 77 without it. The cluster is brought down on every exit; the samplers are stopped by PID.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench", "emu"))
sys.path.insert(0, HERE)
import predict_lib  # noqa: E402
from asgd_trace import job_args, per_step, swap_rows, train_cmd  # noqa: E402

SAMPLER = r"""
import subprocess, sys, time
every = float(sys.argv[1]) / 1000.0
out = open(sys.argv[2], "w")
nxt = time.monotonic()
while True:
    t = time.monotonic()
    p = subprocess.run(["ss", "-tmiHn", "state", "established"], stdout=subprocess.PIPE, text=True)
    out.write(f"@ {t:.6f}\n{p.stdout}")
    out.flush()
    nxt += every
    time.sleep(max(0.0, nxt - time.monotonic()))
"""

NSTAT_KEYS = ("TcpRetransSegs", "TcpOutSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes", "TcpExtTCPLossProbeRecovery",
              "TcpExtTCPFastRetrans", "TcpExtTCPSlowStartRetrans", "TcpExtTCPSpuriousRTOs", "TcpExtTCPDSACKRecv",
              "TcpExtTCPSACKReorder", "TcpExtTCPLostRetransmit", "TcpExtDelayedACKs", "TcpExtDelayedACKLost",
              "TcpExtTCPHystartTrainDetect", "TcpExtTCPHystartDelayDetect", "TcpExtTCPOFOQueue",
              "TcpExtTCPRcvQDrop", "TcpExtTCPBacklogDrop", "TcpExtTCPSackRecoveryFail", "TcpExtTCPRenoRecovery",
              "TcpExtTCPSackRecovery", "TcpExtTCPAbortOnTimeout", "TcpExtTCPRcvCoalesce", "TcpExtTCPWantZeroWindowAdv",
              "TcpExtTCPToZeroWindowAdv", "TcpExtTCPFromZeroWindowAdv")


def nstat(ns):
    p = subprocess.run(["ip", "netns", "exec", ns, "nstat", "-asz"], stdout=subprocess.PIPE, text=True, check=False)
    out = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) >= 2 and f[0] in NSTAT_KEYS:
            out[f[0]] = int(f[1])
    return out


def qdiscs(name):
    st = predict_lib.cluster_status(name)
    return [{"upload": h.get("upload"), "download": h.get("download")} for h in st["hosts"]]


FIELDS = {"cwnd": r"\bcwnd:(\d+)", "ssthresh": r"\bssthresh:(\d+)", "rtt": r"\brtt:([\d.]+)/", "rto": r"\brto:(\d+)",
          "retrans_total": r"\bretrans:\d+/(\d+)", "bytes_retrans": r"\bbytes_retrans:(\d+)",
          "bytes_sent": r"\bbytes_sent:(\d+)", "bytes_acked": r"\bbytes_acked:(\d+)", "lost": r"\blost:(\d+)",
          "busy_ms": r"\bbusy:(\d+)ms", "rwnd_limited_ms": r"\brwnd_limited:(\d+)ms",
          "sndbuf_limited_ms": r"\bsndbuf_limited:(\d+)ms", "unacked": r"\bunacked:(\d+)",
          "notsent": r"\bnotsent:(\d+)", "rcv_space": r"\brcv_space:(\d+)", "snd_wnd": r"\bsnd_wnd:(\d+)",
          "dsack_dups": r"\bdsack_dups:(\d+)", "reord_seen": r"\breord_seen:(\d+)"}
SKMEM = re.compile(r"skmem:\(r(\d+),rb(\d+),t(\d+),tb(\d+),f(\d+),w(\d+),o(\d+),bl(\d+),d(\d+)\)")


def parse_samples(path, addrs):
    """{(local addr, peer addr, local port, peer port): [(t, fields)]} for connections between cluster hosts."""
    conns = {}
    t = None
    head = None
    with open(path) as f:
        for line in f:
            if line.startswith("@ "):
                t = float(line.split()[1])
                continue
            if not line.strip():
                continue
            if not line[0].isspace():  # "0 0 10.0.0.1:40000 10.0.0.2:5000" (state omitted with `state established`)
                f_ = line.split()
                try:
                    la, lp = f_[2].rsplit(":", 1)
                    pa, pp = f_[3].rsplit(":", 1)
                except (IndexError, ValueError):
                    head = None
                    continue
                head = (la, pa, lp, pp) if la in addrs and pa in addrs and la != pa else None
                rest = " ".join(f_[4:])
            else:
                rest = line
            if head is None:
                continue
            rec = {}
            m = SKMEM.search(rest)
            if m:
                rec.update(zip(("r", "rb", "t", "tb", "f", "w", "o", "bl", "d"), map(int, m.groups())))
            for k, rx in FIELDS.items():
                mm = re.search(rx, rest)
                if mm:
                    rec[k] = float(mm.group(1))
            if rec:
                lst = conns.setdefault(head, [])
                if lst and lst[-1][0] == t:
                    lst[-1][1].update(rec)
                else:
                    lst.append((t, rec))
    return conns


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


def main():
    ap = job_args(__doc__, "ags", 600)
    ap.add_argument("--every-ms", type=float, default=100)
    a = ap.parse_args()
    if not predict_lib.is_root("asgd_sockets"):
        return 77
    tandem = predict_lib.find_tandem(a.tandem)
    W = a.workers
    res = predict_lib.probe_results(a)
    samplers = []
    with predict_lib.emu_cluster(a.name, W) as cl, tempfile.TemporaryDirectory(prefix="tandem_asgd_ss_") as tmp:
        os.chmod(tmp, 0o777)
        hosts = cl["hosts"][:W]
        addrs = {h["addr"] for h in hosts}
        sysctl = subprocess.run(["ip", "netns", "exec", hosts[0]["netns"], "sysctl", "net.ipv4.tcp_wmem",
                                 "net.ipv4.tcp_rmem", "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat",
                                 "net.ipv4.tcp_limit_output_bytes", "net.ipv4.tcp_autocorking", "net.core.wmem_max"],
                                stdout=subprocess.PIPE, text=True, check=False).stdout
        res["sysctl"] = sysctl
        before = [nstat(h["netns"]) for h in hosts]
        q0 = qdiscs(a.name)
        try:
            for i, h in enumerate(hosts):
                samplers.append(subprocess.Popen(["ip", "netns", "exec", h["netns"], sys.executable, "-c", SAMPLER,
                                                  str(a.every_ms), os.path.join(tmp, f"ss{i}.txt")]))
            path = os.path.join(tmp, "asgd.json")
            cmd = train_cmd(tandem, a.seed, a.steps, path)
            t_run0 = time.monotonic()
            rc, _, text = predict_lib.run_launch(tandem, a.name, hosts[0]["addr"], W, cmd, timeout=600)
            t_run1 = time.monotonic()
        finally:
            for p in samplers:  # by PID, the ones started here
                p.terminate()
            for p in samplers:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        after = [nstat(h["netns"]) for h in hosts]
        q1 = qdiscs(a.name)
        if rc != 0 or not os.path.exists(path):
            print(f"asgd: failed (exit {rc}):\n{text[-1500:]}", file=sys.stderr)
            return 1
        with open(path) as f:
            st = per_step(json.load(f), W)
        conns = {}
        for i in range(W):
            for k, v in parse_samples(os.path.join(tmp, f"ss{i}.txt"), addrs).items():
                conns[k] = v
    res["run_s"] = t_run1 - t_run0
    res["nstat_delta"] = [{k: a_.get(k, 0) - b.get(k, 0) for k in NSTAT_KEYS} for a_, b in zip(after, before)]
    res["qdisc"] = [{d: {"sent_bytes": (x[d] or {}).get("sent_bytes", 0) - (y[d] or {}).get("sent_bytes", 0),
                         "dropped": (x[d] or {}).get("dropped", 0) - (y[d] or {}).get("dropped", 0)}
                     for d in ("upload", "download")} for x, y in zip(q1, q0)]
    # The data connections: those that carried over 1 MB during the run.
    data = {k: v for k, v in conns.items() if v and v[-1][1].get("bytes_sent", 0) - v[0][1].get("bytes_sent", 0) > 1e6}
    res["connections"] = []
    print(f"asgd sockets, {W} workers, {a.steps} steps, run {res['run_s']:.1f} s, ss every {a.every_ms:.0f} ms")
    print(res["sysctl"].strip())
    for (la, pa, lp, pp), samples in sorted(data.items()):
        s0, s1 = samples[0][1], samples[-1][1]
        row = {"local": f"{la}:{lp}", "peer": f"{pa}:{pp}", "samples": len(samples),
               "bytes_sent": s1.get("bytes_sent", 0) - s0.get("bytes_sent", 0),
               "bytes_retrans": s1.get("bytes_retrans", 0) - s0.get("bytes_retrans", 0),
               "retrans_segs": s1.get("retrans_total", 0) - s0.get("retrans_total", 0),
               "busy_ms": s1.get("busy_ms", 0) - s0.get("busy_ms", 0),
               "rwnd_limited_ms": s1.get("rwnd_limited_ms", 0) - s0.get("rwnd_limited_ms", 0),
               "sndbuf_limited_ms": s1.get("sndbuf_limited_ms", 0) - s0.get("sndbuf_limited_ms", 0)}
        for k in ("cwnd", "ssthresh", "rtt", "tb", "w", "rb", "snd_wnd", "rcv_space", "rto"):
            xs = [r[k] for _, r in samples if k in r]
            if xs:
                row[k] = {"p10": pct(xs, 0.1), "p50": pct(xs, 0.5), "p90": pct(xs, 0.9), "max": max(xs)}
        row["series"] = [(t, {k: r.get(k) for k in ("cwnd", "ssthresh", "rtt", "tb", "w", "retrans_total", "lost",
                                                      "bytes_sent", "unacked")}) for t, r in samples]
        res["connections"].append(row)
        fmt = lambda d: f"{d['p10']:.0f}/{d['p50']:.0f}/{d['p90']:.0f}/{d['max']:.0f}" if d else "-"  # noqa: E731
        print(f"  {la}->{pa}: sent {row['bytes_sent'] / 1e6:.1f} MB, retrans {row['retrans_segs']:.0f} segs "
              f"({row['bytes_retrans'] / 1e3:.0f} kB), busy {row['busy_ms']:.0f} ms, rwnd-lim {row['rwnd_limited_ms']:.0f}"
              f" ms, sndbuf-lim {row['sndbuf_limited_ms']:.0f} ms; cwnd p10/50/90/max {fmt(row.get('cwnd'))}, "
              f"ssthresh {fmt(row.get('ssthresh'))}, srtt {fmt(row.get('rtt'))} ms, sndbuf tb {fmt(row.get('tb'))}, "
              f"queued w {fmt(row.get('w'))}, peer rwnd {fmt(row.get('snd_wnd'))}")
    for i, (d, q) in enumerate(zip(res["nstat_delta"], res["qdisc"])):
        nz = {k.replace("TcpExt", ""): v for k, v in d.items() if v}
        print(f"  host {i}: nstat {nz}; tbf drops up {q['upload']['dropped']} down {q['download']['dropped']}")
    rows = swap_rows(st, W, a.seed, a.skip)
    res["rows"] = rows
    steps = [r["step_ms"] for r in rows if r["step_ms"]]
    for key in ("step_ms", "swap_ms", "transfer_ms", "partner_late_ms", "compute_ms"):
        xs = [r[key] for r in rows if r[key] is not None]
        print(f"  {key[:-3]}: mean {statistics.mean(xs):.1f}, percentiles 10/50/90/99 "
              f"{' / '.join(f'{pct(xs, q):.1f}' for q in (0.1, 0.5, 0.9, 0.99))} ms")
    print(f"  worker-steps {len(rows)}, step mean {statistics.mean(steps):.2f} ms")
    predict_lib.write_probe_results(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
