#!/usr/bin/env python3
"""Losing rank 0 during elastic DDP (issue #17): `tandem launch -n 3 --min-ranks 2 --transport tcp -- tandem train
--strategy ddp --elastic` (LeNet-5), SIGKILL of world rank 0 at a random moment of epoch 2 (0-300 ms after rank 0
reported epoch 1), TRIALS times; then the same with world rank 2 for comparison. The launcher serves the rendezvous
store, so the survivors agree on the new membership there and old rank 1 becomes rank 0.

Per trial: death -> go on, from the SIGKILL (as this script sends it) to the arrival of the survivors' log line
"elastic: world rank(s) R lost (...); 2 ranks go on ... after T ms", which the new rank 0 prints right before the
first 2-rank step (the step in flight, redone); T is the survivors' own share (from their first failed operation).
The first 2-rank step then takes one step time (step_s of the epoch reports, printed). A trial "continued" when the
launcher exits 0 and the last epoch is reported as a world of 2 with a loss below epoch 1's. Standard library only.

  python3 bench/elastic/rank0_kill.py --cli build/default/bin/tandem --trials 20
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tests", "integration")]
from grow_curve import launch, train_args  # noqa: E402
from test_elastic_cli import rank_pid  # noqa: E402  (the launcher's child whose TANDEM_RANK is the rank)

GO_ON = re.compile(r"elastic: world rank\(s\) (\d+) lost .*; 2 ranks go on .* after (\d+) ms")
REPORT = re.compile(r"\[rank (\d+)\] (\{.*\})$")
FIRST_EPOCH = re.compile(r'\[rank 0\] \{.*"epoch":1,')


def trial(a, victim, rng):
    cmd = [a.cli, "launch", "-n", "3", "--min-ranks", "2", "--transport", "tcp", "--", a.cli] + \
        train_args(a, "ddp", a.lr, ["--min-ranks", "2"])
    delay = rng.uniform(0.0, 0.3)
    state = {"kill_at": None, "go_on": None, "own_ms": None}

    def on_line(line, t, p):
        if state["kill_at"] is None and FIRST_EPOCH.match(line.strip()):
            time.sleep(delay)  # into epoch 2
            os.kill(rank_pid(p.pid, victim), signal.SIGKILL)
            state["kill_at"] = time.monotonic()
        m = GO_ON.search(line)
        if m and state["kill_at"] is not None and state["go_on"] is None:
            state["go_on"] = t
            state["own_ms"] = int(m.group(2))

    rec = {"victim": victim, "delay_ms": round(1000 * delay)}
    try:
        _, lines = launch(cmd, on_line, timeout=a.trial_timeout)
        rec["rc"] = 0
    except SystemExit as e:
        rec["rc"], lines = "failed", []
        rec["error"] = str(e)[-400:]
    reports = {}
    for _, line in lines:
        m = REPORT.match(line.strip())
        if m:
            j = json.loads(m.group(2))
            if "epoch" in j:
                reports[j["epoch"]] = j
    if state["kill_at"] is not None and state["go_on"] is not None:
        rec["death_to_go_on_ms"] = round(1000 * (state["go_on"] - state["kill_at"]))
        rec["survivors_ms"] = state["own_ms"]
    last = reports.get(a.epochs)
    rec["final_world"] = last["world"] if last else None
    rec["step_ms"] = round(1000 * last["time_split"]["step_s"], 2) if last else None
    rec["continued"] = bool(rec["rc"] == 0 and last and last["world"] == 2 and 1 in reports and
                            last["train_loss"] < reports[1]["train_loss"])
    return rec


def summary(rows):
    d = [r["death_to_go_on_ms"] for r in rows if "death_to_go_on_ms" in r]
    own = [r["survivors_ms"] for r in rows if "survivors_ms" in r]
    step = [r["step_ms"] for r in rows if r.get("step_ms") is not None]
    return {"trials": len(rows), "continued": sum(1 for r in rows if r["continued"]),
            "death_to_go_on_ms": {"median": statistics.median(d) if d else None, "min": min(d, default=None),
                                  "max": max(d, default=None)},
            "survivors_ms_median": statistics.median(own) if own else None,
            "step_ms_median": statistics.median(step) if step else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default="tandem")
    ap.add_argument("--trials", type=int, default=20, help="per victim")
    ap.add_argument("--victims", default="0,2", help="world ranks to kill, each TRIALS times")
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=60, help="steps per epoch (per rank)")
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16, help="per rank")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--trial-timeout", type=float, default=120)
    ap.add_argument("--json", help="write every trial and the summary here")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    out = {"load": os.getloadavg(), "by_victim": {}}
    print("| killed | trials | continued | death -> go on, median (min-max) ms | survivors' share, median ms | "
          "step, median ms |")
    print("|---|---|---|---|---|---|")
    for victim in [int(v) for v in a.victims.split(",")]:
        rows = [trial(a, victim, rng) for _ in range(a.trials)]
        s = summary(rows)
        out["by_victim"][victim] = {"summary": s, "trials": rows}
        d = s["death_to_go_on_ms"]
        print("| world rank %d | %d | %d | %s (%s-%s) | %s | %s |" % (victim, s["trials"], s["continued"], d["median"],
                                                                    d["min"], d["max"], s["survivors_ms_median"],
                                                                    s["step_ms_median"]), flush=True)
    out["load_after"] = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
