#!/usr/bin/python3
"""How unequally flows fanning out of one host share its uplink, measured before a run (a calibration of the
cluster, not of any strategy): the figure the simulator's `tcp_fanout_cv` takes.

  bench/strategies/fanout_calibrate.py [--peers 4] [--bytes 246824] [--reps 40] [--gap-ms 250] [--preset t2.micro]
                                       [--name N] [--json OUT]

Brings up peers + 1 emulated hosts (tools/emu-cluster, the same preset as strategy_bench.py), opens one persistent
TCP connection (Nagle off) from the last host to each of the others, as the runtime's tcp transport keeps one per
pair, and --reps times (one every --gap-ms, below the RTO so that no connection restarts slow start) sends --bytes
on every connection at once, the way a parameter server answers several workers (one thread writing the
connections round robin, from a seeded random first one each repetition, so that no connection is favoured by
the posting order). Each receiver logs when its bytes
arrived. Per repetition:

  share   each flow's bytes received up to the first flow's completion (while all of them were on the link), over the
          mean of those: the flow's share of the link relative to an equal one (1 for every flow under max-min)
  cv      the standard deviation of the shares (population, over the flows) -- the repetition's spread
  order   completion order

`tcp_fanout_cv` = the mean of the repetitions' cv (the first --skip repetitions left out: the connections' first
windows); `tcp_fanout_corr` = the lag-one correlation of a connection's share (its deviation from 1) from one
repetition to the next, pooled over the connections, in [0, 0.99] (a connection's share persists over several
fan-outs: its window carries over). The simulator (strategy.hpp's fanout_weight) draws each worker's answers' share
weight with mean 1 and this CV, its log an AR(1) from clock to clock with this correlation.

`--direction in` measures the other side of the same host's link: the peers each send --bytes to the last host at
once (flows converging on one host through its download, which emu-cluster shapes with the same tbf as its upload:
the pushes converging on a parameter server), and the last host logs each connection's arrivals; the figures are
read the same way (and also written as tcp_fanin_cv / tcp_fanin_corr). No simulator field takes them: modelled on a
side branch (h/psapred-asgd, pushes into a server weighted so), they left ps-async's prediction where it was
(README, session 16).
Needs root; exit 77 without it. The cluster is brought down on every exit.
"""
import json
import os
import random
import select
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench", "emu"))
import predict_lib  # noqa: E402
PORT = 29611


def peer_send(argv):
    """On the sending host: accept `peers` connections, then at t0 + k * gap send `nbytes` on every one at once."""
    peers, nbytes, reps, gap, t0, seed = (int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3]), float(argv[4]),
                                          int(argv[5]))
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", PORT))
    srv.listen(peers)
    srv.settimeout(60)
    conns = []
    for _ in range(peers):
        c, _ = srv.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(c)
    msg = memoryview(b"x" * nbytes)
    rng = random.Random(seed)
    for c in conns:
        c.setblocking(False)
    for k in range(reps):
        at = t0 + k * gap
        while time.time() < at:
            time.sleep(min(0.001, max(0.0, at - time.time())))
        # one thread writes every connection round robin, starting from a different one each repetition (a fixed
        # posting order would favour the first connection every time; the runtime's order follows the pushes)
        order = conns[:]
        rng.shuffle(order)
        sent = {id(c): 0 for c in order}
        while any(sent[id(c)] < nbytes for c in order):
            _, ready, _ = select.select([], [c for c in order if sent[id(c)] < nbytes], [], 10)
            for c in order:
                if c in ready and sent[id(c)] < nbytes:
                    try:
                        sent[id(c)] += c.send(msg[sent[id(c)]:sent[id(c)] + (1 << 16)])
                    except BlockingIOError:
                        pass
    for c in conns:
        c.setblocking(True)
    for c in conns:  # wait for the receivers to close
        c.settimeout(30)
        try:
            c.recv(1)
        except OSError:
            pass
    return 0


def connect(addr):
    """A connection to the calibration's listening host, retried while it starts (None, said, if it never does)."""
    for _ in range(400):
        try:
            return socket.create_connection((addr, PORT), timeout=5)
        except OSError:
            time.sleep(0.05)
    print("fanout_calibrate: cannot connect", file=sys.stderr)
    return None


def peer_recv(argv):
    """On a receiving host: connect, receive reps x nbytes, print [(rep, [(time, bytes so far)])] as JSON."""
    addr, nbytes, reps = argv[0], int(argv[1]), int(argv[2])
    s = connect(addr)
    if s is None:
        return 1
    s.settimeout(60)
    logs = []
    for _ in range(reps):
        got, log = 0, []
        while got < nbytes:
            b = s.recv(min(1 << 16, nbytes - got))
            if not b:
                return 1
            got += len(b)
            log.append((time.time(), got))
        logs.append(log)
    s.close()
    print(json.dumps(logs))
    return 0


def hub_recv(argv):
    """--direction in, on the converging host: accept `peers` connections, read reps x nbytes from each as it
    comes, print [[(time, bytes of the repetition so far)] per repetition] per connection as JSON."""
    peers, nbytes, reps = int(argv[0]), int(argv[1]), int(argv[2])
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", PORT))
    srv.listen(peers)
    srv.settimeout(60)
    conns = [srv.accept()[0] for _ in range(peers)]
    total = nbytes * reps
    got = [0] * peers
    logs = [[[] for _ in range(reps)] for _ in range(peers)]
    while any(g < total for g in got):
        ready, _, _ = select.select([c for i, c in enumerate(conns) if got[i] < total], [], [], 30)
        if not ready:
            return 1
        now = time.time()
        for i, c in enumerate(conns):
            if c in ready and got[i] < total:
                b = c.recv(min(1 << 16, nbytes - got[i] % nbytes))  # never past the repetition's end
                if not b:
                    return 1
                got[i] += len(b)
                k = (got[i] - 1) // nbytes
                logs[i][k].append((now, got[i] - k * nbytes))
    for c in conns:
        c.close()
    print(json.dumps(logs))
    return 0


def peer_push(argv):
    """--direction in, on a sending peer: connect to the converging host, then at t0 + k * gap send nbytes."""
    addr, nbytes, reps, gap, t0 = argv[0], int(argv[1]), int(argv[2]), float(argv[3]), float(argv[4])
    s = connect(addr)
    if s is None:
        return 1
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"x" * nbytes
    for k in range(reps):
        at = t0 + k * gap
        while time.time() < at:
            time.sleep(min(0.001, max(0.0, at - time.time())))
        s.sendall(msg)
    s.settimeout(60)
    try:
        s.recv(1)  # until the hub closes
    except OSError:
        pass
    s.close()
    return 0


def bytes_at(log, t):
    """Bytes received by time t (linear between the logged receives)."""
    prev_t, prev_b = None, 0
    for tt, bb in log:
        if tt >= t:
            if prev_t is None or tt == prev_t:
                return bb if tt == t else prev_b
            return prev_b + (bb - prev_b) * (t - prev_t) / (tt - prev_t)
        prev_t, prev_b = tt, bb
    return prev_b


def analyse(logs, skip):
    """logs[peer][rep] -> per repetition: shares, cv, completion order; and the mean cv."""
    peers, reps = len(logs), min(len(x) for x in logs)
    rows = []
    for k in range(skip, reps):
        ends = [logs[p][k][-1][0] for p in range(peers)]
        first = min(ends)
        got = [bytes_at(logs[p][k], first) for p in range(peers)]
        mean = statistics.mean(got)
        shares = [g / mean for g in got]
        start = min(logs[p][k][0][0] for p in range(peers))
        rows.append({"shares": shares, "cv": statistics.pstdev(shares),
                     "end_ms": [(e - start) * 1e3 for e in ends],
                     "order": sorted(range(peers), key=lambda p: ends[p])})
    cvs = [r["cv"] for r in rows]
    # a connection's share persists: the lag-k correlation of its share's deviation from 1, pooled over connections
    dev = [[r["shares"][p] - 1 for r in rows] for p in range(peers)]
    var = sum(x * x for d in dev for x in d) / sum(len(d) for d in dev)

    def corr(k):
        pairs = [(d[i], d[i + k]) for d in dev for i in range(len(d) - k)]
        return sum(a * b for a, b in pairs) / len(pairs) / var if pairs and var > 0 else 0.0
    return {"tcp_fanout_cv": statistics.mean(cvs), "cv_sd": statistics.pstdev(cvs), "cv_min": min(cvs),
            "cv_max": max(cvs), "tcp_fanout_corr": min(0.99, max(0.0, corr(1))),
            "corr_by_lag": {str(k): corr(k) for k in (1, 2, 4, 8, 16)}, "reps": rows}


def main():
    roles = {"--peer-send": peer_send, "--peer-recv": peer_recv, "--hub-recv": hub_recv, "--peer-push": peer_push}
    if len(sys.argv) > 1 and sys.argv[1] in roles:
        return roles[sys.argv[1]](sys.argv[2:])
    ap = predict_lib.probe_args(__doc__, "fan", tandem=False)
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--bytes", type=int, default=246824, help="per flow (default: LeNet-5's f32 parameters)")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=3, help="leading repetitions left out")
    ap.add_argument("--gap-ms", type=float, default=250)
    ap.add_argument("--preset", default="t2.micro")
    ap.add_argument("--seed", type=int, default=1, help="the sender's posting orders")
    ap.add_argument("--direction", choices=("out", "in"), default="out",
                    help="out: flows fanning out of the last host (its upload); in: converging on it (its download)")
    a = ap.parse_args()
    if not predict_lib.is_root("fanout_calibrate", "network namespaces"):
        return 77
    if a.peers < 2 or a.reps <= a.skip or a.bytes < 1:
        print("fanout_calibrate: needs --peers >= 2, --reps > --skip and --bytes >= 1", file=sys.stderr)
        return 2
    me = os.path.realpath(__file__)
    res = predict_lib.probe_results(a)
    procs = []
    with predict_lib.emu_cluster(a.name, a.peers + 1, a.preset) as st:
        try:
            res["cluster_config"] = st.get("config")
            sender_addr = st["hosts"][a.peers]["addr"]
            t0 = time.time() + 3.0
            gap = a.gap_ms / 1e3
            ex = [predict_lib.TOOL, "exec", "--name", a.name]
            if a.direction == "out":
                procs.append(subprocess.Popen(ex + [str(a.peers), "--", sys.executable, me, "--peer-send",
                                                    str(a.peers), str(a.bytes), str(a.reps), str(gap), str(t0),
                                                    str(a.seed)]))
                time.sleep(0.5)
                for p in range(a.peers):
                    procs.append(subprocess.Popen(ex + [str(p), "--", sys.executable, me, "--peer-recv", sender_addr,
                                                        str(a.bytes), str(a.reps)], stdout=subprocess.PIPE, text=True))
                logs = []
                for pr in procs[1:]:
                    out, _ = pr.communicate(timeout=60 + a.reps * gap)
                    if pr.returncode != 0:
                        raise RuntimeError(f"a receiver failed (exit {pr.returncode})")
                    logs.append(json.loads(out))
                procs[0].wait(timeout=60)
            else:
                procs.append(subprocess.Popen(ex + [str(a.peers), "--", sys.executable, me, "--hub-recv",
                                                    str(a.peers), str(a.bytes), str(a.reps)], stdout=subprocess.PIPE,
                                              text=True))
                time.sleep(0.5)
                for p in range(a.peers):
                    procs.append(subprocess.Popen(ex + [str(p), "--", sys.executable, me, "--peer-push", sender_addr,
                                                        str(a.bytes), str(a.reps), str(gap), str(t0)]))
                out, _ = procs[0].communicate(timeout=60 + a.reps * gap)
                if procs[0].returncode != 0:
                    raise RuntimeError(f"the converging host failed (exit {procs[0].returncode})")
                logs = json.loads(out)
                for pr in procs[1:]:
                    pr.wait(timeout=60)
            r = analyse(logs, a.skip)
            if a.direction == "in":  # the same reading, under the names of the cluster fields it gives
                r["tcp_fanin_cv"], r["tcp_fanin_corr"] = r["tcp_fanout_cv"], r["tcp_fanout_corr"]
            res.update(r)
            print(f"{a.peers} flows of {a.bytes} B {'fanning out of' if a.direction == 'out' else 'converging on'} one {a.preset} host, {a.reps - a.skip} repetitions: "
                  f"tcp_fan{a.direction}_cv {r['tcp_fanout_cv']:.3f} (sd {r['cv_sd']:.3f}, {r['cv_min']:.3f}..{r['cv_max']:.3f}), "
                  f"tcp_fan{a.direction}_corr {r['tcp_fanout_corr']:.3f} (lags 1/2/4/8/16: "
                  f"{', '.join(f'{v:.2f}' for v in r['corr_by_lag'].values())}); "
                  f"completion spread (last - first) median "
                  f"{statistics.median(max(x['end_ms']) - min(x['end_ms']) for x in r['reps']):.1f} ms, last "
                  f"{statistics.median(max(x['end_ms']) for x in r['reps']):.1f} ms", flush=True)
        finally:
            for pr in procs:  # by PID, those this script started
                if pr.poll() is None:
                    pr.kill()
    predict_lib.write_probe_results(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
