"""The averaging strategies of issue #13 as users run them: `tandem launch -n 2/3 -- tandem train --strategy X` with
tiny epochs. Each job finishes on every rank, reports its strategy, and its training loss goes down; a checkpoint of
EASGD resumes; --target-accuracy stops every strategy at the first evaluation that reaches it. Run by CTest with TANDEM_CLI set; standard library only."""
import json
import os
import subprocess
import tempfile
import unittest

CLI = os.environ.get("TANDEM_CLI", "tandem")
BASE = ["train", "--model", "mlp", "--dataset", "synthetic", "--batch", "16", "--lr", "0.05", "--momentum", "0",
        "--limit-batches", "6", "--eval-limit-batches", "2", "--train-limit", "960", "--test-limit", "200",
        "--epochs", "3", "--threads", "1", "--json"]


def launch(n, extra, timeout=180, epochs=3, launcher=()):
    env = dict(os.environ, TANDEM_TIMEOUT_MS="20000", OMP_NUM_THREADS="1")
    base = [str(epochs) if i > 0 and BASE[i - 1] == "--epochs" else a for i, a in enumerate(BASE)]
    for opt in ("--lr", "--momentum"):  # the test's own learning rate or momentum replaces BASE's
        if opt in extra:
            k = base.index(opt)
            del base[k:k + 2]
    p = subprocess.run([CLI, "launch", "-n", str(n)] + list(launcher) + ["--", CLI] + base + extra, env=env,
                       stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout, text=True)
    lines = [json.loads(l.split("] ", 1)[1]) for l in p.stdout.splitlines() if "] {" in l]
    return p.returncode, p.stdout, [x for x in lines if "target" not in x]


def target_line(out):
    """The {"target": ...} line of --target-accuracy (rank 0's), or None."""
    got = [json.loads(l.split("] ", 1)[1])["target"] for l in out.splitlines() if '] {"target"' in l]
    return got[-1] if got else None


class Strategies(unittest.TestCase):
    def run_strategy(self, n, extra):
        rc, out, epochs = launch(n, extra)
        self.assertEqual(rc, 0, out)
        self.assertEqual(len(epochs), 3, out)
        self.assertEqual(epochs[0]["strategy"], extra[1], out)
        self.assertLess(epochs[-1]["train_loss"], epochs[0]["train_loss"], out)
        return out, epochs

    def test_localsgd(self):
        self.run_strategy(2, ["--strategy", "localsgd", "--average-every", "2", "--warmup-steps", "2"])

    def test_easgd(self):
        self.run_strategy(2, ["--strategy", "easgd", "--tau", "2", "--alpha", "0.3"])

    def test_asgd(self):
        self.run_strategy(3, ["--strategy", "asgd"])

    def test_fedavg(self):
        # an epoch is a round: 6 Dirichlet-skewed clients, half of them sampled per round
        self.run_strategy(3, ["--strategy", "fedavg", "--clients", "6", "--client-fraction", "0.5",
                              "--dirichlet-alpha", "0.5", "--local-epochs", "1", "--round-deadline-s", "15"])

    def test_easgd_checkpoint_resumes(self):
        # synchronous (the centre on every worker) and asynchronous (the centre on a server: it was refused, "not
        # supported yet", though --checkpoint was given)
        for n, flags in [(2, ["--strategy", "easgd", "--tau", "2"]),
                         (3, ["--strategy", "easgd", "--tau", "2", "--easgd-async", "--servers", "1"])]:
            with self.subTest(flags=" ".join(flags)), tempfile.TemporaryDirectory() as d:
                ck = os.path.join(d, "easgd.ckpt")
                rc, out, _ = launch(n, flags + ["--checkpoint", ck])
                self.assertEqual(rc, 0, out)
                rc, out, epochs = launch(n, flags + ["--resume", ck], epochs=4)
                self.assertEqual(rc, 0, out)
                self.assertEqual([e["epoch"] for e in epochs], [4], out)

    def test_sync_ps_trains_as_ddp_does(self):
        # issue #13: a synchronous parameter server gives DDP's result to within float rounding -- here as users run
        # both (2 workers with 1 or 2 servers against 2 DDP ranks; momentum, so the servers' optimizer state counts)
        def losses(n, flags):
            rc, out, epochs = launch(n, flags + ["--momentum", "0.9"], epochs=2)
            self.assertEqual(rc, 0, out)
            self.assertEqual([e["epoch"] for e in epochs if "strategy" in e], [1, 2], out)
            return [(e["train_loss"], e["test_loss"]) for e in epochs if "strategy" in e]
        ddp = losses(2, ["--strategy", "ddp"])
        for servers in (1, 2):
            with self.subTest(servers=servers):
                ps = losses(2 + servers, ["--strategy", "ps", "--servers", str(servers)])
                for (a_train, a_test), (b_train, b_test) in zip(ddp, ps):
                    self.assertAlmostEqual(a_train, b_train, delta=1e-6 * abs(a_train))
                    self.assertAlmostEqual(a_test, b_test, delta=1e-6 * abs(a_test) + 1e-9)
        # the comparison can fail: another learning rate moves the losses
        other = losses(3, ["--strategy", "ps", "--servers", "1", "--lr", "0.02"])
        self.assertNotAlmostEqual(ddp[-1][1], other[-1][1], delta=1e-6 * abs(ddp[-1][1]))

    def test_ps_async_with_momentum_is_warned_once(self):
        # momentum on stale gradients diverged ps-async in bench/strategies (run 20): rank 0 says so, once
        warning = "--strategy ps-async applies each push as its own optimizer step, on a gradient about 1 update(s) " \
                  "stale (2 workers); --momentum 0.9 compounds that staleness"
        rc, out, _ = launch(3, ["--strategy", "ps-async", "--servers", "1", "--momentum", "0.9"], epochs=1)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count(warning), 1, out)
        self.assertIn("[rank 0] tandem train: warning: " + warning, out)
        rc, out, _ = launch(3, ["--strategy", "ps-async", "--servers", "1"], epochs=1)  # BASE: momentum 0
        self.assertEqual(rc, 0, out)
        self.assertNotIn("compounds that staleness", out)

    def test_target_accuracy_stops_every_strategy_at_the_first_evaluation_reaching_it(self):
        # 0.01 is below chance (10 classes): the first evaluation reaches it, and every rank stops there (a rank
        # that went on would hang its peers until the deadline, and the launch would fail)
        for n, flags in [(2, ["--strategy", "ddp"]), (3, ["--strategy", "ps", "--servers", "1"]),
                         (3, ["--strategy", "ps-async", "--servers", "1"]),
                         (3, ["--strategy", "ssp", "--servers", "1", "--staleness", "1"]),
                         (2, ["--strategy", "asgd"]), (2, ["--strategy", "easgd", "--tau", "2"]),
                         (2, ["--strategy", "localsgd", "--average-every", "2"]),
                         (2, ["--strategy", "fedavg", "--clients", "4"])]:
            with self.subTest(strategy=flags[1]):
                rc, out, epochs = launch(n, flags + ["--target-accuracy", "0.01"], epochs=4)
                self.assertEqual(rc, 0, out)
                self.assertEqual([e["epoch"] for e in epochs], [1], out)
                t = target_line(out)
                self.assertIsNotNone(t, out)
                self.assertTrue(t["reached"], out)
                self.assertEqual(t["epoch"], 1, out)
                self.assertGreaterEqual(t["test_accuracy"], 0.01, out)
                self.assertEqual(t["test_accuracy"], epochs[0]["test_accuracy"], out)
                self.assertGreater(t["steps"], 0, out)
                self.assertAlmostEqual(t["train_s"], epochs[0]["train_s"], places=9, msg=out)

    def test_unreached_target_trains_to_the_cap(self):
        # lr 0: the model never learns, so 99% is not reached; every epoch runs and the line says so
        rc, out, epochs = launch(2, ["--strategy", "ddp", "--lr", "0", "--target-accuracy", "0.99"])
        self.assertEqual(rc, 0, out)
        self.assertEqual([e["epoch"] for e in epochs], [1, 2, 3], out)
        t = target_line(out)
        self.assertFalse(t["reached"], out)
        self.assertIsNone(t["epoch"], out)
        self.assertAlmostEqual(t["train_s"], sum(e["train_s"] for e in epochs), places=6, msg=out)

    def test_bad_target_accuracy_is_refused(self):
        for v in ("0", "1.5", "x"):
            p = subprocess.run([CLI] + BASE + ["--target-accuracy", v], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0, p.stdout)
            self.assertIn("--target-accuracy: must be in (0, 1], got " + v, p.stdout)

    def test_bad_value_is_refused_on_every_rank_naming_the_field(self):
        rc, out, _ = launch(2, ["--strategy", "localsgd", "--average-every", "0"], launcher=["--min-ranks", "1"])
        self.assertNotEqual(rc, 0, out)
        for rank in (0, 1):
            self.assertRegex(out, r"\[rank %d\] .*average_every must be >= 1" % rank)

    def test_a_flag_of_another_strategy_is_refused_naming_it(self):
        # --staleness with ps-async, --tau with fedavg and --servers with ddp trained as if they were not given
        # (exit 0); each is refused now on every rank, naming the field and the strategy that reads it.
        for n, flags, needle in [
                (3, ["--strategy", "ps-async", "--staleness", "3"],
                 "parallel->staleness (TANDEM_PARALLEL_PARAM_STALENESS) is read by strategy ssp only, not by ps-async"),
                (2, ["--strategy", "fedavg", "--tau", "3"], "are read by strategy easgd only, not by fedavg"),
                (2, ["--strategy", "ddp", "--servers", "2"], "parallel->servers (TANDEM_PARALLEL_PARAM_SERVERS) is "
                 "read by strategies ps, ps-async, ssp and easgd with easgd_async only, not by ddp")]:
            # --min-ranks 1: the launcher lets each rank reach its own refusal instead of stopping the others at the
            # first one (a loaded rank could be stopped before it printed its own)
            rc, out, epochs = launch(n, flags, epochs=1, launcher=["--min-ranks", "1"])
            self.assertNotEqual(rc, 0, out)
            self.assertEqual(epochs, [], out)
            self.assertIn("elastic job failed with 0 of %d ranks" % n, out)
            for rank in range(n):
                self.assertIn("[rank %d] tandem: rank %d: cannot create" % (rank, rank), out)
            self.assertIn(needle, out)
        # the strategy's own flags still go through (the synchronous-server flags alike)
        rc, out, epochs = launch(3, ["--strategy", "ssp", "--servers", "1", "--staleness", "1"], epochs=1)
        self.assertEqual(rc, 0, out)

    def test_the_text_report_names_workers_servers_and_rounds(self):
        # "ps world 3 = dp 2 x pp 1 ... (all-reduce X)" did not add up and named an exchange ps does not make; FedAvg's
        # "per step" was a round.
        base = [a for a in BASE if a != "--json"]
        env = dict(os.environ, TANDEM_TIMEOUT_MS="20000", OMP_NUM_THREADS="1")
        for extra, want in ((["--strategy", "ps", "--servers", "1"], "ps world 3 = 2 worker(s) + 1 server(s), "),
                            (["--strategy", "fedavg"], "fedavg world 3 = dp 3 x pp 1, 1 micro-batch(es) (1f1b); per "
                                                       "round ")):
            p = subprocess.run([CLI, "launch", "-n", "3", "--", CLI] + base + extra, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180, text=True)
            self.assertEqual(p.returncode, 0, p.stdout)
            self.assertIn(want, p.stdout)
            if extra[1] == "ps":
                self.assertRegex(p.stdout, r"exposed comm [\d.]+ \(push/pull [\d.]+\)")

    def test_more_fedavg_clients_than_samples_is_refused(self):
        # 961 clients on 960 samples: one client with no data at all (its rounds ran on nothing); refused.
        rc, out, _ = launch(2, ["--strategy", "fedavg", "--clients", "961"], epochs=1)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("parallel->clients = 961 is more than the 960 training samples", out)


def simulate(extra, job=None):
    """`tandem simulate` of a 2-worker, 2-server LeNet-5 ps job on t2.micro:4: (returncode, output, step time or None)."""
    cmd = [CLI, "simulate", "--cluster", "t2.micro:4", "--model", "lenet5", "--dataset", "fashion-mnist", "--batch",
           "64", "--strategy", "ps", "--servers", "2", "--json"] + extra
    with tempfile.TemporaryDirectory() as d:
        if job is not None:
            path = os.path.join(d, "job.json")
            with open(path, "w") as f:
                f.write(job)
            cmd += ["--job", path]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    step = json.loads(p.stdout)["step_time_s"] if p.returncode == 0 else None
    return p.returncode, p.stdout, step


class SimulateElastic(unittest.TestCase):
    """The elastic settings the simulator times (issue #17), given as `tandem simulate` flags."""

    def test_server_replicas_cost_time_and_the_flag_overrides_the_job_file(self):
        rc, out, plain = simulate(["--elastic"])
        self.assertEqual(rc, 0, out)
        rc, out, replicated = simulate(["--elastic", "--server-replicas", "1"])
        self.assertEqual(rc, 0, out)
        # each update is copied to the other server over its 65 Mbit/s NIC and acknowledged before the pull
        self.assertGreater(replicated, plain * 1.2, (plain, replicated))
        rc, out, from_file = simulate([], job='{"elastic": true, "server_replicas": 1}')
        self.assertEqual(rc, 0, out)
        self.assertEqual(from_file, replicated)
        rc, out, overridden = simulate(["--server-replicas", "0"], job='{"elastic": true, "server_replicas": 1}')
        self.assertEqual(rc, 0, out)
        self.assertEqual(overridden, plain)

    def test_bad_elastic_settings_are_refused_naming_them(self):
        rc, out, _ = simulate(["--server-replicas", "1"])
        self.assertNotEqual(rc, 0, out)
        self.assertIn("--server-replicas 1 with strategy ps needs --elastic", out)
        rc, out, _ = simulate(["--elastic", "--server-replicas", "2"])
        self.assertNotEqual(rc, 0, out)
        self.assertIn("at most servers - 1 = 1 replicas", out)
        rc, out, _ = simulate(["--elastic", "--server-replicas", "1"], job="[1, 2]")
        self.assertNotEqual(rc, 0, out)
        self.assertIn("is not a JSON object", out)


class SimulateStrategyFlags(unittest.TestCase):
    """The strategy flags as `tandem simulate` takes them: a flag its strategy does not read is refused, naming it."""

    def test_a_flag_of_another_strategy_is_refused_naming_it(self):
        base = [CLI, "simulate", "--cluster", "t2.micro:4", "--model", "lenet5", "--dataset", "fashion-mnist"]
        for flags, needle in [(["--strategy", "ps-async", "--staleness", "3"],
                               "job.staleness (TANDEM_SIM_JOB_STALENESS) is read by strategy ssp only, not by ps-async"),
                              (["--strategy", "easgd", "--servers", "2"], "not by easgd without easgd_async"),
                              (["--strategy", "fedavg", "--clients", "60001"],
                               "job.clients = 60001 is more than the 60000 training samples")]:
            p = subprocess.run(base + flags, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0, p.stdout)
            self.assertIn(needle, p.stdout)
        p = subprocess.run(base + ["--strategy", "ssp", "--staleness", "3", "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertIn("(staleness 3)", json.loads(p.stdout)["allreduce"])



class StalenessLr(unittest.TestCase):
    """ps-async's --staleness-lr (a push's rate / its staleness) as users give it to train and simulate."""

    def test_a_bad_rule_or_another_strategy_is_refused_naming_the_flag(self):
        p = subprocess.run([CLI] + BASE + ["--strategy", "ps-async", "--staleness-lr", "inverted"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn("--staleness-lr: inverted not in {none,inverse,momentum}", p.stdout)
        rc, out, epochs = launch(3, ["--strategy", "ssp", "--servers", "1", "--staleness-lr", "inverse"], epochs=1,
                                 launcher=["--min-ranks", "1"])
        self.assertNotEqual(rc, 0, out)
        self.assertEqual(epochs, [], out)
        self.assertIn("parallel->staleness_lr (TANDEM_PARALLEL_PARAM_STALENESS_LR) is read by strategy ps-async only, "
                      "not by ssp", out)
        sim = [CLI, "simulate", "--cluster", "t2.micro:3", "--model", "lenet5", "--dataset", "fashion-mnist"]
        p = subprocess.run(sim + ["--strategy", "ssp", "--staleness-lr", "inverse"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn("--staleness-lr inverse: strategy ssp applies no stale pushes", p.stdout)

    def test_ps_async_trains_with_it_unwarned_and_simulates_at_the_same_step_time(self):
        rc, out, epochs = launch(3, ["--strategy", "ps-async", "--servers", "1", "--staleness-lr", "inverse"])
        self.assertEqual(rc, 0, out)
        self.assertEqual(len(epochs), 3, out)
        self.assertEqual({e["staleness_lr"] for e in epochs}, {"inverse"}, out)  # the rule as the trainer runs it
        self.assertLess(epochs[-1]["train_loss"], epochs[0]["train_loss"], out)
        # the momentum warning is for plain ps-async: with the rule given, rank 0 does not repeat it
        rc, out, _ = launch(3, ["--strategy", "ps-async", "--servers", "1", "--staleness-lr", "inverse", "--momentum",
                                "0.9"], epochs=1)
        self.assertEqual(rc, 0, out)
        self.assertNotIn("compounds that staleness", out)
        # an update rule only: the simulator's step is the same with and without it
        sim = [CLI, "simulate", "--cluster", "t2.micro:3", "--model", "lenet5", "--dataset", "fashion-mnist",
               "--strategy", "ps-async", "--json"]
        steps = []
        for extra in ([], ["--staleness-lr", "inverse"]):
            p = subprocess.run(sim + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            steps.append(json.loads(p.stdout)["step_time_s"])
        self.assertEqual(steps[0], steps[1])


if __name__ == "__main__":
    unittest.main()
