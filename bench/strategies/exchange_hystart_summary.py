#!/usr/bin/env python3
"""Summarise exchange_hystart.sh runs (issue #13, asgd): for each run and host, which HyStart detector ended slow
start (the kernel's TcpExtTCPHystart{Train,Delay}{Detect,Cwnd} counters, one connection per run), when the window
stopped growing on the first step and the smoothed RTT then, the receiver-side time of each direction, and the
window before and just after each later step's first send (tcp_cwnd_restart after the 270 ms idle).

  exchange_hystart_summary.py OUTDIR... > summary.json
"""
import json, re, statistics, sys

MSS, RATE = 1448, 65e6 / 8          # segment payload, emulated t2.micro link (bytes/s)
DELAY_MIN_THRESH_S = 4e-3            # tcp_cubic.c HYSTART_DELAY_MIN (clamp(delay_min/8, 4 ms, 16 ms))


def counters(path):
    out = []
    for blk in open(path).read().split("host ")[1:]:
        out.append({k.replace("TcpExtTCPHystart", ""): int(v) for k, v in re.findall(r"(TcpExt\w+)\s+(\d+)", blk)})
    return out


runs = []
for d in sys.argv[1:]:
    before, after = counters(d + "/nstat_before.txt"), counters(d + "/nstat_after.txt")
    hosts = {r: json.load(open(f"{d}/{r}.json")) for r in "ab"}
    run = {"dir": d, "sysctl": open(d + "/sysctl.txt").read().strip().splitlines(), "hosts": {}}
    for i, r in enumerate("ab"):
        j, other = hosts[r], hosts["b" if r == "a" else "a"]
        c = {k: after[i][k] - before[i][k] for k in after[i]}
        tr = [x for x in j["trace"] if 0 <= x["t_ms"] < 60]
        exit_cwnd = c["TrainCwnd"] or c["DelayCwnd"]
        first = next((x for x in tr if x["cwnd"] >= exit_cwnd), None) if exit_cwnd else None
        restarts = []
        for k in range(1, len(j["steps"])):
            t0 = k * 300
            pre = [x for x in j["trace"] if t0 - 10 < x["t_ms"] < t0]
            post = [x for x in j["trace"] if t0 <= x["t_ms"] < t0 + 2.5 and x["unacked"] > 0]
            if pre and post: restarts.append([pre[-1]["cwnd"], post[0]["cwnd"]])
        run["hosts"][r] = {
            "detector": "train" if c["TrainDetect"] else "delay" if c["DelayDetect"] else "none",
            "exit_cwnd": exit_cwnd, "counters": c,
            "step0_cwnd_reached_exit_by_ms": first["t_ms"] if first else None,
            "step0_srtt_then_us": first["rtt_us"] if first else None,
            # the peer's receive time of this host's data (the receiver view; acked_ms adds the peer's delayed ACK)
            "send_ms_received": other["in_ms"],
            "cwnd_before_after_first_send": restarts}
    slow = min("ab", key=lambda r: run["hosts"][r]["exit_cwnd"] or 1e9)
    run["slow_direction"] = slow
    # Later steps: while the fast direction is still sending, the slow one's goodput against the two-window fluid
    # bound C x cwnd_slow / inflight_fast (both directions' RTT is the same two FIFOs; the fast link busy).
    S, F = hosts[slow], hosts["b" if slow == "a" else "a"]
    overlap = []
    for k in range(1, len(S["steps"])):
        t0, fend = k * 300, k * 300 + F["steps"][k]["acked_ms"]
        ss = [x for x in S["trace"] if t0 <= x["t_ms"] <= fend]
        fs = [x for x in F["trace"] if t0 <= x["t_ms"] <= fend]
        if len(ss) < 3 or not fs: continue
        goodput = (ss[-1]["acked"] - ss[0]["acked"]) / ((ss[-1]["t_ms"] - ss[0]["t_ms"]) / 1e3) / (RATE * MSS / 1514)
        bound = min(1.0, statistics.mean(x["cwnd"] for x in ss) / statistics.mean(x["unacked"] for x in fs))
        overlap.append({"step": k, "slow_goodput_of_line": round(goodput, 2), "fluid_bound": round(bound, 2)})
    run["slow_overlap"] = overlap
    runs.append(run)

slow_exit = [r["hosts"][r["slow_direction"]]["exit_cwnd"] for r in runs]
print(json.dumps({
    "hystart_delay_arithmetic": {
        "threshold_s": DELAY_MIN_THRESH_S, "rate_bytes_per_s": RATE, "mss": MSS,
        "cwnd_segments": round(DELAY_MIN_THRESH_S * RATE / MSS, 1),
        "cwnd_segments_1514B_frames": round(DELAY_MIN_THRESH_S * RATE / 1514, 1)},
    "slow_direction_exit_cwnd": slow_exit,
    "slow_direction_detectors": [r["hosts"][r["slow_direction"]]["detector"] for r in runs],
    "slow_direction_median_ms": [statistics.median(r["hosts"][r["slow_direction"]]["send_ms_received"]) for r in runs],
    "runs": runs}, indent=1))
