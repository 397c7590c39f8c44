"""A lost worker absorbed through the command line (issues #13 and #17): `tandem launch -n 4 --min-ranks 3 -- tandem
train --strategy ps-async --servers 1` over tcp (workers: ranks 0-2, the server: rank 3). A worker SIGKILLed during
training: the launcher names it and exits 0, the other two workers and the server finish every epoch, and every
survivor's log names the lost rank. The server SIGKILLed instead: every worker stops with an error naming
"parameter server 0 (world rank 3)" and the launcher fails. With two servers and --server-replicas 1 (issue #17),
a SIGKILLed server's shard is taken over by the other server from its replica: synchronous ps (--elastic) and
ps-async finish every epoch with 3 ranks and the launcher exits 0. Run by CTest with TANDEM_CLI set; standard library only.
Every process is bounded by a timeout and killed by PID."""
import os
import unittest

from test_elastic_cli import epochs_of, launch_and_kill

CLI = os.environ.get("TANDEM_CLI", "tandem")
EPOCHS = 3
TRAIN = ["train", "--json", "--strategy", "ps-async", "--servers", "1", "--model", "lenet5", "--dataset", "synthetic",
         "--batch", "16", "--lr", "0.01", "--limit-batches", "40", "--eval-limit-batches", "4", "--threads", "1",
         "--seed", "5", "--epochs", str(EPOCHS)]


def kill_during_training(test, rank):
    """Runs the job; SIGKILLs `rank` once rank 0 has reported epoch 1. Returns (exit code, output lines)."""
    code, lines, _ = launch_and_kill(test, ["-n", "4", "--min-ranks", "3", "--transport", "tcp"], rank, train=TRAIN)
    return code, lines


class AbsorbLaunch(unittest.TestCase):
    def test_a_killed_worker_is_absorbed_and_the_launcher_exits_0(self):
        code, lines = kill_during_training(self, 2)
        out = "".join(lines)
        self.assertEqual(code, 0, out)
        self.assertRegex(out, r"tandem launch: rank 2 was killed by signal 9 .*the other 3 running rank\(s\) go on")
        self.assertIn("elastic job finished with 3 of 4 ranks (--min-ranks 3); lost: rank 2 (was killed by signal 9",
                      out)
        # Every survivor (workers 0 and 1, the server 3) logs the loss, naming the rank.
        for r in (0, 1, 3):
            self.assertRegex(out, r"\[rank %d\] .*elastic: world rank\(s\) 2 lost .*\(seen by world rank %d" % (r, r))
        epochs = epochs_of(lines, 0)
        self.assertEqual(sorted(epochs), list(range(1, EPOCHS + 1)), out)
        self.assertEqual(epochs[1]["world"], 4, out)
        last = epochs[EPOCHS]
        self.assertEqual(last["world"], 3, out)
        self.assertEqual(last["dp"], 2, out)
        self.assertEqual(last["lost_ranks"], 1, out)
        self.assertTrue(last["train_loss"] is not None and last["test_loss"] is not None, out)

    def test_a_killed_server_stops_every_worker_naming_it(self):
        code, lines = kill_during_training(self, 3)
        out = "".join(lines)
        self.assertNotEqual(code, 0, out)
        for r in (0, 1, 2):
            self.assertRegex(out, r"\[rank %d\] .*parameter server 0 \(world rank 3\) was lost" % r)


def replicated(strategy):
    """TRAIN as `strategy` with 2 servers (world ranks 2 and 3) and one replica of each shard."""
    out = list(TRAIN)
    out[out.index("--strategy") + 1] = strategy
    out[out.index("--servers") + 1] = "2"
    return out + ["--server-replicas", "1"] + (["--elastic"] if strategy == "ps" else [])


class ServerReplicaLaunch(unittest.TestCase):
    def check_server_loss_survived(self, strategy):
        code, lines, _ = launch_and_kill(self, ["-n", "4", "--min-ranks", "3", "--transport", "tcp"], 3,
                                         train=replicated(strategy))
        out = "".join(lines)
        self.assertEqual(code, 0, out)
        self.assertRegex(out, r"tandem launch: rank 3 was killed by signal 9 .*the other 3 running rank\(s\) go on")
        for r in (0, 1, 2):
            self.assertRegex(out, r"\[rank %d\] .*elastic: lost parameter server\(s\) world rank 3 \(server 1\): 1 "
                             r"server now hold the model's 2 shards .*each lost shard taken over from its replica" % r)
        epochs = epochs_of(lines, 0)
        self.assertEqual(sorted(epochs), list(range(1, EPOCHS + 1)), out)
        self.assertEqual(epochs[1]["world"], 4, out)
        last = epochs[EPOCHS]
        self.assertEqual(last["world"], 3, out)
        self.assertEqual(last["dp"], 2, out)  # both workers still train
        self.assertTrue(last["train_loss"] is not None and last["train_loss"] < epochs[1]["train_loss"], out)

    def test_sync_ps_survives_a_killed_server_from_its_replica(self):
        self.check_server_loss_survived("ps")

    def test_ps_async_survives_a_killed_server_from_its_replica(self):
        self.check_server_loss_survived("ps-async")


if __name__ == "__main__":
    unittest.main()
