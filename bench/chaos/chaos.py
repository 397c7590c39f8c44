#!/usr/bin/python3
"""Chaos benchmark (issue #17): random kills and stalls during elastic DDP training on 4 ranks, over tcp and ucx.

Each trial runs
  tandem launch -n 4 --min-ranks 2 --transport T -- tandem train --strategy ddp --elastic --min-ranks 2
      --model lenet5 --dataset fashion-mnist ... --checkpoint DIR/ckpt
and, at a random moment of the training (after rank 0 printed "training ...", within the first three quarters of
the training time a clean calibration run of the same job on the same transport took),
hits a random non-zero rank with one fault:
  kill        SIGKILL;
  stall-cont  SIGSTOP for longer than the communicator's deadline (TANDEM_TIMEOUT_MS), then SIGCONT (the rank comes
              back to a job that declared it dead);
  stall-kill  the same stall, then SIGKILL.
Every trial is bounded in time (--trial-timeout) and classified:
  continued       the launcher exited 0 and rank 0 reported every epoch with a finite loss;
  stopped         a non-zero exit whose error names the faulty rank, and the checkpoint (if any) loads;
  hung            the trial hit its time bound (everything is then killed by PID);
  corrupted       a checkpoint that does not load, or a NaN/absent training loss in an epoch report;
  other           none of these (printed, so that it can be looked at).
Recovery time: from the fault (SIGKILL or SIGSTOP) to the survivors' "elastic: ... ranks go on" line (logged by the
new rank 0 when the shrunk communicator is re-formed and the step is about to be redone), timed by this script as
the launcher forwards it. A stall's time includes the deadline that detects it.

Prints a Markdown table and writes every trial to --json. Debian's /usr/bin/python3, standard library only.
  nice /usr/bin/python3 bench/chaos/chaos.py --cli build/default/bin/tandem --trials 100 --json results.json
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

RANKS = 4
MIN_RANKS = 2
SEED = 7  # the training's seed (the checkpoint check resumes with the same)
OUTCOMES = ("continued", "stopped", "hung", "corrupted", "other")
# The survivors' "go on" line (parallel_trainer.cpp):
# "... N ranks go on (world ranks ...) after T ms: from step S: ...".
GO_ON = re.compile(r"elastic: world rank\(s\) (?P<lost>[\d, ]+) lost \((?P<why>.*)\); (?P<ranks>\d+) ranks go on "
                   r"\(world ranks [\d, ]+\) after (?P<ms>\d+) ms: from step (?P<step>\d+)")
# Rank 0's text report (not --json: its "training ..." line, printed once every rank joined and the trainer exists,
# marks the start of training): "epoch E: train loss L acc ...", then "  ddp world W = dp ...". The trainer's rank 0
# prints the epochs: after world rank 0 is lost, the lowest survivor (another launcher index).
STARTED = re.compile(r"^\[rank 0\] training lenet5 ")
EPOCH = re.compile(r"^\[rank \d+\] epoch (\d+): train loss (\S+) acc")
WORLD = re.compile(r"^\[rank \d+\]\s+ddp world (\d+) = dp")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def train_args(a, ckpt):
    return ["train", "--strategy", "ddp", "--elastic", "--min-ranks", str(MIN_RANKS), "--model", "lenet5",
            "--dataset", a.dataset, "--batch", str(a.batch), "--epochs", str(a.epochs), "--limit-batches",
            str(a.batches), "--eval-limit-batches", str(a.eval_batches), "--train-limit", str(a.train_limit),
            "--test-limit", str(a.test_limit), "--threads", "1", "--seed", str(SEED), "--checkpoint", ckpt]


def job_env(a):
    return dict(os.environ, TANDEM_TIMEOUT_MS=str(a.timeout_ms), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")


def rank_pids(launcher_pid):
    """{rank: pid} of the launcher's children, read from their environment (TANDEM_RANK)."""
    out = {}
    try:
        with open("/proc/%d/task/%d/children" % (launcher_pid, launcher_pid)) as f:
            children = [int(p) for p in f.read().split()]
    except OSError:
        return out
    for pid in children:
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"TANDEM_RANK="):
                out[int(kv[len(b"TANDEM_RANK="):])] = pid
    return out


def is_child_of(pid, parent):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, ValueError, IndexError):
        return False


class Job:
    """One `tandem launch` with its output read line by line, each line timed on arrival."""

    def __init__(self, cmd, env):
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                  bufsize=1, errors="replace")
        self.lines = []  # (seconds since start, text)
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.pids = {}

    def _read(self):
        for line in self.p.stdout:
            with self.lock:
                self.lines.append((time.monotonic() - self.t0, line.rstrip("\n")))

    def now(self):
        return time.monotonic() - self.t0

    def wait_for(self, pattern, bound_s):
        """Seconds since start of the first line matching `pattern`, or None once the job ended or bound_s passed."""
        until = time.monotonic() + bound_s
        seen = 0
        while time.monotonic() < until:
            with self.lock:
                lines = self.lines[seen:]
            for t, line in lines:
                if pattern.search(line):
                    return t
            seen += len(lines)
            if self.p.poll() is not None and not self.reader.is_alive():
                return None
            time.sleep(0.01)
        return None

    def find_pids(self, bound_s):
        until = time.monotonic() + bound_s
        while time.monotonic() < until and self.p.poll() is None:
            self.pids = rank_pids(self.p.pid)
            if len(self.pids) == RANKS:
                return True
            time.sleep(0.01)
        return len(self.pids) == RANKS

    def signal_rank(self, rank, sig):
        pid = self.pids.get(rank)
        if pid and is_child_of(pid, self.p.pid):
            os.kill(pid, sig)
            return True
        return False

    def wait(self, bound_s):
        """Exit code, or None when the job ran past bound_s (then every process of it is killed by PID)."""
        try:
            rc = self.p.wait(timeout=max(0.1, bound_s))
        except subprocess.TimeoutExpired:
            rc = None
            self.kill_all()
        self.reader.join(timeout=10)
        self.p.stdout.close()
        return rc

    def kill_all(self):
        # The ranks lead their own process groups (the launcher's doing): SIGKILL each group, stopped ones included,
        # then the launcher; all by the pids recorded at start.
        for pid in self.pids.values():
            if is_child_of(pid, self.p.pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            self.p.kill()
        except OSError:
            pass
        self.p.wait()

    def text(self):
        with self.lock:
            return "\n".join(l for _, l in self.lines)


def epochs_of(lines):
    """{epoch: {"train_loss": float, "world": int or None, "t_s": arrival}} from rank 0's text report."""
    out = {}
    last = None
    for t, line in lines:
        m = EPOCH.match(line)
        if m:
            try:
                loss = float(m.group(2))
            except ValueError:
                loss = float("nan")
            last = int(m.group(1))
            out[last] = {"train_loss": loss, "world": None, "t_s": t}
            continue
        m = WORLD.match(line)
        if m and last is not None and out[last]["world"] is None:
            out[last]["world"] = int(m.group(1))
    return out


def check_checkpoint(a, path):
    """('none' | 'loads' | 'corrupt' | 'unchecked', why): the checkpoint is resumed by one DDP rank (resharded to
    dp 1) that trains what is left of the job's epochs for one step each."""
    if not os.path.exists(path):
        return "none", ""
    cmd = [a.cli, "train", "--json", "--strategy", "ddp", "--model", "lenet5", "--dataset", a.dataset, "--batch",
           str(a.batch), "--epochs", str(a.epochs), "--limit-batches", "1", "--eval-limit-batches", "1",
           "--train-limit", str(a.train_limit), "--test-limit", str(a.test_limit), "--threads", "1", "--seed", str(SEED), "--resume", path]
    env = {k: v for k, v in job_env(a).items() if not k.startswith("TANDEM_") or k == "TANDEM_TIMEOUT_MS"}
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        return "corrupt", "loading it did not finish within 120 s"
    if p.returncode != 0:
        tail = p.stdout.strip().splitlines()[-3:]
        # Only a refusal of the file is a corrupt checkpoint; anything else is this check failing.
        return ("corrupt" if "cannot resume" in p.stdout else "unchecked"), tail
    for line in p.stdout.splitlines():
        if line.startswith("{") and '"train_loss":null' in line.replace(" ", ""):
            return "corrupt", "resumed training gives a NaN loss: " + line
    return "loads", ""


def names_rank(lines, victim):
    """An error line of a survivor names the faulty rank."""
    pat = re.compile(r"\branks? (?:\d+, )*%d\b|\brank\(s\) (?:\d+, )*%d\b" % (victim, victim))
    for _, line in lines:
        m = re.match(r"\[rank (\d+)\] (.*)", line)
        if m and int(m.group(1)) != victim and re.search(r"error|fail|stopped|cannot|lost|timed out|died", line) \
                and pat.search(m.group(2)):
            return True
    return False


def run_trial(a, transport, idx, window, rng, tmp):
    ckpt = os.path.join(tmp, "t%d.ckpt" % idx)
    mode = rng.choice(a.modes)
    victim = rng.choice(a.victim_ranks)
    at = rng.uniform(*window)  # seconds after training started
    cmd = [a.cli, "launch", "-n", str(RANKS), "--min-ranks", str(MIN_RANKS), "--transport", transport, "--",
           a.cli] + train_args(a, ckpt)
    job = Job(cmd, job_env(a))
    rec = {"transport": transport, "trial": idx, "mode": mode, "rank": victim, "at_s": round(at, 3)}
    fault_t = None
    try:
        started = job.wait_for(STARTED, a.trial_timeout) if job.find_pids(30) else None
        rec["train_start_s"] = None if started is None else round(started, 3)
        if started is None:
            rec["note"] = "training never started"
        else:
            time.sleep(max(0.0, started + at - job.now()))
            if job.p.poll() is None:
                fault_t = job.now()
                if job.signal_rank(victim, signal.SIGKILL if mode == "kill" else signal.SIGSTOP):
                    if mode != "kill":
                        stall_end = fault_t + a.stall_s
                        while job.now() < stall_end and job.p.poll() is None:
                            time.sleep(0.02)
                        job.signal_rank(victim, signal.SIGCONT if mode == "stall-cont" else signal.SIGKILL)
                else:
                    fault_t = None
            if fault_t is None:
                rec["note"] = "the job or the rank had ended before the fault"
        rc = job.wait(a.trial_timeout - job.now())
    except BaseException:
        job.kill_all()
        raise
    rec["fault_s"] = None if fault_t is None else round(fault_t, 3)
    rec["wall_s"] = round(job.now(), 2)
    rec["rc"] = rc
    lines = list(job.lines)
    epochs = epochs_of(lines)
    rec["epochs_reported"] = sorted(epochs)
    last = epochs.get(a.epochs)
    rec["final_world"] = last.get("world") if last else None
    rec["final_loss"] = last.get("train_loss") if last else None
    nan = any(not math.isfinite(e["train_loss"]) for e in epochs.values())
    rec["recovery_ms"] = None
    rec["reformed_in_ms"] = None
    go_ons = []
    for t, line in lines:
        m = GO_ON.search(line)
        if m:
            go_ons.append({"t_s": round(t, 3), "lost": m.group("lost"), "ranks": int(m.group("ranks")),
                           "step": int(m.group("step")), "reported_ms": int(m.group("ms"))})
    rec["go_on"] = go_ons
    if fault_t is not None:
        after = [g for g in go_ons if g["t_s"] >= fault_t]
        if after:
            rec["recovery_ms"] = round(1000 * (after[0]["t_s"] - fault_t))
            rec["reformed_in_ms"] = after[0]["reported_ms"]
    state, why = check_checkpoint(a, ckpt) if rc is not None or os.path.exists(ckpt) else ("none", "")
    rec["checkpoint"] = state
    if why:
        rec["checkpoint_error"] = why
    if rc is None:
        outcome = "hung"
    elif nan or state == "corrupt":
        outcome = "corrupted"
    elif rc == 0 and last is not None and sorted(epochs) == list(range(1, a.epochs + 1)) and state in ("loads", "none"):
        outcome = "continued"
    elif rc != 0 and names_rank(lines, victim) and state in ("loads", "none"):
        outcome = "stopped"
    else:
        outcome = "other"
    rec["outcome"] = outcome
    if outcome in ("hung", "corrupted", "other") or a.keep_output:
        rec["output_tail"] = [l for _, l in lines[-40:]]
    try:
        os.remove(ckpt)
    except OSError:
        pass
    return rec


def calibrate(a, transport, tmp):
    """A clean run: how long training lasts after rank 0's "training ..." line (its last epoch line)."""
    ckpt = os.path.join(tmp, "calibrate.ckpt")
    cmd = [a.cli, "launch", "-n", str(RANKS), "--min-ranks", str(MIN_RANKS), "--transport", transport, "--",
           a.cli] + train_args(a, ckpt)
    job = Job(cmd, job_env(a))
    job.find_pids(30)
    rc = job.wait(a.trial_timeout)
    started = next((t for t, line in job.lines if STARTED.search(line)), None)
    epochs = epochs_of(job.lines)
    if rc != 0 or started is None or sorted(epochs) != list(range(1, a.epochs + 1)):
        sys.exit("calibration run over %s failed (exit %s):\n%s" % (transport, rc, job.text()))
    state, why = check_checkpoint(a, ckpt)  # the checker must accept an uninterrupted run's checkpoint
    if state != "loads":
        sys.exit("the checkpoint of the calibration run over %s does not pass the check (%s): %s" % (transport, state, why))
    os.remove(ckpt)
    train_s = epochs[a.epochs]["t_s"] - started
    # The last quarter is left out: on a machine whose load changes, a moment drawn there often finds the job over.
    return {"start_s": 0.0, "end_s": round(0.75 * train_s, 3), "train_s": round(train_s, 3),
            "setup_s": round(started, 3), "wall_s": round(job.now(), 3)}


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(math.ceil(q * len(v))) - 1)]


def summarize(trials):
    out = {}
    for t in sorted({r["transport"] for r in trials}):
        rows = [r for r in trials if r["transport"] == t]
        s = {"trials": len(rows), "no_fault": sum(1 for r in rows if r["fault_s"] is None)}
        for o in OUTCOMES:  # among the trials whose fault landed
            s[o] = sum(1 for r in rows if r["outcome"] == o and r["fault_s"] is not None)
        for kind, modes in (("kill", ("kill",)), ("stall", ("stall-cont", "stall-kill"))):
            rec = [r["recovery_ms"] for r in rows if r["mode"] in modes and r["recovery_ms"] is not None]
            s["recovery_%s_ms" % kind] = {"n": len(rec), "median": statistics.median(rec) if rec else None,
                                          "p90": pct(rec, 0.9), "max": max(rec) if rec else None}
            s["faults_" + kind] = sum(1 for r in rows if r["mode"] in modes)
        s["no_reforming"] = sum(1 for r in rows if r["outcome"] == "continued" and r["recovery_ms"] is None and
                                r["fault_s"] is not None)
        out[t] = s
    return out


def fmt_ms(d):
    if not d["n"]:
        return "–"
    return "%d / %d / %d (n=%d)" % (d["median"], d["p90"], d["max"], d["n"])


def table(summary):
    rows = ["| transport | trials | faults landed | continued | stopped cleanly | hung | corrupted | other | "
            "death → resumed, kill: median / p90 / max ms | stall (incl. the deadline): median / p90 / max ms |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for t, s in summary.items():
        rows.append("| %s | %d | %d | %d | %d | %d | %d | %d | %s | %s |" % (
            t, s["trials"], s["trials"] - s["no_fault"], s["continued"], s["stopped"], s["hung"], s["corrupted"],
            s["other"], fmt_ms(s["recovery_kill_ms"]), fmt_ms(s["recovery_stall_ms"])))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default="tandem", help="the tandem executable")
    ap.add_argument("--trials", type=int, default=100, help="trials per transport")
    ap.add_argument("--transports", default="tcp,ucx")
    ap.add_argument("--modes", default="kill,stall-cont,stall-kill",
                    help="faults drawn from (comma-separated): kill, stall-cont, stall-kill")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--victims", default="0,1,2,3",
                    help="world ranks a fault may hit, one drawn per trial (default every rank: tandem launch serves "
                    "the rendezvous store, so rank 0 is survived too; before, 1,2,3)")
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40, help="steps per epoch (--limit-batches)")
    ap.add_argument("--eval-batches", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16, help="per-rank batch")
    ap.add_argument("--train-limit", type=int, default=8192)
    ap.add_argument("--test-limit", type=int, default=512)
    ap.add_argument("--timeout-ms", type=int, default=2000, help="the ranks' communicator deadline (TANDEM_TIMEOUT_MS)")
    ap.add_argument("--stall-s", type=float, default=None, help="SIGSTOP length (default 1.5 x the deadline + 1 s)")
    ap.add_argument("--trial-timeout", type=float, default=120, help="a trial running longer counts as hung")
    ap.add_argument("--window", default=None, help="START,END seconds after training started (rank 0's "
                    "'training ...' line) to draw the fault moment from "
                    "(default: from a clean calibration run per transport)")
    ap.add_argument("--json", default=None, help="write the trials and the summary here")
    ap.add_argument("--keep-output", action="store_true", help="keep every trial's last output lines in the JSON")
    ap.add_argument("--require", action="store_true",
                    help="exit 1 unless every trial continued or stopped cleanly (for CTest)")
    a = ap.parse_args()
    a.modes = [m for m in a.modes.split(",") if m]
    try:
        a.victim_ranks = sorted({int(v) for v in a.victims.split(",") if v})
    except ValueError:
        ap.error("--victims: '%s' is not a comma-separated list of ranks" % a.victims)
    if not a.victim_ranks or not all(0 <= v < RANKS for v in a.victim_ranks):
        ap.error("--victims: '%s' names no rank, or one outside 0..%d" % (a.victims, RANKS - 1))
    for m in a.modes:
        if m not in ("kill", "stall-cont", "stall-kill"):
            ap.error("--modes: '%s' is not kill, stall-cont or stall-kill" % m)
    if a.stall_s is None:
        a.stall_s = 1.5 * a.timeout_ms / 1000 + 1.0
    if shutil.which(a.cli) is None and not os.access(a.cli, os.X_OK):
        ap.error("--cli %s: not an executable" % a.cli)
    a.cli = os.path.abspath(a.cli) if os.path.exists(a.cli) else shutil.which(a.cli)
    rng = random.Random(a.seed)
    started = time.time()
    meta = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "cpu": cpu_model(),
            "cores": os.cpu_count(), "load_before": loadavg(), "config": {k: v for k, v in vars(a).items()}}
    trials = []
    windows = {}
    with tempfile.TemporaryDirectory(prefix="tandem-chaos-") as tmp:
        for transport in a.transports.split(","):
            if a.window:
                lo, hi = (float(x) for x in a.window.split(","))
                windows[transport] = {"start_s": lo, "end_s": hi}
            else:
                windows[transport] = calibrate(a, transport, tmp)
            w = windows[transport]
            print("%s: fault moment drawn from [%.2f, %.2f] s after training started" % (
                transport, w["start_s"], w["end_s"]), flush=True)
            for i in range(a.trials):
                rec = run_trial(a, transport, i, (w["start_s"], w["end_s"]), rng, tmp)
                trials.append(rec)
                print("%s #%d %s rank %d at %.2f s: %s (exit %s, %s s, recovery %s ms, checkpoint %s)%s" % (
                    transport, i, rec["mode"], rec["rank"], rec["at_s"], rec["outcome"], rec["rc"], rec["wall_s"],
                    rec["recovery_ms"], rec["checkpoint"], "" if "note" not in rec else " -- " + rec["note"]),
                    flush=True)
                if rec["outcome"] in ("hung", "corrupted", "other"):
                    print("\n".join("    " + l for l in rec.get("output_tail", [])), flush=True)
                if a.json:  # after every trial: a long run stopped early keeps what it measured
                    with open(a.json, "w") as f:
                        json.dump({"meta": meta, "summary": summarize(trials), "trials": trials}, f, indent=1)
    meta["load_after"] = loadavg()
    meta["windows"] = windows
    meta["wall_s"] = round(time.time() - started, 1)
    summary = summarize(trials)
    print()
    print("CPU %s (%s cores), load average before %s, after %s; %.0f s" % (
        meta["cpu"], meta["cores"], meta["load_before"], meta["load_after"], meta["wall_s"]))
    print(table(summary))
    for t, s in summary.items():
        print("%s: %d trial(s) continued without re-forming (the fault came after the last step); %d fault(s) found "
              "the job over already (not counted in the outcome columns)" % (t, s["no_reforming"], s["no_fault"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "summary": summary, "trials": trials}, f, indent=1)
    if a.require:
        # A trial whose fault never landed is judged only on hanging and corruption: a job that failed on its own
        # before training (a rank too slow to join within the deadline on a loaded machine) is reported, not a
        # verdict on fault handling.
        bad = [r for r in trials if r["outcome"] in ("hung", "corrupted") or
               (r["outcome"] == "other" and r["fault_s"] is not None)]
        for r in trials:
            if r["fault_s"] is None and r["outcome"] == "other":
                print("WARNING: %s #%d failed before its fault (%s)" % (r["transport"], r["trial"], r.get("note")))
        if bad:
            print("FAILED: %d trial(s) neither continued nor stopped cleanly" % len(bad))
            return 1
        for t, s in summary.items():
            if 2 * s["no_fault"] > s["trials"]:
                print("FAILED: over %s, %d of %d faults found the job over: the run proves nothing" % (
                    t, s["no_fault"], s["trials"]))
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
