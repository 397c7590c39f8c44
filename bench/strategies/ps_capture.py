#!/usr/bin/python3
"""How the parameter server's replies share its uplink, read from the packets on the server host's wire.

  bench/strategies/ps_capture.py [--workers 4] [--steps 60] [--strategy ps] [--tandem PATH] [--name N]
                                 [--json OUT] [--keep-pcap DIR]

Brings up W + 1 emulated t2.micro hosts (tools/emu-cluster; the server alone on the last host, as
strategy_bench.py places it), captures TCP headers on the server host's eth0 with tcpdump (Debian package
`tcpdump`; only this bench needs it) while `tandem train --strategy S --servers 1` trains LeNet-5 for --steps
steps, and reads from the capture, per step:

  reply phase   the server's outgoing data, first to last packet of one step's replies (gaps > 5 ms split steps; small control messages between steps are left out);
                on eth0 the capture sees packets as the host's tbf qdisc releases them, i.e. in wire order
  queued ahead  per reply, the bytes of the other replies that left the server before this reply's first packet
                (replies posted at once and shared max-min fairly: 0 for every reply; one after another: 1, 2, 3
                whole replies)
  reply end     per reply, its last packet, from the start of the phase
  push start    the first worker's push (incoming data) after the phase started: when the next step's traffic
                begins to overlap this one's replies
  period        phase start to the next phase's start: the step as the server's wire sees it

The simulator's flow model posts the W replies at once and shares the uplink max-min fairly, so they end
together and every push waits for the last of them; the period is then about reply phase + compute + push phase.
What the runtime does instead is printed beside it. Needs root and tcpdump; exits 77 without them. The cluster is
brought down, and tcpdump stopped by its PID, on every exit.
"""
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench", "emu"))
import predict_lib  # noqa: E402

GAP_S = 0.005  # outgoing data more than this apart belongs to different reply phases


def read_pcap(path):
    """[(t_s, src, dst, payload_bytes)] of IPv4 TCP packets (Ethernet or Linux cooked captures)."""
    out = []
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            raise ValueError(f"{path}: not a pcap file (only {len(head)} bytes)")
        magic = struct.unpack("<I", head[:4])[0]
        if magic not in (0xA1B2C3D4, 0xA1B23C4D):
            raise ValueError(f"{path}: not a little-endian pcap file (magic {magic:#x})")
        scale = 1e9 if magic == 0xA1B23C4D else 1e6
        link = struct.unpack("<I", head[20:24])[0]
        l2 = {1: 14, 113: 16}.get(link)
        if l2 is None:
            raise ValueError(f"{path}: link type {link} is neither Ethernet (1) nor Linux cooked (113)")
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                break
            sec, frac, incl, _ = struct.unpack("<IIII", rec)
            ip = f.read(incl)[l2:]
            if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
                continue
            ihl = (ip[0] & 15) * 4
            tcp = ip[ihl:]
            if len(tcp) < 13:
                continue
            payload = struct.unpack(">H", ip[2:4])[0] - ihl - (tcp[12] >> 4) * 4
            out.append((sec + frac / scale, ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20])), payload))
    return out


def analyse(packets, server, skip):
    """Per reply phase: order, bytes queued ahead, ends, first push, period (ms); medians over the phases."""
    sent = [(t, dst, n) for t, src, dst, n in packets if src == server and n > 0]
    got = [(t, src, n) for t, src, dst, n in packets if dst == server and n > 0]
    phases, cur = [], []
    for p in sent:
        if cur and p[0] - cur[-1][0] > GAP_S:
            phases.append(cur)
            cur = []
        cur.append(p)
    if cur:
        phases.append(cur)
    # The server also sends small control messages between steps: a reply phase carries at least half the bytes
    # of the largest one.
    big = max((sum(n for _, _, n in ph) for ph in phases), default=0)
    phases = [ph for ph in phases if sum(n for _, _, n in ph) >= big / 2]
    rows = []
    for i in range(skip, len(phases) - 1):
        ph, start, nxt = phases[i], phases[i][0][0], phases[i + 1][0][0]
        order, ahead, ends, total = [], {}, {}, 0
        for t, dst, n in ph:
            if dst not in ahead:
                order.append(dst)
                ahead[dst] = total
            ends[dst] = t
            total += n
        pushes = [t for t, _, _ in got if start <= t < nxt]
        rows.append({"order": order, "queued_ahead_kB": [ahead[d] / 1e3 for d in order],
                     "end_ms": [(ends[d] - start) * 1e3 for d in order],
                     "phase_ms": (ph[-1][0] - start) * 1e3, "phase_bytes": total,
                     "first_push_ms": (pushes[0] - start) * 1e3 if pushes else None,
                     "period_ms": (nxt - start) * 1e3})
    if not rows:
        raise ValueError(f"no step boundary in {server}'s {len(sent)} outgoing data packets (no gap over "
                         f"{GAP_S * 1e3:g} ms after the first {skip} steps): its uplink never idles, as under ps-async, "
                         "where replies leave as pushes arrive; this reading needs steps that the server ends together")
    W = max(len(r["order"]) for r in rows)
    full = [r for r in rows if len(r["order"]) == W]
    med = statistics.median

    def by_rank(key):
        return [med(sorted(r[key])[k] for r in full) for k in range(W)]

    return {"phases": len(rows), "replies_per_phase": W, "rows": rows,
            "period_ms": med(r["period_ms"] for r in rows), "phase_ms": med(r["phase_ms"] for r in full),
            "phase_mbit": med(r["phase_bytes"] * 8 / r["phase_ms"] / 1e3 for r in full if r["phase_ms"] > 0),
            "queued_ahead_kB": by_rank("queued_ahead_kB"), "end_ms": by_rank("end_ms"),
            "first_push_ms": med(r["first_push_ms"] for r in full if r["first_push_ms"] is not None)}


def report(a, key):
    W = a["replies_per_phase"]
    print(f"{key}: {a['phases']} steps on the server's wire; medians per step:")
    print(f"  period {a['period_ms']:.1f} ms; reply phase {a['phase_ms']:.1f} ms at {a['phase_mbit']:.1f} Mbit/s")
    print("  bytes of other replies on the wire before each reply's first packet (k-th to start): "
          + ", ".join(f"{x:.0f} kB" for x in a["queued_ahead_kB"]))
    print("  reply ends (k-th to end): " + ", ".join(f"{x:.1f} ms" for x in a["end_ms"]))
    print(f"  first push into the server at {a['first_push_ms']:.1f} ms, i.e. "
          f"{a['phase_ms'] - a['first_push_ms']:.1f} ms before the last reply ends")
    fair = a["phase_ms"]
    print(f"  max-min sharing of replies posted at once would end all {W} at ~{fair:.0f} ms and start no push "
          f"before; one reply after another would end them {fair / W:.0f} ms apart")


def main():
    ap = predict_lib.probe_args(__doc__, "psc")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--skip", type=int, default=5, help="leading steps left out (warm-up)")
    ap.add_argument("--strategy", default="ps", choices=["ps", "ps-async", "ssp"])
    ap.add_argument("--keep-pcap", help="directory to copy the capture into")
    a = ap.parse_args()
    if not predict_lib.is_root("ps_capture", "network namespaces, cgroups, capture"):
        return 77
    if shutil.which("tcpdump") is None:
        print("ps_capture: needs tcpdump (apt-get install tcpdump); not run", file=sys.stderr)
        return 77
    tandem = predict_lib.find_tandem(a.tandem)
    W = a.workers
    res = predict_lib.probe_results(a)
    dump = None
    with predict_lib.emu_cluster(a.name, W + 1) as st:
        try:
            addr0, server = st["hosts"][0]["addr"], st["hosts"][W]["addr"]
            with tempfile.TemporaryDirectory(prefix="tandem_ps_capture_") as tmp:
                os.chmod(tmp, 0o777)
                pcap = os.path.join(tmp, f"{a.strategy}.pcap")
                dump = subprocess.Popen(["ip", "netns", "exec", st["hosts"][W]["netns"], "tcpdump", "-i", "eth0", "-s",
                                         "96", "-n", "-U", "-w", pcap, "tcp"], stderr=subprocess.DEVNULL)
                deadline = time.monotonic() + 10
                while not os.path.exists(pcap) and time.monotonic() < deadline and dump.poll() is None:
                    time.sleep(0.1)
                if not os.path.exists(pcap):
                    raise RuntimeError("tcpdump did not start capturing within 10 s")
                flags = ["--strategy", a.strategy] + (["--staleness", "2"] if a.strategy == "ssp" else [])
                cmd = [tandem, "train", "--model", "lenet5", "--dataset", "fashion-mnist", "--threads", "1",
                       "--batch", "32", "--lr", "0.005", "--seed", "1", "--servers", "1", "--epochs", "1",
                       "--limit-batches", str(a.steps), "--eval-limit-batches", "1", "--json"] + flags
                rc, per_rank, text = predict_lib.run_launch(tandem, a.name, addr0, W + 1, cmd, timeout=300)
                time.sleep(0.3)
                dump.terminate()
                dump.wait(timeout=10)
                dump = None
                if rc != 0:
                    print(f"{a.strategy}: training failed (exit {rc}):\n{text[-1500:]}", file=sys.stderr)
                    return 1
                split = [j for j in predict_lib.json_lines(per_rank.get(0, []), "time_split")]
                if split:
                    res["rank0_step_ms"] = split[-1]["time_split"]["step_s"] * 1e3
                if a.keep_pcap:
                    os.makedirs(a.keep_pcap, exist_ok=True)
                    shutil.copy(pcap, a.keep_pcap)
                res.update(analyse(read_pcap(pcap), server, a.skip))
        finally:
            if dump is not None:
                dump.terminate()
                try:
                    dump.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    dump.kill()
    report(res, a.strategy)
    if "rank0_step_ms" in res:
        print(f"  rank 0's own mean step (its JSON): {res['rank0_step_ms']:.1f} ms")
    predict_lib.write_probe_results(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
