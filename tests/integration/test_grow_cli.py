"""Elastic growth through the command line (issue #17): `tandem launch -n 2 --max-ranks 4 --secret-file F -- tandem
train --strategy ddp --elastic` over tcp on loopback; after its first epoch `tandem launch --join -n 2 --secret-file F`
starts two more ranks that join at a step boundary, and the job ends as a world of 4 (learning rate x 2). A joiner
with a wrong secret is refused before that, and a fifth rank after it (--max-ranks 4). Growth also works after rank 0
died (the launcher serves the store), a hybrid DP x PP grid grows by whole rows, and a parameter-server job grows by
workers. Run by CTest with TANDEM_CLI
set; standard library only. Every process is bounded by a timeout and killed by PID."""
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import unittest

from test_elastic_cli import epochs_of, launch_and_kill, run_launch

CLI = os.environ.get("TANDEM_CLI", "tandem")
EPOCHS = 8
TRAIN = ["train", "--json", "--strategy", "ddp", "--elastic", "--model", "lenet5", "--dataset", "synthetic",
         "--batch", "16", "--limit-batches", "400", "--eval-limit-batches", "4", "--threads", "1", "--seed", "5",
         "--epochs", str(EPOCHS)]

# Parameter servers (issue #17): ps with 2 workers and 1 server (the last rank) grows by workers.
PS = [w for w in TRAIN if w != "ddp"]
PS[PS.index("--strategy") + 1:PS.index("--strategy") + 1] = ["ps", "--servers", "1"]

# Hybrid DP x PP (issue #17): a grid of pp = 2 stages that grows by whole rows.
HYBRID = [w for w in TRAIN if w != "ddp"]
HYBRID[HYBRID.index("--strategy") + 1:HYBRID.index("--strategy") + 1] = ["hybrid", "--pp", "2", "--microbatches", "2"]


def env(**extra):
    return dict(os.environ, TANDEM_TIMEOUT_MS="10000", OMP_NUM_THREADS="1", **extra)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_joiner(port, secret_file, n, extra_env=None, timeout=120, train=TRAIN):
    args = [CLI, "launch", "--join", "-n", str(n), "--port", str(port), "--transport", "tcp"]
    if secret_file:
        args += ["--secret-file", secret_file]
    return subprocess.run(args + ["--", CLI] + train, capture_output=True, text=True, timeout=timeout,
                          env=env(TANDEM_JOIN_WAIT_MS="60000", **(extra_env or {})))


def start_joiner(results, threads, name, *args, **kwargs):
    """run_joiner on a thread of its own (appended to `threads`); its result goes to results[name]."""
    def body():
        results[name] = run_joiner(*args, **kwargs)
    t = threading.Thread(target=body)
    t.start()
    threads.append(t)


class GrowLaunch(unittest.TestCase):
    def job_files(self):
        """A free rendezvous port and a --secret-file path in a folder removed after the test."""
        tmp = tempfile.mkdtemp(prefix="tandem_grow_")
        self.addCleanup(shutil.rmtree, tmp, True)
        return free_port(), os.path.join(tmp, "secret")

    def launch_growing(self, n, port, secret_file, on_line, train, threads):
        """`tandem launch -n N --max-ranks 4` over tcp, on_line(launcher pid, line) starting joiners on `threads` (each
        joined once the job ends); asserts that the job exited 0. Returns (lines, the merged output)."""
        try:
            rc, lines = run_launch(self, ["-n", str(n), "--max-ranks", "4", "--transport", "tcp", "--port", str(port),
                                          "--secret-file", secret_file], on_line, train=train)
        finally:
            for t in threads:
                t.join(timeout=150)
        out = "".join(lines)
        self.assertEqual(rc, 0, out)
        return lines, out

    def test_two_ranks_grow_to_four_and_finish_together(self):
        port, secret_file = self.job_files()
        results = {}
        threads = []

        def later(name, *args, **kwargs):
            start_joiner(results, threads, name, *args, **kwargs)

        def on_line(_, line):
            if "intruder" not in results and epochs_of([line], 0).get(1):
                # Epoch 1 is over: a joiner with the wrong secret first, refused by the rendezvous.
                results["intruder"] = run_joiner(port, None, 1, {"TANDEM_SECRET": "not-the-secret"}, timeout=60)
                later("joiners", port, secret_file, 2)
            if "joined at step" in line and "4 ranks go on" in line and "late" not in results:
                later("late", port, secret_file, 1)
                results["late"] = None

        lines, out = self.launch_growing(2, port, secret_file, on_line, TRAIN, threads)
        intruder = results["intruder"]
        self.assertNotEqual(intruder.returncode, 0, intruder.stdout + intruder.stderr)
        self.assertRegex(intruder.stdout + intruder.stderr, r"(?i)secret|auth")
        joiners = results["joiners"]
        self.assertEqual(joiners.returncode, 0, joiners.stdout + joiners.stderr)
        late = results["late"]
        self.assertIsNotNone(late, out)
        self.assertNotEqual(late.returncode, 0, late.stdout + late.stderr)
        self.assertIn("--max-ranks is 4", late.stdout + late.stderr)
        # Rank 0's report: the first epoch as a world of 2, the last as a world of 4 with the learning rate x 2.
        epochs = epochs_of(lines, 0)
        self.assertEqual(sorted(epochs), list(range(1, EPOCHS + 1)), out)
        self.assertEqual(epochs[1]["world"], 2, out)
        last = epochs[EPOCHS]
        self.assertEqual(last["world"], 4, out)
        self.assertAlmostEqual(last["lr_scale"], 2.0, places=6)
        self.assertTrue(last["train_loss"] is not None and last["train_loss"] < epochs[1]["train_loss"], out)
        # Both joiners in one admission, or one after the other at the same step boundary (2 -> 3 -> 4).
        self.assertRegex(out, r"elastic: [12] rank\(s\) joined at step \d+; 4 ranks go on")

    def test_the_launch_size_bounds_the_job_without_max_ranks(self):
        # `tandem launch -n 2` bounds its job at 2 ranks (--max-ranks defaults to -n), yet an elastic ddp job admitted
        # a joiner and grew to 3 (the ranks got no bound). The joiner is refused now, naming the bound, and no longer
        # warns that it trains on a single rank.
        port, secret_file = self.job_files()
        results = {}
        threads = []

        def on_line(_, line):
            if "joiner" not in results and epochs_of([line], 0).get(1):
                results["joiner"] = None
                start_joiner(results, threads, "joiner", port, secret_file, 1)

        try:
            rc, lines = run_launch(self, ["-n", "2", "--transport", "tcp", "--port", str(port), "--secret-file",
                                          secret_file], on_line, train=TRAIN)
        finally:
            for t in threads:
                t.join(timeout=150)
        out = "".join(lines)
        self.assertEqual(rc, 0, out)
        joiner = results.get("joiner")
        self.assertIsNotNone(joiner, out)
        said = joiner.stdout + joiner.stderr
        self.assertNotEqual(joiner.returncode, 0, said)
        self.assertIn("--max-ranks is 2", said)
        self.assertNotIn("on a single rank", said)
        self.assertNotIn("joined at step", out)
        self.assertEqual(epochs_of(lines, 0)[EPOCHS]["world"], 2, out)

    def test_after_rank_0_dies_the_survivors_still_admit_a_joiner(self):
        # The launcher serves the store, so rank 0's death is survived (3 -> 2, old rank 1 becomes rank 0) and the
        # job's store still takes joiners: one joins the 2 survivors and the job ends as a world of 3.
        port, secret_file = self.job_files()
        results = {}
        threads = []

        def on_line(line, _):
            if not threads and "2 ranks go on" in line:
                def body():
                    results["joiner"] = run_joiner(port, secret_file, 1)
                threads.append(threading.Thread(target=body))
                threads[0].start()

        try:
            args = ["-n", "3", "--min-ranks", "2", "--max-ranks", "3", "--transport", "tcp", "--port", str(port),
                    "--secret-file", secret_file]
            rc, lines, _ = launch_and_kill(self, args, 0, train=TRAIN, on_line=on_line)
        finally:
            for t in threads:
                t.join(timeout=150)
        out = "".join(lines)
        self.assertEqual(rc, 0, out)
        self.assertIn("elastic: world rank(s) 0 lost", out)
        joiner = results.get("joiner")
        self.assertIsNotNone(joiner, out)
        self.assertEqual(joiner.returncode, 0, joiner.stdout + joiner.stderr)
        self.assertRegex(out, r"elastic: 1 rank\(s\) joined at step \d+; 3 ranks go on")
        epochs = epochs_of(lines, 1)  # old rank 1 reports once rank 0 is gone
        last = epochs[EPOCHS]
        self.assertEqual(last["world"], 3, out)
        self.assertTrue(last["train_loss"] is not None and last["train_loss"] < epochs_of(lines, 0)[1]["train_loss"],
                        out)

    def test_a_hybrid_1x2_grows_to_2x2_and_a_lone_joiner_waits_for_a_whole_row(self):
        # A hybrid grid of 1 x 2 (dp x pp) over tcp. After epoch 1 one joiner asks: 3 ranks make no wider grid, so it
        # waits while the job trains on at 1 x 2; after epoch 2 a second one completes a row and both come in at one
        # step boundary: 2 x 2 (learning rate x 2), each new replica given its stage's state.
        port, secret_file = self.job_files()
        results = {}
        threads = []

        def later(name, *args):
            start_joiner(results, threads, name, *args, train=HYBRID)

        def on_line(_, line):
            epochs = epochs_of([line], 0)
            if epochs.get(1) and "first" not in results:
                results["first"] = None
                later("first", port, secret_file, 1)
            if epochs.get(2) and "second" not in results:
                results["second"] = None
                later("second", port, secret_file, 1)

        lines, out = self.launch_growing(2, port, secret_file, on_line, HYBRID, threads)
        for name in ("first", "second"):
            r = results.get(name)
            self.assertIsNotNone(r, out)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        epochs = epochs_of(lines, 0)
        self.assertEqual(sorted(epochs), list(range(1, EPOCHS + 1)), out)
        self.assertEqual((epochs[1]["world"], epochs[1]["dp"], epochs[1]["pp"]), (1 * 2, 1, 2), out)
        self.assertEqual(epochs[2]["world"], 2, out)  # the first joiner waited through epoch 2
        last = epochs[EPOCHS]
        self.assertEqual((last["world"], last["dp"], last["pp"]), (4, 2, 2), out)
        self.assertAlmostEqual(last["lr_scale"], 2.0, places=6)
        self.assertTrue(last["train_loss"] is not None and last["train_loss"] < epochs[1]["train_loss"], out)
        # One widening by a whole row, never 1 x 2 -> 3 ranks.
        self.assertRegex(out, r"elastic: 2 rank\(s\) admitted at step \d+; the grid widened from 1 to 2 x 2")
        self.assertNotIn("3 ranks go on", out)

    def test_a_ps_job_of_2_workers_and_a_server_grows_to_3_workers(self):
        # `tandem launch -n 3 -- tandem train --strategy ps --servers 1 --elastic`: world ranks 0 and 1 are workers,
        # 2 the server. After epoch 1 a joiner comes in as worker 2 (world rank 3; the server stays the last rank),
        # pulls the server's parameters and trains on: learning rate x 3/2, the loss keeps falling.
        port, secret_file = self.job_files()
        results = {}
        threads = []

        def on_line(_, line):
            if epochs_of([line], 0).get(1) and "joiner" not in results:
                results["joiner"] = None
                start_joiner(results, threads, "joiner", port, secret_file, 1, train=PS)

        lines, out = self.launch_growing(3, port, secret_file, on_line, PS, threads)
        joiner = results.get("joiner")
        self.assertIsNotNone(joiner, out)
        self.assertEqual(joiner.returncode, 0, joiner.stdout + joiner.stderr)
        self.assertRegex(out, r"elastic: 1 worker\(s\) joined at step \d+; 4 ranks go on \(world ranks 0, 1, 3, 2; "
                              r"3 worker\(s\) and 1 server\(s\)\)")
        epochs = epochs_of(lines, 0)
        self.assertEqual(sorted(epochs), list(range(1, EPOCHS + 1)), out)
        self.assertEqual(epochs[1]["world"], 3, out)
        last = epochs[EPOCHS]
        self.assertEqual(last["world"], 4, out)
        self.assertAlmostEqual(last["lr_scale"], 1.5, places=6)
        self.assertTrue(last["train_loss"] is not None and last["train_loss"] < epochs[1]["train_loss"], out)

    def test_a_joiner_of_a_parameter_server_job_without_elastic_is_refused_naming_the_flag(self):
        r = subprocess.run([CLI, "train", "--strategy", "ssp", "--servers", "1", "--model", "lenet5", "--dataset",
                            "synthetic", "--epochs", "1", "--threads", "1"], capture_output=True, text=True,
                           timeout=60, env=env(TANDEM_JOIN="1"))
        self.assertNotEqual(r.returncode, 0, r.stderr)
        self.assertIn("--elastic", r.stderr)
        self.assertIn("--strategy ssp without --elastic", r.stderr)

    def test_join_without_a_port_is_refused(self):
        r = subprocess.run([CLI, "launch", "--join", "-n", "1", "--", "true"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--join: give --port", r.stderr)


if __name__ == "__main__":
    unittest.main()
