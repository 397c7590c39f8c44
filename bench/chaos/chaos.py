#!/usr/bin/python3
"""Chaos benchmark (issues #17, #13): random kills and stalls during elastic training on 4 ranks, for every strategy
that absorbs a lost rank (DDP, hybrid DP x PP, the parameter servers with and without backup servers, EASGD, local
SGD, FedAvg, asynchronous SGD), over tcp and ucx.

Each trial runs, for one strategy of the table STRATEGIES (--strategy NAME, a comma-separated list, or all),
  tandem launch -n 4 --min-ranks 2 --transport T -- tandem train STRATEGY-FLAGS --min-ranks 2
      --model lenet5 --dataset fashion-mnist ... --checkpoint DIR/ckpt
and, at a random moment of the training (after rank 0 printed "training ...", within the first three quarters of
the training time a clean calibration run of the same job on the same transport took),
hits a random rank (a worker or, for the parameter-server strategies, a server) with one fault:
  kill        SIGKILL;
  stall-cont  SIGSTOP for longer than the communicator's deadline (TANDEM_TIMEOUT_MS), then SIGCONT (the rank comes
              back to a job that declared it dead);
  stall-kill  the same stall, then SIGKILL.
Every trial is bounded in time (--trial-timeout) and gets one verdict:
  continued   the launcher exited 0 and the reporting rank gave every epoch (round) with a finite loss;
  stopped     a non-zero exit, and every surviving rank logged an error naming the faulty rank;
  DEFECT      one of (the first that applies):
                hung        the trial hit its time bound (everything is then killed by PID);
                crashed     a rank other than a SIGKILLed victim ended by a signal (SIGSEGV, SIGABRT, ...);
                nonfinite   a NaN/inf or absent training loss in an epoch report;
                empty       an epoch report with no sample scored: "train loss n/a" (or, from older builds,
                            train loss 0, accuracy 0% and 0 img/s: a silent wrong result);
                checkpoint  the job's checkpoint does not resume (same strategy, same flags, one step);
                unfinished  a rank exited 0 without having finished: the victim after the others declared it lost,
                            a rank outside the survivors' last membership (hybrid's spares excepted), or any
                            rank of a job whose reporting rank did not give every epoch;
                blamed      a rank that was not hit stopped with a last error that does not name the victim (it
                            blames another rank), or was dropped while the job went on;
                unnamed     a survivor that reacted to nothing (no line names the faulty rank) while others did;
                other       none of the above (printed and kept in the JSON, to be looked at).
Recovery time: from the fault (SIGKILL or SIGSTOP) to the survivors' first "elastic: ... ranks go on" line or
"elastic: lost parameter server(s) ..." line (logged when the re-formed group is about to go on), timed by this
script as the launcher forwards it. A stall's time includes the deadline that detects it.

The checkpoint check resumes the trial's checkpoint under `tandem launch -n 4` with the strategy's own flags for
one step past the trained epochs; a strategy whose checkpoint is bound to its number of workers (ps-async, easgd)
refuses that width with "resume with K workers" after a worker loss, and is resumed again at K workers (plus its
servers). Only a refusal of the file itself (or a NaN after resuming) counts as a defect.

Prints a Markdown table and writes every trial to --json. Debian's /usr/bin/python3, standard library only.
  nice /usr/bin/python3 bench/chaos/chaos.py --cli build/default/bin/tandem --strategy all --trials 10 --json r.json
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

# The one table of strategies: the training's flags, the resume's flags (the checkpoint check: by default the
# training's own), and how many parameter-server ranks the job has (the last ones of the 4).
STRATEGIES = {
    "ddp": {"train": ["--strategy", "ddp", "--elastic"], "servers": 0},
    "hybrid": {"train": ["--strategy", "hybrid", "--dp", "2", "--pp", "2", "--elastic"], "servers": 0},
    "ps": {"train": ["--strategy", "ps", "--servers", "1", "--elastic"], "servers": 1},
    "ps-backup": {"train": ["--strategy", "ps", "--servers", "2", "--server-replicas", "1", "--elastic"],
                  "servers": 2},
    "ps-async": {"train": ["--strategy", "ps-async", "--servers", "1"], "servers": 1},
    "ps-async-backup": {"train": ["--strategy", "ps-async", "--servers", "2", "--server-replicas", "1"],
                        "servers": 2},
    "ssp": {"train": ["--strategy", "ssp", "--staleness", "2", "--servers", "1"], "servers": 1},
    "ssp-backup": {"train": ["--strategy", "ssp", "--staleness", "2", "--servers", "2", "--server-replicas", "1"],
                   "servers": 2},
    "easgd": {"train": ["--strategy", "easgd", "--tau", "4"], "servers": 0},
    "easgd-async": {"train": ["--strategy", "easgd", "--easgd-async", "--servers", "1", "--tau", "4"], "servers": 1},
    "localsgd": {"train": ["--strategy", "localsgd", "--average-every", "4"], "servers": 0},
    "fedavg": {"train": ["--strategy", "fedavg"], "servers": 0},
    "asgd": {"train": ["--strategy", "asgd"], "servers": 0},
}
for _s in STRATEGIES.values():
    _s.setdefault("resume", list(_s["train"]))  # --elastic kept: ps with --server-replicas needs it

VERDICTS = ("continued", "stopped", "DEFECT")
DEFECTS = ("hung", "crashed", "nonfinite", "empty", "checkpoint", "unfinished", "blamed", "unnamed", "other")
# The survivors' "go on" line (parallel_trainer.cpp, every strategy):
# "elastic: world rank(s) R lost (WHY); N ranks go on (world ranks ...) after T ms: HOW (seen by ...)".
GO_ON = re.compile(r"elastic: world rank\(s\) (?P<lost>[\d, ]+) lost \((?P<why>.*)\); (?P<ranks>\d+) ranks go on "
                   r"\(world ranks (?P<members>[\d, ]+)\) after (?P<ms>\d+) ms:")
# A stall shorter than the shrink's grace: every rank, the stalled one too, answered the survivors' agreement and the
# group re-formed whole ("elastic: no rank lost (...): all N ranks answered ... and go on after T ms: ...").
KEPT_ALL = re.compile(r"elastic: no rank lost \(.*\): all (?P<ranks>\d+) ranks answered .* after (?P<ms>\d+) ms:")
# A lost parameter server whose shard a replica (or the checkpoint) gave back: "elastic: lost parameter server(s) ...".
SERVER_BACK = re.compile(r"elastic: lost parameter server\(s\) ")
# Rank 0's text report (not --json: its "training ..." line, printed once every rank joined and the trainer exists,
# marks the start of training): "epoch E: train loss L acc ...", then "  S world W = dp D x pp P" or
# "  S world W = K worker(s) + M server(s)". After world rank 0 is lost the lowest surviving worker reports.
STARTED = re.compile(r"^\[rank 0\] training lenet5 ")
# "train loss n/a acc n/a": an epoch in which no sample was scored (the library's NaN figures).
EPOCH = re.compile(r"^\[rank \d+\] epoch (\d+): train loss (\S+) acc (n/a|\S+%)(?:.* \| (\S+) img/s)?")
WORLD = re.compile(r"^\[rank \d+\]\s+\S+ world (\d+) = (?:dp (\d+) x pp \d+|(\d+) worker\(s\) \+ \d+ server\(s\))")
# The launcher's word on a rank that ended other than with 0.
ENDED = re.compile(r"^tandem launch: rank (\d+) (?:was killed by signal (\d+)|exited with status (\d+))")
RANK_LINE = re.compile(r"^\[rank (\d+)\] (.*)")
REACTION = re.compile(r"error|fail|stopped|cannot|lost|timed out|died")
# hybrid: a rank the re-formed grid has no place for waits as a spare and exits 0 at the end (by design).
SPARE = re.compile(r"elastic: world rank (\d+) waits as a spare")


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


def common_args(a):
    return ["--model", "lenet5", "--dataset", a.dataset, "--batch", str(a.batch), "--eval-limit-batches",
            str(a.eval_batches), "--train-limit", str(a.train_limit), "--test-limit", str(a.test_limit), "--threads",
            "1", "--seed", str(SEED)]


def train_args(a, strategy, ckpt):
    return (["train"] + STRATEGIES[strategy]["train"] + ["--min-ranks", str(MIN_RANKS)] + common_args(a) +
            ["--epochs", str(a.epochs), "--limit-batches", str(a.batches), "--checkpoint", ckpt])


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
    """{epoch: {"train_loss": float, "world": int or None, "workers": int or None, "t_s": arrival}} from the
    reporting rank's text report."""
    out = {}
    last = None
    for t, line in lines:
        m = EPOCH.match(line)
        if m:
            unscored = m.group(2) == "n/a"  # nothing scored: an empty report, not a NaN loss
            try:
                loss = 0.0 if unscored else float(m.group(2))
            except ValueError:
                loss = float("nan")
            last = int(m.group(1))
            out[last] = {"train_loss": loss, "world": None, "workers": None, "t_s": t,
                         "empty": unscored or (loss == 0 and m.group(3) == "0.00%" and m.group(4) == "0")}
            continue
        m = WORLD.match(line)
        if m and last is not None and out[last]["world"] is None:
            out[last]["world"] = int(m.group(1))
            out[last]["workers"] = int(m.group(2) or m.group(3))
    return out


def resume_once(a, strategy, path, nprocs):
    cmd = [a.cli, "launch", "-n", str(nprocs), "--transport", "tcp", "--", a.cli, "train", "--json"] + \
        STRATEGIES[strategy]["resume"] + common_args(a) + \
        ["--epochs", str(a.epochs + 1), "--limit-batches", "1", "--resume", path]
    env = {k: v for k, v in job_env(a).items() if not k.startswith("TANDEM_") or k == "TANDEM_TIMEOUT_MS"}
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=120,
                           start_new_session=True)
    except subprocess.TimeoutExpired:
        return None, "resuming it did not finish within 120 s"
    return p.returncode, p.stdout


def check_checkpoint(a, strategy, path):
    """('none' | 'loads' | 'corrupt' | 'unchecked', why): the checkpoint resumed by the same strategy on 4 ranks (or at
    the number of workers the file is bound to, which the refusal names) for one step past the trained epochs."""
    if not os.path.exists(path):
        return "none", ""
    rc, out = resume_once(a, strategy, path, RANKS)
    m = re.search(r"resume with (\d+) workers?", out or "")
    if rc not in (0, None) and m:
        rc, out = resume_once(a, strategy, path, int(m.group(1)) + STRATEGIES[strategy]["servers"])
    if rc is None:
        return "corrupt", out
    if rc != 0:
        tail = out.strip().splitlines()[-4:]
        # Only a refusal of the file is a defect of the checkpoint; anything else is this check failing.
        return ("corrupt" if "cannot resume" in out else "unchecked"), tail
    for line in out.splitlines():
        m = RANK_LINE.match(line)
        body = m.group(2) if m else line
        if body.startswith("{") and '"train_loss":null' in body.replace(" ", ""):
            return "corrupt", "resumed training gives a NaN loss: " + body
    return "loads", ""


def names_victim(text, victim):
    """A line that reports a failure and names world rank `victim` ("world rank(s) 1, 3 lost", "world rank 3",
    "parameter server 0 (world rank 3) was lost", "rank 2 ...")."""
    pat = re.compile(r"\branks?(?:\(s\))? (?:\d+, )*%d\b" % victim)
    return bool(REACTION.search(text) and pat.search(text))


def ended_by_launcher(lines):
    """{rank: ("signal", n) | ("status", s)} for the ranks the launcher saw end other than with 0."""
    out = {}
    for _, line in lines:
        m = ENDED.match(line)
        if m:
            out[int(m.group(1))] = ("signal", int(m.group(2))) if m.group(2) else ("status", int(m.group(3)))
    return out


def judge(a, rec, lines, epochs, rc, state, victim, mode, fault_landed):
    """(verdict, defect kind or None, why)."""
    if rc is None:
        return "DEFECT", "hung", "the trial ran past %s s" % a.trial_timeout
    ended = ended_by_launcher(lines)
    for r, (how, n) in sorted(ended.items()):
        if how == "signal" and not (r == victim and n == signal.SIGKILL and mode in ("kill", "stall-kill")):
            return "DEFECT", "crashed", "rank %d was killed by signal %d" % (r, n)
    complete = sorted(epochs) == list(range(1, a.epochs + 1))
    if any(not math.isfinite(e["train_loss"]) for e in epochs.values()):
        return "DEFECT", "nonfinite", "an epoch's training loss is not finite"
    if any(e["empty"] for e in epochs.values()):
        return "DEFECT", "empty", "an epoch reports no sample scored (epochs %s)" % sorted(
            k for k, e in epochs.items() if e["empty"])
    if state == "corrupt":
        return "DEFECT", "checkpoint", "the checkpoint does not resume"
    by_rank = {}
    for _, line in lines:
        m = RANK_LINE.match(line)
        if m:
            by_rank.setdefault(int(m.group(1)), []).append(m.group(2))
    naming = {r for r, ls in by_rank.items() if r != victim and any(names_victim(l, victim) for l in ls)}
    go_ons = [GO_ON.search(l) for _, l in lines]
    go_ons = [m for m in go_ons if m]
    declared_lost = any(victim in [int(x) for x in m.group("lost").split(",")] for m in go_ons) or \
        any(SERVER_BACK.search(l) and re.search(r"world rank %d\b" % victim, l) for _, l in lines)
    # The survivors re-formed with every rank (the victim came back within the shrink's grace): it goes on with them.
    kept = any(KEPT_ALL.search(l) for _, l in lines) and not declared_lost
    zero = [r for r in range(RANKS) if r not in ended]
    spares = {int(m.group(1)) for m in (SPARE.search(l) for _, l in lines) if m}
    # Every rank, the victim too, exited 0 with every epoch reported and nobody re-formed: a stall during the last
    # checkpoint's write, where the ranks that waited for the victim gave the save up (rank 0 had written the file)
    # and ended with the others -- nobody was excluded, so the victim finishing is right.
    if fault_landed and rc == 0 and complete and not go_ons and not ended:
        return "continued", None, ""
    if fault_landed:
        if victim in zero and (declared_lost or naming) and not kept:
            return "DEFECT", "unfinished", "rank %d exited 0 after the others declared it lost" % victim
        if go_ons:
            members = {int(x) for x in go_ons[-1].group("members").split(",")}
            outside = [r for r in zero if r not in members and r != victim and r not in spares]
            if outside:
                return "DEFECT", "unfinished", "rank(s) %s exited 0 outside the last membership %s" % (
                    outside, sorted(members))
    if zero and not complete:
        return "DEFECT", "unfinished", "rank(s) %s exited 0 but the report has epochs %s of %d" % (
            zero, sorted(epochs), a.epochs)
    survivors = [r for r in range(RANKS) if r != victim]
    if fault_landed:
        # One fault, one culprit: a rank that was not hit and ended with an error must say the victim was lost (its
        # last error line: the CLI's "tandem: ..." or the library's last "[tandem error]"); while the job went on,
        # no innocent rank may be dropped at all.
        for r in survivors:
            if r not in ended or ended[r][0] != "status":
                continue
            mine = by_rank.get(r, [])
            final = [l for l in mine if l.startswith("tandem: ")] or [l for l in mine if "[tandem error]" in l]
            if rc == 0:
                return "DEFECT", "blamed", "rank %d was not hit but ended with status %d while the job went on: %s" % (
                    r, ended[r][1], final[-1][:300] if final else "(no error line)")
            if not final or not names_victim(final[-1], victim):
                return "DEFECT", "blamed", "rank %d stopped without naming rank %d: %s" % (
                    r, victim, final[-1][:300] if final else "(no error line)")
    if fault_landed and (naming or rc != 0):
        silent = [r for r in survivors if r not in naming]
        if silent:
            return "DEFECT", "unnamed", "survivor(s) %s never named rank %d" % (silent, victim)
    if rc == 0 and complete:
        return "continued", None, ""
    if rc != 0 and fault_landed:
        return "stopped", None, ""
    return "DEFECT", "other", "exit %s, epochs %s" % (rc, sorted(epochs))


def run_trial(a, strategy, transport, idx, window, rng, tmp):
    ckpt = os.path.join(tmp, "t%d.ckpt" % idx)
    mode = rng.choice(a.modes)
    servers = STRATEGIES[strategy]["servers"]
    victims = [v for v in a.victim_ranks if a.roles == "any" or (v >= RANKS - servers) == (a.roles == "server")]
    victim = rng.choice(victims or a.victim_ranks)
    at = rng.uniform(*window)  # seconds after training started
    cmd = [a.cli, "launch", "-n", str(RANKS), "--min-ranks", str(MIN_RANKS), "--transport", transport, "--",
           a.cli] + train_args(a, strategy, ckpt)
    job = Job(cmd, job_env(a))
    rec = {"strategy": strategy, "transport": transport, "trial": idx, "mode": mode, "rank": victim,
           "role": "server" if victim >= RANKS - servers else "worker", "at_s": round(at, 3)}
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
    rec["final_workers"] = last.get("workers") if last else None
    rec["final_loss"] = last.get("train_loss") if last else None
    rec["recovery_ms"] = None
    rec["reformed_in_ms"] = None
    go_ons = []
    for t, line in lines:
        m = GO_ON.search(line)
        if m:
            go_ons.append({"t_s": round(t, 3), "lost": m.group("lost"), "ranks": int(m.group("ranks")),
                           "reported_ms": int(m.group("ms"))})
        elif SERVER_BACK.search(line):
            go_ons.append({"t_s": round(t, 3), "server_back": True, "reported_ms": None})
        elif KEPT_ALL.search(line):
            go_ons.append({"t_s": round(t, 3), "kept_all": True, "reported_ms": int(KEPT_ALL.search(line).group("ms"))})
    rec["go_on"] = go_ons
    if fault_t is not None:
        after = [g for g in go_ons if g["t_s"] >= fault_t]
        if after:
            rec["recovery_ms"] = round(1000 * (after[0]["t_s"] - fault_t))
            rec["reformed_in_ms"] = after[0]["reported_ms"]
    state, why = check_checkpoint(a, strategy, ckpt) if rc is not None or os.path.exists(ckpt) else ("none", "")
    rec["checkpoint"] = state
    if why:
        rec["checkpoint_error"] = why
    verdict, defect, why = judge(a, rec, lines, epochs, rc, state, victim, mode, fault_t is not None)
    rec["verdict"] = verdict
    rec["defect"] = defect
    if why:
        rec["why"] = why
    if verdict != "continued" or a.keep_output:  # a stop is kept too: its errors are worth reading
        rec["output_tail"] = [l for _, l in lines[-60:]]
    try:
        os.remove(ckpt)
    except OSError:
        pass
    return rec


def calibrate(a, strategy, transport, tmp):
    """A clean run: how long training lasts after rank 0's "training ..." line (its last epoch line); or the text
    of its failure."""
    ckpt = os.path.join(tmp, "calibrate.ckpt")
    cmd = [a.cli, "launch", "-n", str(RANKS), "--min-ranks", str(MIN_RANKS), "--transport", transport, "--",
           a.cli] + train_args(a, strategy, ckpt)
    job = Job(cmd, job_env(a))
    job.find_pids(30)
    rc = job.wait(a.trial_timeout)
    started = next((t for t, line in job.lines if STARTED.search(line)), None)
    epochs = epochs_of(job.lines)
    if rc != 0 or started is None or sorted(epochs) != list(range(1, a.epochs + 1)):
        return "calibration run of %s over %s failed (exit %s):\n%s" % (strategy, transport, rc, job.text())
    state, why = check_checkpoint(a, strategy, ckpt)  # the checker must accept an uninterrupted run's checkpoint
    if state != "loads":
        return "the checkpoint of the calibration run of %s over %s does not pass the check (%s): %s" % (
            strategy, transport, state, why)
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
    """One row per (strategy, transport, role of the victim)."""
    out = {}
    keys = sorted({(r["strategy"], r["transport"], r["role"]) for r in trials},
                  key=lambda k: (list(STRATEGIES).index(k[0]), k[1], k[2] != "worker"))
    for key in keys:
        rows = [r for r in trials if (r["strategy"], r["transport"], r["role"]) == key]
        landed = [r for r in rows if r["fault_s"] is not None]
        s = {"strategy": key[0], "transport": key[1], "role": key[2], "trials": len(rows),
             "no_fault": len(rows) - len(landed)}
        for v in VERDICTS:  # among the trials whose fault landed
            s[v] = sum(1 for r in landed if r["verdict"] == v)
        s["defects"] = {d: sum(1 for r in landed if r["defect"] == d) for d in DEFECTS}
        s["defects"] = {d: n for d, n in s["defects"].items() if n}
        for kind, modes in (("kill", ("kill",)), ("stall", ("stall-cont", "stall-kill"))):
            rec = [r["recovery_ms"] for r in rows if r["mode"] in modes and r["recovery_ms"] is not None]
            s["recovery_%s_ms" % kind] = {"n": len(rec), "median": statistics.median(rec) if rec else None,
                                          "p90": pct(rec, 0.9), "max": max(rec) if rec else None}
        s["no_reforming"] = sum(1 for r in landed if r["verdict"] == "continued" and r["recovery_ms"] is None)
        out["%s/%s/%s" % key] = s
    return out


def fmt_ms(d):
    if not d["n"]:
        return "–"
    return "%d / %d / %d (n=%d)" % (d["median"], d["p90"], d["max"], d["n"])


def table(summary):
    rows = ["| strategy | transport | victim | trials | faults landed | continued | stopped cleanly | DEFECT | "
            "death → resumed, kill: median / p90 / max ms | stall (incl. the deadline): median / p90 / max ms |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary.values():
        defects = ", ".join("%d %s" % (n, d) for d, n in s["defects"].items())
        rows.append("| %s | %s | %s | %d | %d | %d | %d | %s | %s | %s |" % (
            s["strategy"], s["transport"], s["role"], s["trials"], s["trials"] - s["no_fault"], s["continued"],
            s["stopped"], "%d (%s)" % (s["DEFECT"], defects) if s["DEFECT"] else "0", fmt_ms(s["recovery_kill_ms"]),
            fmt_ms(s["recovery_stall_ms"])))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default="tandem", help="the tandem executable")
    ap.add_argument("--strategy", default="ddp", help="comma-separated names of the table (%s), or all" %
                    ", ".join(STRATEGIES))
    ap.add_argument("--trials", type=int, default=100, help="trials per strategy and transport")
    ap.add_argument("--transports", default="tcp,ucx")
    ap.add_argument("--modes", default="kill,stall-cont,stall-kill",
                    help="faults drawn from (comma-separated): kill, stall-cont, stall-kill")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--victims", default="0,1,2,3",
                    help="world ranks a fault may hit, one drawn per trial (default every rank: tandem launch serves "
                    "the rendezvous store, so rank 0 is survived too)")
    ap.add_argument("--roles", default="any", choices=("any", "worker", "server"),
                    help="draw the victim among the workers or the servers only (with --victims)")
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
                    "(default: from a clean calibration run per strategy and transport)")
    ap.add_argument("--json", default=None, help="write the trials and the summary here")
    ap.add_argument("--keep-output", action="store_true", help="keep every trial's last output lines in the JSON")
    ap.add_argument("--table", nargs="+", metavar="JSON", default=None,
                    help="print the table of earlier runs' --json files together (one run per strategy, say) and exit")
    ap.add_argument("--require", action="store_true",
                    help="exit 1 unless every trial continued or stopped cleanly (for CTest)")
    ap.add_argument("--known", default="",
                    help="with --require: DEFECT kinds (comma-separated) that are known and open; their trials are "
                    "printed as warnings instead of failing the run (say where each is written down)")
    a = ap.parse_args()
    if a.table:
        trials = []
        for path in a.table:
            with open(path) as f:
                trials += json.load(f)["trials"]
        print(table(summarize(trials)))
        return 0
    a.modes = [m for m in a.modes.split(",") if m]
    a.known_defects = [k for k in a.known.split(",") if k]
    for k in a.known_defects:
        if k not in DEFECTS:
            ap.error("--known: '%s' is not a DEFECT kind (%s)" % (k, ", ".join(DEFECTS)))
    a.strategies = list(STRATEGIES) if a.strategy == "all" else [s for s in a.strategy.split(",") if s]
    for s in a.strategies:
        if s not in STRATEGIES:
            ap.error("--strategy: '%s' is not one of %s, or all" % (s, ", ".join(STRATEGIES)))
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
    failed_calibration = []
    with tempfile.TemporaryDirectory(prefix="tandem-chaos-") as tmp:
        for strategy in a.strategies:
            for transport in a.transports.split(","):
                key = "%s/%s" % (strategy, transport)
                if a.window:
                    lo, hi = (float(x) for x in a.window.split(","))
                    windows[key] = {"start_s": lo, "end_s": hi}
                else:
                    windows[key] = calibrate(a, strategy, transport, tmp)
                    if isinstance(windows[key], str):  # the other strategies still run; the exit status says it
                        print("FAILED: " + windows[key], flush=True)
                        failed_calibration.append(key)
                        continue
                w = windows[key]
                print("%s: fault moment drawn from [%.2f, %.2f] s after training started" % (
                    key, w["start_s"], w["end_s"]), flush=True)
                for i in range(a.trials):
                    rec = run_trial(a, strategy, transport, i, (w["start_s"], w["end_s"]), rng, tmp)
                    trials.append(rec)
                    print("%s #%d %s %s %d at %.2f s: %s%s (exit %s, %s s, recovery %s ms, checkpoint %s)%s%s" % (
                        key, i, rec["mode"], rec["role"], rec["rank"], rec["at_s"], rec["verdict"],
                        " " + rec["defect"] if rec["defect"] else "", rec["rc"], rec["wall_s"], rec["recovery_ms"],
                        rec["checkpoint"], "" if "note" not in rec else " -- " + rec["note"],
                        "" if "why" not in rec else " -- " + rec["why"]), flush=True)
                    if rec["verdict"] == "DEFECT":
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
    for k, s in summary.items():
        if s["no_reforming"] or s["no_fault"]:
            print("%s: %d trial(s) continued without re-forming (the fault came after the last step); %d fault(s) "
                  "found the job over already (not counted in the verdict columns)" % (k, s["no_reforming"],
                                                                                        s["no_fault"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "summary": summary, "trials": trials}, f, indent=1)
    if failed_calibration:
        print("FAILED: the clean calibration run of %s failed (above)" % ", ".join(failed_calibration))
        return 1
    if a.require:
        # A trial whose fault never landed is judged only on hanging, crashing and its checkpoint: a job that failed
        # on its own before training (a rank too slow to join within the deadline on a loaded machine) is reported,
        # not a verdict on fault handling.
        bad = [r for r in trials if r["verdict"] == "DEFECT" and
               (r["fault_s"] is not None or r["defect"] in ("hung", "crashed", "checkpoint", "nonfinite"))]
        for r in [r for r in bad if r["defect"] in a.known_defects]:
            print("WARNING: %s/%s #%d: known open DEFECT %s: %s" % (r["strategy"], r["transport"], r["trial"],
                                                                   r["defect"], r.get("why")))
        bad = [r for r in bad if r["defect"] not in a.known_defects]
        for r in trials:
            if r["fault_s"] is None and r["verdict"] == "DEFECT" and r not in bad:
                print("WARNING: %s/%s #%d failed before its fault (%s)" % (r["strategy"], r["transport"], r["trial"],
                                                                           r.get("note")))
        if bad:
            print("FAILED: %d trial(s) neither continued nor stopped cleanly" % len(bad))
            return 1
        for k, s in summary.items():
            if 2 * s["no_fault"] > s["trials"]:
                print("FAILED: %s: %d of %d faults found the job over: the run proves nothing" % (
                    k, s["no_fault"], s["trials"]))
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
