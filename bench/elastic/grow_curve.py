#!/usr/bin/env python3
"""Grow 2 -> 4 ranks mid-training, and a hybrid 2x2 grid that loses a rank (issue #17).

Grow: LeNet-5 on Fashion-MNIST, elastic DDP over tcp on loopback. `tandem launch -n 2 --max-ranks 4 --secret-file F`
trains; when rank 0 reports epoch JOIN_AFTER, `tandem launch --join -n 2 --secret-file F` starts two more ranks,
admitted at the next step boundary. Printed beside the same job uninterrupted at 2 ranks and at 4 ranks (lr x 2,
the rule's). Admission time: from starting the joiners' launcher to the job's log line "N rank(s) joined at step S"
(written right before the first step at 4 ranks; it includes the joiners' process start, model build and dataset
load), and the old ranks' own share of it ("after X ms": the agreement, the new connections and the state). When the
second joiner asks a moment after the first, one step boundary admits them one after the other (2 -> 3 -> 4), which
re-shards the sampler exactly as one admission 2 -> 4.

--strategy hybrid grows a hybrid grid instead: 1 x 2 (dp x pp) with `--pp 2 --microbatches 2`, two joiners, admitted
together as one row (the log line "the grid widened from 1 to 2 x 2"); compared with 1 x 2 and 2 x 2 (lr x 2) run
uninterrupted. --skip-kill leaves out the hybrid kill below.

Hybrid kill: `tandem launch -n 4 --min-ranks 2 -- tandem train --strategy hybrid --dp 2 --pp 2 --elastic`; world rank 3
is SIGKILLed after rank 0 reports epoch 1; the survivors re-form at 1 x 2 (rank 2 waits as a spare). Printed beside the
uninterrupted 2x2 run, with the time from the kill to the log line "the grid re-formed". Standard library only.

  python3 bench/elastic/grow_curve.py --cli build/default/bin/tandem
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time


def train_args(a, strategy, lr, extra=()):
    return ["train", "--json", "--model", "lenet5", "--dataset", a.dataset, "--strategy", strategy, "--elastic",
            "--batch", str(a.batch), "--epochs", str(a.epochs), "--limit-batches", str(a.batches),
            "--eval-limit-batches", str(a.eval_batches), "--threads", "1", "--seed", "3", "--lr", str(lr)] + list(extra)


def env():
    return dict(os.environ, OMP_NUM_THREADS="1", TANDEM_TIMEOUT_MS="20000")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def epoch_line(line):
    m = re.match(r"\[rank 0\] (\{.*\})$", line.strip())
    if m:
        j = json.loads(m.group(1))
        if "epoch" in j:
            return j
    return None


def launch(cmd, on_line=None, timeout=900):
    """Runs cmd, calling on_line(line, t) for each output line; returns ({epoch: json}, lines with times)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), bufsize=1)
    epochs, lines = {}, []
    deadline = time.monotonic() + timeout
    try:
        for line in p.stdout:
            t = time.monotonic()
            lines.append((t, line))
            if t > deadline:
                raise SystemExit("ran past %d s: %s" % (timeout, " ".join(cmd)))
            j = epoch_line(line)
            if j:
                epochs[j["epoch"]] = j
            if on_line:
                on_line(line, t, p)
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
    if p.returncode != 0:
        raise SystemExit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), "".join(l for _, l in lines[-40:])))
    return epochs, lines


GRID = ["--pp", "2", "--microbatches", "2"]  # --strategy hybrid: a 1 x 2 grid that grows to 2 x 2


def grown_line(a, line):
    """The job's log line written right before its first step at 4 ranks."""
    if a.strategy == "hybrid":
        return "the grid widened from 1 to 2 x 2" in line
    return "joined at step" in line and "4 ranks go on" in line


def grow(a):
    extra = GRID if a.strategy == "hybrid" else []
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="tandem_grow_bench_")
    secret = os.path.join(tmp, "secret")
    job = [a.cli, "launch", "-n", "2", "--max-ranks", "4", "--transport", "tcp", "--port", str(port),
           "--secret-file", secret, "--", a.cli] + train_args(a, a.strategy, a.lr, extra)
    joiner_cmd = [a.cli, "launch", "--join", "-n", "2", "--transport", "tcp", "--port", str(port),
                  "--secret-file", secret, "--", a.cli] + train_args(a, a.strategy, a.lr, extra)
    state = {"joiners": None, "asked": None, "joined": None, "line": ""}

    def on_line(line, t, _p):
        j = epoch_line(line)
        if j and j["epoch"] == a.join_after and state["joiners"] is None:
            state["asked"] = time.monotonic()
            state["joiners"] = subprocess.Popen(joiner_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                text=True, env=env())
        # The joiners come in together, or one after the other at one step boundary (2 -> 3 -> 4).
        if grown_line(a, line) and state["joined"] is None:
            state["joined"] = t
            state["line"] = line.strip()

    try:
        epochs, _ = launch(job, on_line)
        out, _ = state["joiners"].communicate(timeout=300)
        if state["joiners"].returncode != 0:
            raise SystemExit("joiners failed:\n" + out[-4000:])
    finally:
        if state["joiners"] is not None and state["joiners"].poll() is None:
            state["joiners"].kill()
            state["joiners"].wait()
        if os.path.exists(secret):
            os.remove(secret)
        os.rmdir(tmp)
    return epochs, state, " ".join(job), " ".join(joiner_cmd)


def hybrid_kill(a):
    tmp = tempfile.mkdtemp(prefix="tandem_hybrid_bench_")
    ck = os.path.join(tmp, "h.ckpt")
    extra = ["--dp", "2", "--pp", "2", "--microbatches", "2", "--checkpoint", ck]
    cmd = [a.cli, "launch", "-n", "4", "--min-ranks", "2", "--transport", "tcp", "--", a.cli] + \
        train_args(a, "hybrid", a.lr, extra)
    state = {"killed": None, "reformed": None, "line": ""}

    def on_line(line, t, p):
        j = epoch_line(line)
        if j and j["epoch"] == 1 and state["killed"] is None:
            with open("/proc/%d/task/%d/children" % (p.pid, p.pid)) as f:
                for pid in (int(x) for x in f.read().split()):
                    with open("/proc/%d/environ" % pid, "rb") as e:
                        if b"TANDEM_RANK=3\0" in e.read():
                            os.kill(pid, signal.SIGKILL)
                            state["killed"] = time.monotonic()
        if "the grid re-formed" in line and state["reformed"] is None:
            state["reformed"] = t
            state["line"] = line.strip()

    epochs, _ = launch(cmd, on_line)
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)
    return epochs, state, " ".join(cmd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default="tandem")
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--join-after", type=int, default=1, help="epochs at 2 ranks before the joiners start")
    ap.add_argument("--batches", type=int, default=75, help="steps per epoch (per rank)")
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--strategy", choices=("ddp", "hybrid"), default="ddp", help="the job that grows")
    ap.add_argument("--skip-kill", action="store_true", help="leave out the hybrid 2x2 kill")
    a = ap.parse_args()
    t0 = time.time()
    extra = GRID if a.strategy == "hybrid" else []
    two, _ = launch([a.cli, "launch", "-n", "2", "--transport", "tcp", "--", a.cli] +
                    train_args(a, a.strategy, a.lr, extra))
    four, _ = launch([a.cli, "launch", "-n", "4", "--transport", "tcp", "--", a.cli] +
                     train_args(a, a.strategy, 2 * a.lr, extra))
    grown, st, job_cmd, join_cmd = grow(a)

    print("LeNet-5, %s, per-rank batch %d, %d steps/epoch, SGD lr %g momentum 0.9; tcp on loopback\n"
          % (a.dataset, a.batch, a.batches, a.lr))
    print("Grow: `%s`, then after epoch %d: `%s`\n" % (job_cmd, a.join_after, join_cmd))
    for key in ("train_loss", "test_loss"):
        print("| epoch | 2 ranks uninterrupted %s | 4 ranks uninterrupted (lr x 2) %s | 2 -> 4 grown %s | grown: world |"
              % (key, key, key))
        print("|---|---|---|---|---|")
        for e in range(1, a.epochs + 1):
            print("| %d | %.6f | %.6f | %.6f | %d |" % (e, two[e][key], four[e][key], grown[e][key], grown[e]["world"]))
        print()
    ms = re.search(r"after (\d+) ms", st["line"])
    print("admission: joiners' launcher started -> job's admission line (first step at 4 ranks next): %.0f ms; "
          "the old ranks' share of the last admission (agreement, connections, state): %s ms" %
          (1e3 * (st["joined"] - st["asked"]), ms.group(1) if ms else "?"))
    print("  %s\n" % st["line"])
    if a.skip_kill:
        print("wall time %.0f s" % (time.time() - t0))
        return
    hyb_straight, _ = launch([a.cli, "launch", "-n", "4", "--transport", "tcp", "--", a.cli] +
                             train_args(a, "hybrid", a.lr, ["--dp", "2", "--pp", "2", "--microbatches", "2"]))
    hyb, hs, hyb_cmd = hybrid_kill(a)
    print("Hybrid 2x2, world rank 3 SIGKILLed after epoch 1: `%s`\n" % hyb_cmd)
    for key in ("train_loss", "test_loss"):
        print("| epoch | 2x2 uninterrupted %s | 2x2, rank 3 killed %s | killed: dp x pp |" % (key, key))
        print("|---|---|---|---|")
        for e in range(1, a.epochs + 1):
            print("| %d | %.6f | %.6f | %dx%d |" % (e, hyb_straight[e][key], hyb[e][key], hyb[e]["dp"], hyb[e]["pp"]))
        print()
    if hs["reformed"] and hs["killed"]:
        print("kill -> \"the grid re-formed\" line: %.0f ms\n  %s" % (1e3 * (hs["reformed"] - hs["killed"]), hs["line"]))
    print("wall time %.0f s" % (time.time() - t0))


if __name__ == "__main__":
    main()
