"""Resume at another world size through the command line (issue #17): a checkpoint written by `tandem launch -n 2 --
tandem train --strategy ddp` resumes under `tandem launch -n 4` (dp 2 -> 4, the global batch kept: --batch halved)
and in one process (dp 2 -> 1, --batch doubled), and the resumed epoch's figures match the uninterrupted run's within
float rounding (the reduction order changes with the world). Run by CTest with TANDEM_CLI set; standard library only."""
import json
import os
import re
import subprocess
import tempfile
import unittest

CLI = os.environ.get("TANDEM_CLI", "tandem")
GLOBAL_BATCH = 32
COMMON = ["--json", "--model", "lenet5", "--dataset", "synthetic", "--limit-batches", "12", "--eval-limit-batches",
          "2", "--threads", "1", "--seed", "5", "--optimizer", "adam", "--lr", "0.001"]


def env():
    return dict(os.environ, TANDEM_TIMEOUT_MS="20000", OMP_NUM_THREADS="1")


def train(ranks, strategy, epochs, extra):
    args = ["train"] + COMMON + ["--strategy", strategy, "--batch", str(GLOBAL_BATCH // ranks),
                                 "--epochs", str(epochs)] + extra
    cmd = [CLI] + args if ranks == 1 else [CLI, "launch", "-n", str(ranks), "--", CLI] + args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), timeout=240)
    if p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stdout))
    out = {}
    for line in p.stdout.splitlines():
        m = re.match(r"(?:\[rank 0\] )?(\{.*\})$", line.strip())
        if m:
            j = json.loads(m.group(1))
            if "epoch" in j:
                out[j["epoch"]] = j
    return out


class ReshardResume(unittest.TestCase):
    def test_resumes_at_another_data_parallel_width_on_the_same_curve(self):
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = os.path.join(tmp, "dp2.ckpt")
            straight = train(2, "ddp", 2, [])
            first = train(2, "ddp", 1, ["--checkpoint", ckpt])
            self.assertIn(1, first)
            self.assertTrue(os.path.exists(ckpt))
            for ranks, strategy in ((4, "ddp"), (1, "single")):
                resumed = train(ranks, strategy, 2, ["--resume", ckpt])
                self.assertEqual(sorted(resumed), [2], "%d ranks resume at epoch 2 only: %s" % (ranks, resumed))
                a, b = resumed[2], straight[2]
                for key in ("train_loss", "test_loss"):
                    if key in a:
                        self.assertLessEqual(abs(a[key] - b[key]), 1e-4 * abs(b[key]),
                                             "%d ranks, %s: %s vs %s" % (ranks, key, a[key], b[key]))
                self.assertTrue(any(k in a for k in ("train_loss", "test_loss")), a)


if __name__ == "__main__":
    unittest.main()
