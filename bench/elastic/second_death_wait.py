"""How long the survivors of a rank killed by a signal wait before they go on, when that rank was nobody's first
failure (issue #17; tests/integration/test_elastic_cli.py, test_a_rank_0_killed_right_after_reporting_an_epoch_is_not_
reported_again): `tandem launch -n 4 --min-ranks 2 --transport tcp -- tandem train --strategy ddp --elastic` (LeNet-5,
synthetic, 1 epoch of 8 steps, TANDEM_TIMEOUT_MS 10000); world rank 1 leaves after the epoch's evaluation
(TANDEM_TEST_REFORM_LEAVE=1:evaluated) and world rank 0 SIGKILLs itself right after reporting the epoch
(TANDEM_TEST_KILL_AFTER_REPORT=1). Prints, per trial, the seconds from rank 0's line that it kills itself to the
survivors' 'elastic: world rank(s) 0, 1 lost', and whether a survivor waited out the agreement's window ('did not take
part within'); then the median.

  python3 bench/elastic/second_death_wait.py --cli build/default/bin/tandem --trials 3
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
import unittest

ap = argparse.ArgumentParser()
ap.add_argument("--cli", required=True)
ap.add_argument("--trials", type=int, default=3)
args = ap.parse_args()
os.environ["TANDEM_CLI"] = os.path.abspath(args.cli)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "integration"))
import test_elastic_cli as t  # noqa: E402 (reads TANDEM_CLI when imported)


class Bounded(unittest.TestCase):  # run_launch reports a run past its limit through a test case
    def runTest(self):
        pass


train = t.train_with({"--epochs": "1", "--limit-batches": "8"})
waits = []
for i in range(args.trials):
    stamps = {}

    def on_line(pid, line):
        now = time.monotonic()
        if "kills itself" in line:
            stamps.setdefault("kill", now)
        if "elastic: world rank(s) 0, 1 lost" in line:
            stamps.setdefault("reformed", now)
        if "did not take part within" in line:
            stamps.setdefault("waited", line.strip())

    with tempfile.TemporaryDirectory() as d:
        rc, _ = t.run_launch(Bounded(), ["-n", "4", "--min-ranks", "2", "--transport", "tcp"], on_line,
                             train=train + ["--checkpoint", os.path.join(d, "job.ckpt")],
                             extra_env={"TANDEM_TEST_REFORM_LEAVE": "1:evaluated", "TANDEM_TEST_KILL_AFTER_REPORT": "1"})
    wait = stamps.get("reformed", float("nan")) - stamps.get("kill", float("nan"))
    waits.append(wait)
    print("trial %d: exit %d, survivors went on %.2f s after the kill; waited out the window: %s"
          % (i, rc, wait, stamps.get("waited", "no")), flush=True)
print("median %.2f s over %d trials" % (statistics.median(waits), len(waits)))
