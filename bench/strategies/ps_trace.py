#!/usr/bin/python3
"""Why the parameter-server predictions miss: when each worker's pull (the server's reply) ends, measured.

  bench/strategies/ps_trace.py [--workers 4] [--steps 40] [--strategies ps,ps-async,ssp] [--lr 0.005]
                               [--tandem PATH] [--name N] [--json OUT]

Brings up W + 1 emulated t2.micro hosts (tools/emu-cluster; the server on a host of its own, as strategy_bench.py
places it), runs `tandem train --strategy S --servers 1 --trace` of LeNet-5 for --steps steps per strategy and
reads every worker's `push/pull` span (first push issued .. last reply received) and `wait pull` span from the
runtime's Chrome trace (one clock: the ranks share this machine's). Per step it reports:

  reply spread   last worker's pull end - first worker's pull end. The simulator's flow model shares the server's
                 uplink max-min fairly between the W replies, so they end together (spread ~0); replies served one
                 after another (FIFO) end 1/W of the reply phase apart (spread ~ (W-1)/W of it).
  nearest reply  per reply, the time to the nearest reply end of another worker (median): ~0 in a convoy (every
                 reply ends with the others', as max-min sharing keeps them); about step / W with workers spread
                 evenly out of phase (replies one after another, or workers on different steps).
  push / reply   each step cut where the server's trace (its push spans) has the push in and answered: the push
                 (first push issued .. in at the server) and the reply (.. the worker's pull end), their spread, and
                 how much of each one's time another worker's push (reply) also runs -- 0 when they go one after
                 another, ~1 when they share the link.
  reply gaps     the time between consecutive reply ends of any workers, in order (percentiles): a reply's own time
                 alone on the server's uplink when the replies leave one after another; many near 0 when they share
                 it and end together.

Needs root; exit 77 without it. The cluster is brought down on every exit.
"""
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench", "emu"))
import predict_lib  # noqa: E402

FLAGS = {"ps": ["--strategy", "ps"], "ps-async": ["--strategy", "ps-async"],
         "ssp": ["--strategy", "ssp", "--staleness", "2"]}


def spans(trace, workers):
    """{worker: [(push_start, pull_end, wait_start)]} in step order, in ms."""
    ev = trace["traceEvents"] if isinstance(trace, dict) else trace
    pp = {w: [] for w in range(workers)}
    wait = {w: [] for w in range(workers)}
    for e in ev:
        if e.get("pid") in pp and e.get("name") == "push/pull":
            pp[e["pid"]].append((e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3))
        if e.get("pid") in pp and e.get("name") == "wait pull":
            wait[e["pid"]].append(e["ts"] / 1e3)
    out = {}
    for w in range(workers):
        a, b = sorted(pp[w]), sorted(wait[w])
        out[w] = [(s, t, b[i] if i < len(b) else s) for i, (s, t) in enumerate(a)]
    return out


def server_pushes(trace, workers):
    """{worker: [end of the server's push span]} in step order, in ms: the server's trace (pid = workers, tid 2 + w)
    spans each push from its step's control message taken to the push in and (ps-async) applied and answered."""
    ev = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = {w: [] for w in range(workers)}
    for e in ev:
        if e.get("pid") == workers and e.get("name") == "push" and e.get("tid", 0) - 2 in out:
            out[e["tid"] - 2].append((e["ts"] + e["dur"]) / 1e3)
    return {w: sorted(v) for w, v in out.items()}


def overlap_ms(iv, others):
    """The time of interval iv = (a, b) during which at least one of `others` runs."""
    a, b = iv
    cuts = sorted((max(a, x), min(b, y)) for x, y in others if min(b, y) > max(a, x))
    tot, end = 0.0, a
    for x, y in cuts:
        if y > end:
            tot += y - max(x, end)
            end = y
    return tot


def split(sp, srv, workers, skip):
    """Each step of each worker cut at the server's push span end: push (issue -> in and answered at the server)
    and reply (answered -> the worker's pull end); how much of each overlaps the other workers' pushes (replies)."""
    n = min(min(len(v) for v in sp.values()), min(len(v) for v in srv.values()))
    if n <= skip + 1:
        return {}
    push = {w: [(sp[w][i][0], srv[w][i]) for i in range(skip, n)] for w in range(workers)}
    reply = {w: [(srv[w][i], sp[w][i][1]) for i in range(skip, n)] for w in range(workers)}

    def stats(ivs):
        d = [b - a for w in range(workers) for a, b in ivs[w]]
        ov = [overlap_ms(iv, [o for x in range(workers) if x != w for o in ivs[x]]) / max(1e-9, iv[1] - iv[0])
              for w in range(workers) for iv in ivs[w]]
        q = sorted(d)
        return {"ms_mean": statistics.mean(d), "ms_sd": statistics.pstdev(d),
                "ms_pct": {str(p): q[int(len(q) * p / 100)] for p in (10, 50, 90)},
                "overlapped_fraction_mean": statistics.mean(ov)}
    return {"steps": n - skip, "push": stats(push), "reply": stats(reply), "push_overtaken": overtaken(push),
            "reply_overtaken": overtaken(reply),
            "steps_ms": {str(w): [[sp[w][i][0], srv[w][i], sp[w][i][1]] for i in range(skip, n)] for w in range(workers)}}


def overtaken(ivs):
    """Of the pairs of transfers (two workers') where the later one starts while the earlier runs, the fraction in
    which the later ends first: 0 under equal sharing or one after another; the share spread's doing otherwise."""
    flat = sorted(iv for v in ivs.values() for iv in v)
    pairs = over = 0
    for i, (a, b) in enumerate(flat):
        for c, d in flat[i + 1:]:
            if c >= b:
                break
            pairs += 1
            over += d < b
    return over / pairs if pairs else 0.0


def pace(s, skip, n, parts=4):
    """One worker's pace: per step, its compute (previous pull end .. this step's wait start: forward, backward,
    the copy of the pulled parameters) and its wait (wait start .. pull end), the means, and the step time in each
    of `parts` equal parts of the run (is the pace persistent?)."""
    comp = [s[i][2] - s[i - 1][1] for i in range(skip, n)]
    wait = [s[i][1] - s[i][2] for i in range(skip, n)]
    k = max(1, (n - skip) // parts)
    part_step = [(s[min(n - 1, skip + (j + 1) * k)][1] - s[skip + j * k][1]) / max(1, min(n - 1, skip + (j + 1) * k) - skip - j * k)
                 for j in range(parts)]
    return {"step_ms": (s[n - 1][1] - s[skip][1]) / max(1, n - 1 - skip), "compute_ms_mean": statistics.mean(comp),
            "compute_ms_median": statistics.median(comp), "wait_ms_mean": statistics.mean(wait),
            "wait_ms_median": statistics.median(wait), "step_ms_by_part": part_step, "compute_ms": comp,
            "wait_ms": wait}


def analyse(sp, workers, skip):
    n = min(len(v) for v in sp.values())
    steps = range(skip, n)
    spread = [max(sp[w][i][1] for w in range(workers)) - min(sp[w][i][1] for w in range(workers)) for i in steps]
    reply = [max(sp[w][i][1] for w in range(workers)) - max(sp[w][i][2] for w in range(workers)) for i in steps]
    # step time: the mean over workers of the time between their first and last pull end, per step
    step = statistics.mean((sp[w][n - 1][1] - sp[w][skip][1]) / max(1, n - 1 - skip) for w in range(workers))
    ends = {w: [sp[w][i][1] for i in steps] for w in range(workers)}
    nearest = [min(abs(t - u) for o in range(workers) if o != w for u in ends[o]) for w in range(workers)
               for t in ends[w]]
    per_worker = {str(w): pace(sp[w], skip, n) for w in range(workers)}
    order = sorted(t for w in range(workers) for t in ends[w])
    gaps = sorted(b - a for a, b in zip(order, order[1:]))
    return {"steps": len(spread), "step_ms": step, "reply_spread_ms_median": statistics.median(spread),
            "per_worker": per_worker,
            "reply_phase_ms_median": statistics.median(reply),
            "nearest_reply_ms_median": statistics.median(nearest),
            "reply_gap_ms_pct": {str(q): gaps[int(len(gaps) * q / 100)] for q in (10, 25, 50, 75, 90)} if gaps else {},
            "pull_ends_ms": {str(w): ends[w] for w in range(workers)}}


def main():
    ap = predict_lib.probe_args(__doc__, "pst")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5, help="leading steps left out (warm-up)")
    ap.add_argument("--strategies", default="ps,ps-async,ssp")
    ap.add_argument("--lr", default="0.005", help="the learning rate (strategy_bench.py's rows: 0.02)")
    a = ap.parse_args()
    if not predict_lib.is_root("ps_trace"):
        return 77
    tandem = predict_lib.find_tandem(a.tandem)
    W = a.workers
    res = dict(predict_lib.probe_results(a), rows=[])
    with predict_lib.emu_cluster(a.name, W + 1) as st:
        addr0 = st["hosts"][0]["addr"]
        with tempfile.TemporaryDirectory(prefix="tandem_ps_trace_") as tmp:
            os.chmod(tmp, 0o777)
            for key in a.strategies.split(","):
                path = os.path.join(tmp, f"{key}.json")
                cmd = [tandem, "train", "--model", "lenet5", "--dataset", "fashion-mnist", "--threads", "1",
                       "--batch", "32", "--lr", a.lr, "--seed", "1", "--servers", "1", "--epochs", "1",
                       "--limit-batches", str(a.steps), "--eval-limit-batches", "1", "--trace", path,
                       "--json"] + FLAGS[key]
                rc, per_rank, text = predict_lib.run_launch(tandem, a.name, addr0, W + 1, cmd, timeout=300)
                if rc != 0 or not os.path.exists(path):
                    print(f"{key}: failed (exit {rc}):\n{text[-1500:]}", file=sys.stderr)
                    continue
                with open(path) as f:
                    trace = json.load(f)
                sp = spans(trace, W)
                r = analyse(sp, W, a.skip)
                r["split"] = split(sp, server_pushes(trace, W), W, a.skip)
                r["strategy"] = key
                res["rows"].append(r)
                print(f"{key:<9} step {r['step_ms']:.1f} ms; reply phase (last wait start -> last reply) "
                      f"{r['reply_phase_ms_median']:.1f} ms, reply spread (first -> last reply) "
                      f"{r['reply_spread_ms_median']:.1f} ms, nearest other worker's reply {r['nearest_reply_ms_median']:.1f} "
                      f"ms (medians over {r['steps']} steps; a convoy: ~0, evenly out of phase: ~step/{W})",
                      flush=True)
                print("  gaps between consecutive reply ends, percentiles 10/25/50/75/90: "
                      + " / ".join(f"{v:.1f}" for v in r["reply_gap_ms_pct"].values()) + " ms", flush=True)
                for part in ("push", "reply") if r["split"] else ():
                    x = r["split"][part]
                    print(f"  {part:<5}: mean {x['ms_mean']:.1f} ms (sd {x['ms_sd']:.1f}; p10/50/90 "
                          + " / ".join(f"{v:.1f}" for v in x["ms_pct"].values())
                          + f"), overlapped by another worker's {part} {100 * x['overlapped_fraction_mean']:.0f}% of "
                          f"its time; a later one ends first in {100 * r['split'][part + '_overtaken']:.0f}% of the "
                          "overlapping pairs", flush=True)
                for w, pw in r["per_worker"].items():
                    print(f"  worker {w}: step {pw['step_ms']:.1f} ms (by quarter "
                          f"{', '.join(f'{x:.0f}' for x in pw['step_ms_by_part'])}), compute mean "
                          f"{pw['compute_ms_mean']:.1f} / median {pw['compute_ms_median']:.1f} ms, wait mean "
                          f"{pw['wait_ms_mean']:.1f} / median {pw['wait_ms_median']:.1f} ms", flush=True)
    predict_lib.write_probe_results(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
