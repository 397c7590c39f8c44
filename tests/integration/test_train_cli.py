"""`tandem train` as users run it, through `tandem launch`: an explicit pipeline cut (--cut) is the cut the ranks
train with; a cut that does not fit the model is refused on every rank before any work, naming the reason; a
malformed --cut is a usage error, not a crash. Run by CTest with TANDEM_CLI set; standard library only."""
import json
import os
import subprocess
import unittest

CLI = os.environ.get("TANDEM_CLI", "tandem")
TRAIN = ["train", "--model", "lenet5", "--dataset", "synthetic", "--strategy", "pipeline", "--pp", "2",
         "--microbatches", "2", "--limit-batches", "4", "--eval-limit-batches", "1", "--epochs", "1", "--threads", "1",
         "--json"]


def launch(extra, timeout=120):
    env = dict(os.environ, TANDEM_TIMEOUT_MS="10000", OMP_NUM_THREADS="1")
    p = subprocess.run([CLI, "launch", "-n", "2", "--", CLI] + TRAIN + extra, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout, text=True)
    return p.returncode, p.stdout


class Cut(unittest.TestCase):
    def test_explicit_cut_is_the_cut_the_ranks_train_with(self):
        for cut, first in (("0,3,12", "stage 0: layers [0, 3)"), ("0,8,12", "stage 0: layers [0, 8)")):
            rc, out = launch(["--cut", cut])
            self.assertEqual(rc, 0, out)
            lines = [json.loads(l.split("] ", 1)[1]) for l in out.splitlines() if "] {" in l]
            self.assertEqual(len(lines), 1, out)
            self.assertTrue(lines[0]["partition"].startswith(first), lines[0]["partition"])
            self.assertIn("stage 1: layers [%s, 12)" % cut.split(",")[1], lines[0]["partition"])

    def test_cut_that_does_not_fit_the_model_is_refused_on_every_rank(self):
        rc, out = launch(["--cut", "0,3,11"])
        self.assertNotEqual(rc, 0, out)
        for rank in (0, 1):
            self.assertRegex(out, r"\[rank %d\] .*must run from layer 0 to 12 \(got 0 \.\. 11\)" % rank)

    def test_malformed_cut_is_a_usage_error(self):
        p = subprocess.run([CLI] + TRAIN + ["--cut", "0,x,12"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertNotEqual(p.returncode, -6, "crashed: " + p.stdout)  # SIGABRT from an uncaught exception
        self.assertIn("--cut", p.stdout)
        self.assertIn("0,x,12", p.stdout)


class CleanShutdown(unittest.TestCase):
    """A job that ends well ends quietly: ranks closing their tcp transports at about the same time used to warn
    'writing to rank N failed: Broken pipe' (a goodbye written to a peer that had already closed) in most runs."""

    def test_no_warnings_when_four_tcp_ranks_finish(self):
        ddp = ["train", "--model", "lenet5", "--dataset", "synthetic", "--strategy", "ddp", "--limit-batches", "2",
               "--eval-limit-batches", "1", "--epochs", "1", "--threads", "1"]
        env = dict(os.environ, TANDEM_TIMEOUT_MS="10000", OMP_NUM_THREADS="1")
        for _ in range(4):
            p = subprocess.run([CLI, "launch", "-n", "4", "--transport", "tcp", "--", CLI] + ddp, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, text=True)
            self.assertEqual(p.returncode, 0, p.stdout)
            self.assertNotIn("Broken pipe", p.stdout)
            self.assertNotIn("[tandem warn]", p.stdout)


class Predict(unittest.TestCase):
    """`--predict` times the trainer's own compiled job: with fp16 gradients on the wire the simulator predicts
    less communication than for the same job in f32 (it predicted the same before the job compiler)."""

    def predicted(self, compression):
        ddp = ["train", "--model", "lenet5", "--dataset", "synthetic", "--strategy", "ddp", "--limit-batches", "3",
               "--eval-limit-batches", "1", "--epochs", "1", "--threads", "1", "--json", "--compress", compression,
               "--predict", "--predict-cluster", "t2.micro:2"]
        env = dict(os.environ, TANDEM_TIMEOUT_MS="10000", OMP_NUM_THREADS="1")
        p = subprocess.run([CLI, "launch", "-n", "2", "--", CLI] + ddp, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=120, text=True)
        self.assertEqual(p.returncode, 0, p.stdout)
        found = [json.loads(l.split("] ", 1)[1])["prediction"] for l in p.stdout.splitlines()
                 if "] {" in l and '"prediction"' in l]
        self.assertEqual(len(found), 1, p.stdout)
        return found[0]

    def test_fp16_gradients_predict_less_communication(self):
        f32, f16 = self.predicted("none"), self.predicted("fp16")
        self.assertGreater(f32["predicted_comm_s"], 0.0, f32)
        self.assertLess(f16["predicted_comm_s"], 0.75 * f32["predicted_comm_s"], (f16, f32))
        self.assertEqual(f16["compression"], "fp16")
        self.assertEqual(f32["compression"], "none")


if __name__ == "__main__":
    unittest.main()
