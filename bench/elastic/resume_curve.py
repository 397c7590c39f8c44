#!/usr/bin/env python3
"""Resume at a different dp x pp reaches the same loss curve as the uninterrupted run (issue #17).

Trains LeNet-5 on Fashion-MNIST at 2x1 (DDP) for EPOCHS epochs of BATCHES steps (global batch GLOBAL), writing a
checkpoint after epoch HALF in a second run that stops there; then resumes that checkpoint at 1x2, 4x1, 1x1 and 2x2
(the global batch kept: --batch = GLOBAL / dp) and prints each epoch's training and test loss beside the
uninterrupted run's, as a Markdown table. Standard library only.

  python3 bench/elastic/resume_curve.py --cli build/default/bin/tandem [--dataset fashion-mnist]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

GRIDS = [(1, 2), (4, 1), (1, 1), (2, 2)]


def run(cli, dp, pp, epochs, extra, a):
    world = dp * pp
    strategy = "hybrid" if dp > 1 and pp > 1 else "ddp" if dp > 1 else "pipeline" if pp > 1 else "single"
    args = ["train", "--json", "--model", "lenet5", "--dataset", a.dataset, "--strategy", strategy,
            "--batch", str(a.global_batch // dp), "--epochs", str(epochs), "--limit-batches", str(a.batches),
            "--eval-limit-batches", str(a.eval_batches), "--threads", "1", "--seed", "3", "--lr", str(a.lr)]
    if strategy == "hybrid":
        args += ["--dp", str(dp), "--pp", str(pp)]
    if pp > 1:
        args += ["--microbatches", "2"]
    cmd = [cli] + args + extra if world == 1 else [cli, "launch", "-n", str(world), "--", cli] + args + extra
    env = dict(os.environ, OMP_NUM_THREADS="1", TANDEM_TIMEOUT_MS="60000")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stdout))
    out = {}
    for line in p.stdout.splitlines():
        m = re.match(r"(?:\[rank 0\] )?(\{.*\})$", line.strip())
        if m:
            j = json.loads(m.group(1))
            if "epoch" in j:
                out[j["epoch"]] = j
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default="tandem")
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--half", type=int, default=2, help="epochs before the checkpoint")
    ap.add_argument("--batches", type=int, default=75, help="steps per epoch")
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    a = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "2x1.ckpt")
        straight = run(a.cli, 2, 1, a.epochs, [], a)
        run(a.cli, 2, 1, a.half, ["--checkpoint", ckpt], a)
        resumed = {g: run(a.cli, g[0], g[1], a.epochs, ["--resume", ckpt], a) for g in GRIDS}
        # The spread that the reduction order alone causes: each grid trained from the start, never interrupted.
        alone = {g: run(a.cli, g[0], g[1], a.epochs, [], a) for g in GRIDS}
    cols = ["2x1 uninterrupted"] + ["2x1 -> %dx%d" % g for g in GRIDS]
    print("LeNet-5, %s, global batch %d, %d steps/epoch, SGD lr %g momentum 0.9 (tandem train's defaults); checkpoint after epoch %d "
          "(step %d)\n" % (a.dataset, a.global_batch, a.batches, a.lr, a.half, a.half * a.batches))
    for key in ("train_loss", "test_loss"):
        print("| epoch | %s |" % " | ".join("%s %s" % (c, key) for c in cols))
        print("|---|%s" % ("---|" * len(cols)))
        for e in range(1, a.epochs + 1):
            cells = ["%.6f" % straight[e][key]]
            for g in GRIDS:
                cells.append("%.6f" % resumed[g][e][key] if e in resumed[g] else "(before the checkpoint)")
            print("| %d | %s |" % (e, " | ".join(cells)))
        print()
    def spread(runs, first):
        return max(abs(runs[g][e][k] - straight[e][k]) / abs(straight[e][k])
                   for g in GRIDS for e in range(first, a.epochs + 1) for k in ("train_loss", "test_loss"))
    print("largest relative difference from the uninterrupted 2x1 run, epochs %d-%d: resumed at another grid %.2e; "
          "that grid trained from the start (the reduction order's own spread) %.2e" %
          (a.half + 1, a.epochs, spread(resumed, a.half + 1), spread(alone, a.half + 1)))
    worst = max(abs(resumed[g][e][k] - straight[e][k]) / abs(straight[e][k])
                for g in GRIDS for e in [a.half + 1] for k in ("train_loss", "test_loss"))
    print("largest relative difference, resumed vs uninterrupted, epoch %d (the first after the resume): %.2e" %
          (a.half + 1, worst))
    print("wall time %.0f s" % (time.time() - t0))


if __name__ == "__main__":
    main()
