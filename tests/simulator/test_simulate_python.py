"""The Python simulation module (bindings/python/tandem/simulate.py) over libtandem.so."""
import ctypes
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.environ.get("TANDEM_SOURCE_DIR", "."), "bindings", "python"))

import tandem  # noqa: E402
import tandem.simulate as ts  # noqa: E402


class SimulatePython(unittest.TestCase):
    def test_seed_case_is_super_linear_on_four_nodes(self):
        r = ts.simulate("t2.micro:4", model="mobilenetv2", dataset="cifar10", batch=256, epochs=10,
                        strategy="ddp", epoch_time_s=252.5)
        self.assertEqual((r.dp, r.pp), (4, 1))
        self.assertGreater(r.speedup, 4.0)
        self.assertAlmostEqual(r["baseline_total_time_s"], 7250.0, delta=0.05 * 7250)
        self.assertTrue(all(n["throttle_start_s"] is None for n in r["nodes"]))
        split = r.compute_s + r.comm_exposed_s + r.bubble_s + r.throttled_s + r.idle_s
        self.assertAlmostEqual(split, r.total_time_s, delta=1e-6 * r.total_time_s)

    def test_cluster_from_a_dict_and_sweep(self):
        c = ts.Cluster({"nodes": [{"preset": "c5.large", "count": 2}], "topology": {"kind": "star"}})
        self.assertEqual((c.nodes, c.devices), (2, 2))
        rows = ts.sweep(c, [1, 2, 4], model="lenet5", dataset="fashion-mnist", batch=64, strategy="ddp")
        self.assertEqual([row["nodes"] for row in rows], [1, 2, 4])
        self.assertEqual([row["dp"] for row in rows], [1, 2, 4])
        self.assertLess(rows[2]["epoch_time_s"], rows[0]["epoch_time_s"])

    def test_compression_through_a_job(self):
        kw = dict(model="lenet5", dataset="fashion-mnist", batch=64, strategy="ddp", epochs=0.1)
        none = ts.simulate("c5.large:2", **kw)
        fp16 = ts.simulate("c5.large:2", job={"compression": "fp16"}, **kw)
        self.assertEqual((none["compression"], fp16["compression"]), ("none", "fp16"))
        self.assertAlmostEqual(fp16["memory_per_node_bytes"] - none["memory_per_node_bytes"],
                               61706 * 4 / 2, delta=1.0)  # lenet5's 61,706 parameters: a 16-bit copy
        # The keyword is the same option as the job's key.
        bf16 = ts.simulate("c5.large:2", compression="bf16", **kw)
        self.assertEqual(bf16["compression"], "bf16")
        self.assertEqual(bf16["memory_per_node_bytes"], fp16["memory_per_node_bytes"])
        with self.assertRaises(tandem.TandemError) as cm:
            ts.simulate("c5.large:2", compression="int3", **kw)
        self.assertIn("int3", cm.exception.message)

    def test_parameter_server_and_fedavg(self):
        kw = dict(model="lenet5", dataset="fashion-mnist", batch=64, epochs=0.1, baseline=0)
        ps = ts.simulate("c5.large:4", strategy="ps", servers=1, **kw)
        self.assertEqual((ps["exchange"], ps["servers"], ps["workers"]), ("push-pull", 1, 3))
        self.assertEqual(ps["busiest_nic_rank"], 3)
        self.assertAlmostEqual(ps["busiest_nic_bytes"], 3 * 61706 * 4, delta=1.0)
        fed = ts.simulate("c5.large:4", strategy="fedavg", clients=8, client_fraction=0.5, round_deadline_s=100,
                          dirichlet_alpha=0.5, **kw)
        self.assertEqual(fed["clients_sampled"], 4)
        self.assertTrue(fed["rounds"])
        self.assertIn("client shards cut as the runtime cuts them", fed["note"])

    def test_memory_data_bytes_through_the_sized_summary(self):
        # The summary is read with tandem_sim_result_query_v, told the binding's struct size; its 0.5 field is the
        # data a rank holds: fashion-mnist's 60,000 + 10,000 images of 28 x 28 bytes and a 4-byte label each, and
        # under FedAvg the clients' subsets, one more copy of the training set.
        kw = dict(model="lenet5", dataset="fashion-mnist", batch=64, epochs=0.1, baseline=0)
        ddp = ts.simulate("c5.large:2", strategy="ddp", **kw)
        self.assertEqual(ddp.memory_data_bytes, 70000 * 788)
        self.assertEqual(ddp.memory_data_bytes, ddp["memory_breakdown"]["data_bytes"])
        # the runtime part includes the data and the loaders' batches (prefetch 2: three batches ahead, and the
        # evaluation's, of 64 images of 28 x 28 f32 values and int32 labels), so that the parts add up to the need
        self.assertEqual(ddp["memory_breakdown"]["loader_bytes"], 4 * 64 * (28 * 28 * 4 + 4))
        self.assertEqual(ddp.memory_runtime_bytes,
                         ddp["memory_breakdown"]["runtime_bytes"] + ddp["memory_breakdown"]["data_bytes"] +
                         ddp["memory_breakdown"]["loader_bytes"])
        self.assertGreater(ddp.memory_param_bytes, 0)
        fed = ts.simulate("c5.large:2", strategy="fedavg", clients=8, **kw)
        self.assertEqual(fed.memory_data_bytes, 130000 * 788)
        self.assertEqual(ts._Summary.memory_data_bytes.offset + 8, ctypes.sizeof(ts._Summary))

    def test_plan_and_trace(self):
        best = ts.plan("c5.large:4", top=2, model="lenet5", dataset="fashion-mnist", batch=64)
        self.assertEqual(len(best), 2)
        self.assertLessEqual(best[0]["total_time_s"], best[1]["total_time_s"])
        r = ts.simulate("c5.large:2", model="lenet5", dataset="fashion-mnist", strategy="pipeline",
                        micro_batches=4, trace=True)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            r.write_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
            self.assertTrue(any(e.get("cat") == "compute" for e in events))
            self.assertTrue(any(e.get("cat") == "bubble" for e in events))

    def test_errors_name_the_field(self):
        with self.assertRaises(tandem.TandemError) as e:
            ts.Cluster('{"nodes": [{"preset": "t2.micro", "count": 0}]}')
        self.assertIn("nodes[0].count", e.exception.message)
        with self.assertRaises(tandem.TandemError) as e:
            ts.simulate("t2.micro:2", strategy="warp")
        self.assertIn("warp", e.exception.message)
        with self.assertRaises(tandem.TandemError):
            ts.simulate("t2.micro:2", bogus=1)


if __name__ == "__main__":
    unittest.main()
