#!/usr/bin/python3
"""Why asgd's training exchange is slower than an isolated one: each step's swap, from the runtime's trace.

  bench/strategies/asgd_trace.py [--workers 4] [--steps 200] [--skip 10] [--tandem PATH] [--name N] [--json OUT]

Brings up W emulated t2.micro hosts (tools/emu-cluster), runs `tandem train --strategy asgd --trace` of LeNet-5
(strategy_bench.py's job: batch 32, lr 0.02, seed 1) for --steps steps, and reads per worker and step from the
Chrome trace (the ranks share this machine's clock):

  compute   forward + backward + optimizer spans: against the one-host calibration (about 4.3-4.6 ms at batch 32
            under the 0.5-core quota), whether the swap's transfer work on the same quota slows the compute
  swap      from the step's forward start (the runtime posts the snapshot's send and receive just before it,
            Gossip::before_step) to the end of the step's `exchange` span (after_step: both transfers done), or the
            optimizer's end when that span is absent (done already): the swap's time in training
  transfer  the swap from the later of the pair's two forward starts: the swap less the wait for a late partner
  gap       steps since this worker's pair last swapped (the partner from the runtime's seeded matching,
            gossip_partner, ported below): a connection idle for longer than its RTO (200 ms + RTT, about 4-5 steps)
            restarts slow start, so if the three partner connections per host matter, the swap grows with the gap

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

M64 = (1 << 64) - 1


def mix64(x, b=None):
    """engine/core/rng.hpp's mix64 (splitmix64's finaliser), and its two-argument form."""
    if b is not None:
        return mix64(mix64(x) ^ ((b * 0xd1342543de82ef95) & M64))
    x = (x + 0x9e3779b97f4a7c15) & M64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


class Rng:
    """engine/core/rng.hpp's Rng (xoshiro256**): reseed and below()."""

    def __init__(self, seed):
        self.s = []
        for _ in range(4):
            seed = mix64(seed)
            self.s.append(seed)

    def next_u64(self):
        s = self.s
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M64  # noqa: E731
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, n):
        limit = M64 - M64 % n
        while True:
            x = self.next_u64()
            if x < limit:
                return x % n


def gossip_partner(worker, workers, seed, step):
    """engine/parallel/averaging.cpp's gossip_partner."""
    if workers < 2:
        return -1
    perm = list(range(workers))
    rng = Rng(mix64(mix64(seed, 0x676f73736970), step))
    for i in range(workers, 1, -1):
        j = rng.below(i)
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    mate = perm.index(worker) ^ 1
    return perm[mate] if mate < workers else -1


def per_step(trace, workers):
    """{worker: [(forward_start, compute_ms, done)]} per step, in ms."""
    ev = trace["traceEvents"] if isinstance(trace, dict) else trace
    by = {w: [] for w in range(workers)}
    for e in ev:
        if e.get("pid") in by and "dur" in e:
            by[e["pid"]].append((e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3, e["name"]))
    out = {}
    for w, spans in by.items():
        spans.sort()
        steps, cur = [], None
        for t0, t1, name in spans:
            if name.startswith("forward"):
                if cur:
                    steps.append(cur)
                cur = {"f": t0, "compute": 0.0, "done": t1}
            if cur is None:
                continue
            if name.startswith(("forward", "backward", "optimizer")):
                cur["compute"] += t1 - t0
                cur["done"] = max(cur["done"], t1)
            if name == "exchange":
                cur["done"] = max(cur["done"], t1)
        if cur:
            steps.append(cur)
        out[w] = steps
    return out


def job_args(doc, name_prefix, steps):
    """The probe's flags and the asgd job's: --workers, --steps (default `steps`), --skip, --seed."""
    ap = predict_lib.probe_args(doc, name_prefix)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--skip", type=int, default=10, help="steps left out at the start")
    ap.add_argument("--seed", type=int, default=1)
    return ap


def train_cmd(tandem, seed, steps, trace_path):
    """strategy_bench.py's asgd job (LeNet-5, batch 32, lr 0.02) for `steps` steps, traced to trace_path."""
    return [tandem, "train", "--model", "lenet5", "--dataset", "fashion-mnist", "--threads", "1", "--batch", "32",
            "--lr", "0.02", "--seed", str(seed), "--epochs", "1", "--limit-batches", str(steps),
            "--eval-limit-batches", "1", "--trace", trace_path, "--json", "--strategy", "asgd"]


def swap_rows(st, workers, seed, skip):
    """One row per worker and step (from `skip` on, partnered steps only): its partner, the steps since the pair last
    swapped, compute, the partner's lateness, transfer, swap and step, in ms (per_step's figures)."""
    rows = []
    for w in range(workers):
        last = {}
        for i, s in enumerate(st[w]):
            p = gossip_partner(w, workers, seed, i)
            key = (min(w, p), max(w, p))
            gap = i - last.get(key, -10 ** 6)
            last[key] = i
            if i < skip or p < 0:
                continue
            ps = st[p][i]["f"] if i < len(st[p]) else s["f"]
            rows.append({"worker": w, "step": i, "partner": p, "gap": gap, "compute_ms": s["compute"],
                         "partner_late_ms": ps - s["f"], "transfer_ms": s["done"] - max(s["f"], ps),
                         "swap_ms": s["done"] - s["f"],
                         "step_ms": (st[w][i + 1]["f"] - s["f"]) if i + 1 < len(st[w]) else None})
    return rows


def main():
    a = job_args(__doc__, "agt", 200).parse_args()
    if not predict_lib.is_root("asgd_trace"):
        return 77
    tandem = predict_lib.find_tandem(a.tandem)
    W = a.workers
    res = predict_lib.probe_results(a)
    with predict_lib.emu_cluster(a.name, W) as cl:
        addr0 = cl["hosts"][0]["addr"]
        with tempfile.TemporaryDirectory(prefix="tandem_asgd_trace_") as tmp:
            os.chmod(tmp, 0o777)
            path = os.path.join(tmp, "asgd.json")
            cmd = train_cmd(tandem, a.seed, a.steps, path)
            rc, _, text = predict_lib.run_launch(tandem, a.name, addr0, W, cmd, timeout=300)
            if rc != 0 or not os.path.exists(path):
                print(f"asgd: failed (exit {rc}):\n{text[-1500:]}", file=sys.stderr)
                return 1
            with open(path) as f:
                st = per_step(json.load(f), W)
    rows = swap_rows(st, W, a.seed, a.skip)
    res["rows"] = rows
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    steps = [r["step_ms"] for r in rows if r["step_ms"]]
    print(f"asgd, {W} workers, {len(rows)} worker-steps: step median {med(steps):.1f} ms (mean "
          f"{statistics.mean(steps):.1f}); compute median {med([r['compute_ms'] for r in rows]):.1f} ms (mean "
          f"{statistics.mean(r['compute_ms'] for r in rows):.1f}); swap median {med([r['swap_ms'] for r in rows]):.1f} ms "
          f"(mean {statistics.mean(r['swap_ms'] for r in rows):.1f})")
    pct = lambda xs, q: sorted(xs)[int(len(xs) * q)]  # noqa: E731
    for key in ("swap_ms", "transfer_ms"):
        xs = [r[key] for r in rows]
        print(f"  {key[:-3]}: percentiles 10/50/75/90/95/99 "
              f"{' / '.join(f'{pct(xs, q):.1f}' for q in (0.1, 0.5, 0.75, 0.9, 0.95, 0.99))} ms")
    print("  transfer = the swap from the later of the two partners' starts (what is left when the partner's "
          "lateness is taken out)")
    for lo, hi in ((1, 1), (2, 2), (3, 4), (5, 10 ** 6)):
        sel = [r for r in rows if lo <= r["gap"] <= hi]
        if sel:
            print(f"  pair last swapped {lo}{'' if hi == lo else ('+' if hi > 100 else f'-{hi}')} steps before: "
                  f"{len(sel)} worker-steps, swap median {med([r['swap_ms'] for r in sel]):.1f} ms, mean "
                  f"{statistics.mean(r['swap_ms'] for r in sel):.1f} ms; compute median "
                  f"{med([r['compute_ms'] for r in sel]):.1f} ms")
    predict_lib.write_probe_results(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
