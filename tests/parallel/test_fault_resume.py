"""A rank of a hybrid 2x2 `tandem train` job killed mid-epoch (SIGKILL), through `tandem launch`: every other rank
exits within its deadline with an error naming the dead rank, the launcher returns non-zero, the checkpoint of the
last finished epoch is intact, and resuming from it (same world size) finishes the run exactly as a run that was
never interrupted (deterministic reductions). Run by CTest with TANDEM_CLI set; standard library only."""
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

CLI = os.environ.get("TANDEM_CLI", "tandem")
DEADLINE_MS = 5000  # every communicator's deadline in these jobs
EPOCHS = 3
TRAIN = ["train", "--json", "--strategy", "hybrid", "--dp", "2", "--pp", "2", "--microbatches", "2",
         "--model", "lenet5", "--dataset", "synthetic", "--batch", "16", "--limit-batches", "150",
         "--eval-limit-batches", "4", "--threads", "1", "--seed", "5", "--epochs", str(EPOCHS)]


def env():
    return dict(os.environ, TANDEM_TIMEOUT_MS=str(DEADLINE_MS), TANDEM_DETERMINISTIC="1", OMP_NUM_THREADS="1")


def launch(extra, grace_ms=3000):
    return subprocess.Popen([CLI, "launch", "-n", "4", "--grace-ms", str(grace_ms), "--", CLI] + TRAIN + extra,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), bufsize=1)


def epochs_of(lines):
    out = {}
    for line in lines:
        m = re.match(r"\[rank 0\] (\{.*\})$", line.strip())
        if m:
            j = json.loads(m.group(1))
            out[j["epoch"]] = j
    return out


def rank_pid(launcher_pid, rank):
    """The pid of the launcher's child whose environment says TANDEM_RANK=rank."""
    with open("/proc/%d/task/%d/children" % (launcher_pid, launcher_pid)) as f:
        children = [int(p) for p in f.read().split()]
    for pid in children:
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if b"TANDEM_RANK=%d\0" % rank in f.read():
                    return pid
        except OSError:
            pass
    raise AssertionError("no child of the launcher has TANDEM_RANK=%d" % rank)


class FaultResume(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.ckpt = os.path.join(self.tmp.name, "job.ckpt")

    def tearDown(self):
        self.tmp.cleanup()

    def test_killed_rank_is_named_and_the_checkpoint_resumes_the_run(self):
        # The run as it should be, never interrupted.
        p = launch([])
        straight, _ = p.communicate(timeout=600)
        self.assertEqual(p.returncode, 0, straight)
        want = epochs_of(straight.splitlines())
        self.assertEqual(sorted(want), list(range(1, EPOCHS + 1)), straight)

        # The same job, rank 2 killed during epoch 2 (after epoch 1's line and checkpoint).
        p = launch(["--checkpoint", self.ckpt], grace_ms=DEADLINE_MS + 10000)
        lines = []
        killed_at = None
        try:
            for line in p.stdout:
                lines.append(line)
                first = epochs_of([line]).get(1)
                if killed_at is None and first:
                    # Into epoch 2, a third of an epoch in (epoch 1's wall time: a fixed sleep let
                    # epoch 2 finish first on a quiet machine, where an epoch takes under 0.2 s).
                    time.sleep(first["wall_s"] / 3)
                    os.kill(rank_pid(p.pid, 2), signal.SIGKILL)
                    killed_at = time.monotonic()
            p.wait(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        out = "".join(lines)
        self.assertIsNotNone(killed_at, out)
        took = time.monotonic() - killed_at
        self.assertNotEqual(p.returncode, 0, out)
        self.assertNotIn(2, epochs_of(lines), "the kill must land inside epoch 2:\n" + out)
        self.assertLess(took, DEADLINE_MS / 1000 + 10, out)
        for r in (0, 1, 3):
            errors = [l for l in lines if l.startswith("[rank %d] tandem:" % r)]
            self.assertTrue(errors, "rank %d printed no error:\n%s" % (r, out))
            self.assertTrue(any("rank 2" in l for l in errors), "rank %d does not name rank 2:\n%s" % (r, out))

        # The checkpoint is the one of epoch 1, intact; resuming finishes epochs 2 and 3 as the straight run did.
        self.assertTrue(os.path.exists(self.ckpt))
        p = launch(["--checkpoint", self.ckpt, "--resume", self.ckpt])
        resumed, _ = p.communicate(timeout=600)
        self.assertEqual(p.returncode, 0, resumed)
        got = epochs_of(resumed.splitlines())
        self.assertEqual(sorted(got), list(range(2, EPOCHS + 1)), resumed)
        for e in (2, 3):
            for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
                self.assertEqual(got[e][key], want[e][key], "epoch %d %s after resuming" % (e, key))


class DivergedRun(unittest.TestCase):
    """A run that diverges under `tandem launch` (resumed with --lr 1e9) must not overwrite the last good checkpoint
    with NaN weights: the write is collective and a rank's loss its own (rank 0 of ps sees a finite loss only until
    the servers' NaN parameters come back), so every rank agrees before writing and every rank fails naming the
    step; the launcher exits non-zero. It wrote the NaN checkpoint and exited 0 before."""

    def run_job(self, strategy, extra):
        cmd = [CLI, "launch", "-n", "3", "--", CLI, "train", "--model", "lenet5", "--dataset", "synthetic",
               "--optimizer", "adamw", "--limit-batches", "3", "--test-limit", "10", "--threads", "1",
               "--strategy"] + strategy + extra
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), timeout=300)
        return p.returncode, p.stdout

    def test_a_diverged_run_keeps_the_last_checkpoint_on_every_rank(self):
        for strategy in (["ps", "--servers", "1"], ["localsgd", "--average-every", "8"]):
            with self.subTest(strategy=strategy[0]), tempfile.TemporaryDirectory() as d:
                ckpt = os.path.join(d, "job.ckpt")
                rc, out = self.run_job(strategy, ["--epochs", "1", "--checkpoint", ckpt])
                self.assertEqual(rc, 0, out)
                with open(ckpt, "rb") as f:
                    good = f.read()
                rc, out = self.run_job(strategy, ["--epochs", "2", "--lr", "1e9", "--checkpoint", ckpt,
                                                  "--resume", ckpt])
                self.assertNotEqual(rc, 0, out)
                for r in range(3):
                    errors = [l for l in out.splitlines() if l.startswith("[rank %d] tandem:" % r)]
                    self.assertTrue(any("the model diverged by step 6 (2 epochs completed)" in l for l in errors),
                                    "rank %d does not name the step:\n%s" % (r, out))
                with open(ckpt, "rb") as f:
                    self.assertEqual(f.read(), good, "the last good checkpoint was overwritten:\n" + out)


if __name__ == "__main__":
    unittest.main()
