"""The Python training module (tandem.train: Model, Dataset, Optimizer, Trainer) through the C ABI, in one process.
Run with Debian's /usr/bin/python3 (numpy): python3 -m unittest discover -s tests/python."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
import tandem  # noqa: E402
import tandem.train as tt  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"


class Models(unittest.TestCase):
    def test_zoo_model_info_agrees_with_its_layers(self):
        m = tt.Model("lenet5", seed=1)
        info = m.info()
        self.assertEqual(info["name"], "lenet5")
        self.assertEqual(info["input_shape"], (1, 28, 28))
        self.assertEqual(info["num_classes"], 10)
        layers = m.layers()
        self.assertEqual(len(layers), info["num_layers"])
        self.assertEqual(sum(l["params"] for l in layers), info["params"])
        self.assertEqual(sum(l["fwd_flops"] for l in layers), info["fwd_flops"])
        self.assertEqual(layers[-1]["output"][0], 10)
        self.assertEqual(info["held_layers"], (0, info["num_layers"]))
        self.assertEqual(info["held_params"], info["params"])

    def test_same_seed_same_weights(self):
        a = tt.Model("lenet5", seed=3).get_params()
        b = tt.Model("lenet5", seed=3).get_params()
        c = tt.Model("lenet5", seed=4).get_params()
        self.assertTrue(np.array_equal(a, b))
        self.assertFalse(np.array_equal(a, c))
        self.assertTrue(np.all(np.isfinite(a)))

    def test_set_params_round_trip_and_wrong_size(self):
        m = tt.Model("lenet5", seed=1)
        v = np.linspace(-1, 1, m.info()["params"], dtype=np.float32)
        m.set_params(v)
        self.assertTrue(np.array_equal(m.get_params(), v))
        with self.assertRaises(tandem.TandemError) as cm:
            m.set_params(v[:-1])
        self.assertEqual(cm.exception.status, tandem.ERR_INVALID_ARGUMENT)

    def test_forward_gives_finite_logits_per_sample(self):
        m = tt.Model("lenet5", seed=1)
        x = np.random.default_rng(0).standard_normal((5, 1, 28, 28)).astype(np.float32)
        y = m.forward(x)
        self.assertEqual(y.shape, (5, 10))
        self.assertTrue(np.all(np.isfinite(y)))
        # The same input twice gives the same logits (inference mode: no state changes).
        self.assertTrue(np.array_equal(y, m.forward(x)))

    def test_forward_refuses_an_input_of_another_shape(self):
        # The C function reads N x 784 floats for lenet5: a smaller array was read past its end (a segfault for
        # (100000, 1, 1, 1)), a larger one silently read in part. Each is refused, naming the expected shape.
        m = tt.Model("lenet5", seed=1)
        for shape in ((100000, 1, 1, 1), (2, 3, 32, 32), (0, 1, 28, 28), (784,)):
            with self.assertRaises(tandem.TandemError) as cm:
                m.forward(np.zeros(shape, np.float32))
            self.assertEqual(cm.exception.status, tandem.ERR_INVALID_ARGUMENT)
            self.assertIn("[N, 1, 28, 28]", cm.exception.message)
        self.assertEqual(m.forward(np.zeros((2, 784), np.float32)).shape, (2, 10))  # flattened samples are fine

    def test_spec_json_model_and_malformed_spec(self):
        spec = {"name": "tiny", "input": [1, 8, 8], "layers": [{"type": "linear", "out_features": 3}]}
        try:
            m = tt.Model(spec_json=json.dumps(spec))
        except tandem.TandemError as e:  # the spec language names its own fields; show what it said
            self.fail("valid spec refused: %s" % e)
        self.assertEqual(m.info()["num_classes"], 3)
        self.assertEqual(m.info()["params"], 8 * 8 * 3 + 3)
        bad = dict(spec, layers=[{"type": "linear", "out_features": "three"}])
        with self.assertRaises(tandem.TandemError) as cm:
            tt.Model(spec_json=json.dumps(bad))
        self.assertEqual(cm.exception.status, tandem.ERR_INVALID_ARGUMENT)
        self.assertIn("layers[0].out_features", cm.exception.message)

    def test_unknown_zoo_model_is_refused(self):
        with self.assertRaises(tandem.TandemError) as cm:
            tt.Model("no-such-net")
        self.assertIn("no-such-net", cm.exception.message)

    def test_bad_input_shape_is_refused_before_the_call(self):
        with self.assertRaises(tandem.TandemError):
            tt.Model("lenet5", input_shape=(1, 28))


class Training(unittest.TestCase):
    def test_synthetic_dataset_shape_and_length(self):
        d = tt.Dataset("synthetic", shape=(3, 8, 8), num_classes=4, count=100, seed=2)
        self.assertEqual(len(d), 100)

    def test_bad_optimizer_kind(self):
        with self.assertRaises(tandem.TandemError):
            tt.Optimizer("sgdd")

    @unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed")
    def test_lenet5_learns_and_checkpoints_restore_it(self):
        train = tt.Dataset("fashion-mnist", train=True, limit=3072)
        test = tt.Dataset("fashion-mnist", train=False, limit=1024)
        seen = []
        trainer = tt.Trainer(tt.Model("lenet5", seed=7), train, test, tt.Optimizer("sgd", lr=0.02, momentum=0.9),
                             batch_size=64, epochs=2, seed=7, progress=seen.append)
        first = trainer.epoch()
        self.assertEqual(first["epoch"], 1)
        self.assertEqual(first["train_samples"], 3072)
        self.assertIs(first["already_reported"], False)  # no elastic loss: this rank reports its own epoch
        self.assertEqual(len(seen), 3072 // 64)
        self.assertEqual(seen[-1]["batch"], seen[-1]["batches"])
        self.assertEqual(trainer.completed_epochs, 1)
        self.assertEqual(trainer.steps, 3072 // 64)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = os.path.join(tmp, "e1.ckpt")
            trainer.save_checkpoint(ckpt)
            second = trainer.epoch()
            self.assertLess(second["train_loss"], first["train_loss"])
            self.assertGreater(second["test_accuracy"], 0.5)  # chance is 0.1

            # A fresh trainer resumed from the epoch-1 checkpoint runs epoch 2 to the same result.
            again = tt.Trainer(tt.Model("lenet5", seed=99), train, test, tt.Optimizer("sgd", lr=0.02, momentum=0.9),
                               batch_size=64, epochs=2, seed=7)
            again.load_checkpoint(ckpt)
            self.assertEqual(again.completed_epochs, 1)
            resumed = again.epoch()
            self.assertEqual(resumed["train_loss"], second["train_loss"])
            self.assertEqual(resumed["test_accuracy"], second["test_accuracy"])

            # A truncated checkpoint is refused, naming the file.
            with open(ckpt, "rb") as f:
                blob = f.read()
            bad = os.path.join(tmp, "bad.ckpt")
            with open(bad, "wb") as f:
                f.write(blob[:len(blob) // 2])
            with self.assertRaises(tandem.TandemError) as cm:
                again.load_checkpoint(bad)
            self.assertIn("bad.ckpt", cm.exception.message)
            # A directory is named as one (it was "internal error: basic_filebuf::underflow error reading the file").
            with self.assertRaises(tandem.TandemError) as cm:
                again.load_checkpoint(tmp)
            self.assertEqual(cm.exception.status, tandem.ERR_IO)
            self.assertIn("is a directory", cm.exception.message)


class ParallelStrategies(unittest.TestCase):
    """tandem.train.Trainer(strategy=..., **parallel) -> tandem_trainer_create_parallel, here as one-rank jobs."""

    def make(self, strategy, **kw):
        data = tt.Dataset("synthetic", shape=(1, 6, 6), num_classes=3, count=96, seed=2)
        return tt.Trainer(tt.Model("mlp", input_shape=(1, 6, 6), num_classes=3, seed=3), data, data,
                          tt.Optimizer("sgd", lr=0.1), batch_size=8, epochs=2, seed=7, strategy=strategy, **kw)

    def test_a_launched_rank_without_comm_is_refused(self):
        # comm=None is a one-rank job: under `tandem launch -n 2` both ranks trained alone, silently
        saved = os.environ.get("TANDEM_WORLD_SIZE")
        os.environ["TANDEM_WORLD_SIZE"] = "2"
        try:
            with self.assertRaises(tandem.TandemError) as cm:
                self.make("ddp")
            self.assertIn("without comm: every rank would train alone; pass comm=tandem.Communicator()",
                          cm.exception.message)
        finally:
            if saved is None:
                del os.environ["TANDEM_WORLD_SIZE"]
            else:
                os.environ["TANDEM_WORLD_SIZE"] = saved
        self.make("ddp").close()  # alone, a one-rank job as before

    def test_averaging_strategies_train_with_their_keywords(self):
        for strategy, kw in (("localsgd", dict(average_every=2, warmup_steps=1)), ("easgd", dict(tau=2, alpha=0.5)),
                             ("asgd", {}), ("fedavg", dict(clients=3, client_fraction=0.67, dirichlet_alpha=0.5,
                                                           local_epochs=2, round_deadline_s=5.0))):
            first = self.make(strategy, **kw).epoch()
            self.assertGreater(first["train_samples"], 0, strategy)
            self.assertTrue(np.isfinite(first["test_loss"]), strategy)

    def test_elastic_grow_and_replica_keywords_reach_their_fields(self):
        # each value lands in its own field of tandem_parallel_params_t: the library names the field it read
        with tempfile.TemporaryDirectory() as d:
            first = self.make("ddp", elastic=True, min_ranks=1, elastic_checkpoint=os.path.join(d, "e.ckpt"),
                              max_ranks=2, join_poll_steps=1).epoch()
        self.assertGreater(first["train_samples"], 0)
        for kw, field in ((dict(elastic=True, min_ranks=0), "min_ranks"), (dict(max_ranks=-1), "max_ranks"),
                          (dict(join_poll_steps=-1), "join_poll_steps")):
            with self.assertRaises(tandem.TandemError) as e:
                self.make("ddp", **kw)
            self.assertIn(field, str(e.exception))
        with self.assertRaises(tandem.TandemError) as e:
            self.make("ps-async", servers=1, server_replicas=-1)
        self.assertIn("server_replicas", str(e.exception))

    def test_staleness_lr_keyword_reaches_its_field_by_name(self):
        # an unknown rule is refused naming the keyword; "inverse" is read (this one-rank job then lacks a server rank)
        with self.assertRaises(tandem.TandemError) as e:
            self.make("ps-async", servers=1, staleness_lr="inverted")
        self.assertIn("staleness_lr='inverted' is not one of none, inverse, momentum", str(e.exception))
        with self.assertRaises(tandem.TandemError) as e:
            self.make("ps-async", servers=1, staleness_lr="inverse")
        self.assertIn("strategy ps-async with 1 server(s) needs at least 2 ranks", str(e.exception))

    def test_bucket_policy_keywords_reach_their_fields(self):
        # first_bucket_mb and the list bucket_sizes_mb (tandem_parallel_params_t's BUCKETS): a list trains; both
        # together, or a size out of range, are refused by the library naming what was wrong
        first = self.make("ddp", bucket_sizes_mb=[0.001, 0.002]).epoch()
        self.assertGreater(first["train_samples"], 0)
        self.assertGreater(self.make("ddp", first_bucket_mb=0.5).epoch()["train_samples"], 0)
        for kw, want in ((dict(first_bucket_mb=1.0, bucket_sizes_mb=[1.0]), "not both"),
                         (dict(bucket_sizes_mb=[0.5, -1.0]), "bucket size 1")):
            with self.assertRaises(tandem.TandemError) as e:
                self.make("ddp", **kw)
            self.assertIn(want, str(e.exception))

    def test_unknown_strategy_keyword_and_bad_value_are_refused(self):
        with self.assertRaises(tandem.TandemError):
            self.make("gossip")
        with self.assertRaises(tandem.TandemError) as cm:
            self.make("easgd", taus=2)
        self.assertIn("taus", str(cm.exception))
        with self.assertRaises(tandem.TandemError) as cm:
            self.make("easgd", tau=0)
        self.assertIn("parallel->tau", str(cm.exception))

    def test_a_keyword_of_another_strategy_is_refused_naming_it(self):
        # staleness with ps-async, tau with fedavg, average_every with easgd were silently ignored
        for strategy, kw, want in (("fedavg", dict(tau=3), "parallel->tau, alpha, easgd_async"),
                                   ("easgd", dict(average_every=3), "parallel->average_every, warmup_steps"),
                                   ("localsgd", dict(staleness=1), "parallel->staleness"),
                                   ("ddp", dict(servers=1), "parallel->servers"),
                                   ("ssp", dict(staleness_lr="inverse"), "parallel->staleness_lr")):
            with self.assertRaises(tandem.TandemError) as cm:
                self.make(strategy, **kw)
            self.assertEqual(cm.exception.status, tandem.ERR_INVALID_ARGUMENT)
            self.assertIn(want, cm.exception.message)
            self.assertIn("not by " + strategy, cm.exception.message)
        with self.assertRaises(tandem.TandemError) as cm:  # 97 clients on 96 samples: one with none
            self.make("fedavg", clients=97)
        self.assertIn("parallel->clients = 97 is more than the 96 training samples", cm.exception.message)
        self.make("fedavg", clients=96).close()

    def test_a_strategy_keyword_takes_a_whole_number_in_its_c_field(self):
        # staleness=2**32 + 1 wrapped to 1 in the int32 field and trained as ssp with staleness 1
        for kw, want in ((dict(tau=2 ** 32 + 2), "tau = 4294967298 is out of range"),
                         (dict(tau=2.5), "tau must be a whole number, got 2.5")):
            with self.assertRaises(tandem.TandemError) as cm:
                self.make("easgd", **kw)
            self.assertIn(want, cm.exception.message)


class LaunchedStrategies(unittest.TestCase):
    """Every strategy as a 3-rank job under `tandem launch` (strategies_script.py): ps, ps-async and ssp with 2 workers
    and a server, the averaging strategies on 3 workers, and DDP on 2 ranks as synchronous ps's reference."""

    @classmethod
    def setUpClass(cls):
        cli = os.environ.get("TANDEM_CLI") or os.path.join(os.path.dirname(tandem.LIBRARY_PATH), "..", "bin", "tandem")
        if not os.path.exists(cli):
            raise AssertionError("no tandem executable at %s (set TANDEM_CLI)" % cli)
        env = dict(os.environ, TANDEM_LIBRARY=tandem.LIBRARY_PATH, TANDEM_TIMEOUT_MS="30000")
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([cli, "launch", "-n", "3", "--", sys.executable,
                                os.path.join(HERE, "strategies_script.py"), d],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240, text=True)
            if p.returncode != 0:
                raise AssertionError("the 3-rank job failed (exit %d):\n%s" % (p.returncode, p.stdout))
            cls.ranks = []
            for r in range(3):
                with open(os.path.join(d, "rank%d.json" % r)) as f:
                    cls.ranks.append(json.load(f))

    def test_every_strategy_lowers_the_loss(self):
        for strategy in ("ps", "ps-async", "ssp", "localsgd", "easgd", "asgd", "fedavg"):
            got = self.ranks[0][strategy]
            self.assertLess(got["after"], 0.5 * got["before"], strategy)

    def test_sync_ps_equals_ddp_on_its_two_workers(self):
        ddp = np.array(self.ranks[0]["ddp"]["params"])
        for r in (0, 1):
            ps = np.array(self.ranks[r]["ps"]["params"])
            self.assertEqual(ps.shape, ddp.shape)
            self.assertLessEqual(np.max(np.abs(ps - ddp)) / np.max(np.abs(ddp)), 1e-5, "worker %d" % r)
        self.assertGreater(np.max(np.abs(ddp - np.array(self.ranks[0]["ddp"]["initial"]))), 1e-3, "training moved them")

    def test_workers_agree_after_evaluation(self):
        # ps-async and ssp: evaluate is a sync point, every worker pulls the servers' parameters; fedavg: the global
        # model; localsgd: 8 steps averaged every 2, the last one an average
        for strategy, workers in (("ps-async", 2), ("ssp", 2), ("fedavg", 3), ("localsgd", 3)):
            for r in range(1, workers):
                self.assertEqual(self.ranks[r][strategy]["params"], self.ranks[0][strategy]["params"],
                                 "%s: worker %d" % (strategy, r))

    def test_ssp_with_a_slow_worker_differs_from_sync_ps(self):
        # the same 6 steps with worker 1 held back as far as the bound allows: ps waits for it (worker 0 at most 0
        # clocks ahead), ssp (S = 2) lets worker 0 compute from parameters 2 clocks old
        ps = [np.array(self.ranks[r]["ps-paced"]["params"]) for r in (0, 1)]
        ssp = [np.array(self.ranks[r]["ssp-paced"]["params"]) for r in (0, 1)]
        for name, pair in (("ps", ps), ("ssp", ssp)):
            self.assertEqual(pair[0].tolist(), pair[1].tolist(), "%s: the workers agree after evaluate" % name)
        d = np.max(np.abs(ssp[0] - ps[0])) / np.max(np.abs(ps[0]))
        self.assertGreater(d, 1e-3, "ssp's stale pulls changed the parameters (max relative difference %g)" % d)
        self.assertGreater(np.max(np.abs(ps[0] - np.array(self.ranks[0]["ddp"]["initial"]))), 1e-3, "ps trained")
        self.assertLess(self.ranks[0]["ssp-paced"]["after"], self.ranks[0]["ps"]["before"], "ssp still trained")


class IntegerFields(unittest.TestCase):
    """ctypes truncated 64.9 to 64 and wrapped an int32 field: simulate(dp=2**32 + 2) simulated dp 2."""

    def test_whole_numbers_within_the_c_type_only(self):
        import tandem.simulate as ts
        for kw, want in ((dict(strategy="ddp", dp=2 ** 32 + 2), "dp = 4294967298 is out of range"),
                         (dict(batch=64.9), "batch must be a whole number, got 64.9"),
                         (dict(batch="64"), "batch must be a whole number")):
            with self.assertRaises(tandem.TandemError) as cm:
                ts.simulate("t2.micro:4", model="lenet5", **kw)
            self.assertEqual(cm.exception.status, tandem.ERR_INVALID_ARGUMENT)
            self.assertIn(want, cm.exception.message)
        self.assertEqual(ts.simulate("t2.micro:4", model="lenet5", strategy="ddp", dp=np.int64(2), batch=64.0).dp, 2)
        with self.assertRaises(tandem.TandemError) as cm:
            tt.Model("lenet5", input_shape=(1, 28.5, 28))
        self.assertIn("input_height must be a whole number, got 28.5", cm.exception.message)
        with self.assertRaises(tandem.TandemError) as cm:  # was a one-rank communicator
            tandem.Communicator(rank=0, size=2 ** 32 + 1)
        self.assertIn("size = 4294967297 is out of range", cm.exception.message)


class WidthMult(unittest.TestCase):
    """A width multiplier belongs to mobilenetv2: simulate(model="lenet5", width_mult=0.5) simulated the full lenet5."""

    def test_another_model_given_a_width_multiplier_is_refused(self):
        import tandem.simulate as ts
        with self.assertRaises(tandem.TandemError) as cm:
            ts.simulate("t2.micro:4", model="lenet5", width_mult=0.5)
        self.assertEqual(cm.exception.status, tandem.ERR_INVALID_ARGUMENT)
        self.assertIn("model 'lenet5': width_mult 0.5 applies to mobilenetv2 and mobilenetv2_imagenet only",
                      cm.exception.message)
        with self.assertRaises(tandem.TandemError):
            tt.Model("resnet18", width_mult=0.25)
        small = tt.Model("mobilenetv2", width_mult=0.25).info()["params"]
        self.assertLess(small, tt.Model("mobilenetv2").info()["params"])


if __name__ == "__main__":
    unittest.main()
