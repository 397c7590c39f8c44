"""The Python bindings in one process (a one-rank job) and, through `tandem launch`, on 4 ranks.
Run with Debian's /usr/bin/python3 (numpy): python3 -m unittest discover -s tests/python."""
import array
import os
import subprocess
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
import tandem  # noqa: E402

# A one-rank job: nothing from an enclosing launcher may leak in.
for _v in ("TANDEM_RANK", "TANDEM_WORLD_SIZE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
           "SLURM_PROCID", "SLURM_NTASKS"):
    os.environ.pop(_v, None)


class SingleRank(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.comm = tandem.Communicator()

    @classmethod
    def tearDownClass(cls):
        cls.comm.close()

    def assertTandemError(self, status, needle, fn, *args, **kw):
        with self.assertRaises(tandem.TandemError) as cm:
            fn(*args, **kw)
        self.assertEqual(cm.exception.status, status, cm.exception)
        self.assertIn(needle, cm.exception.message)
        return cm.exception

    def test_one_rank_from_an_empty_environment(self):
        self.assertEqual((self.comm.rank, self.comm.size), (0, 1))
        self.assertTrue(self.comm.transport)
        self.assertIn(self.comm.allreduce_algo(1 << 20), ("ring", "hd", "tree", "hier", "direct", "det"))

    def test_allreduce_is_in_place_and_zero_copy(self):
        x = np.arange(10, dtype=np.float32)
        view = x[:]  # shares memory: sees the result only if the call wrote into x itself
        self.assertIs(self.comm.allreduce(x, op="max"), x)
        np.testing.assert_array_equal(view, np.arange(10))

    def test_every_dtype_and_op_on_one_rank_is_the_identity(self):
        for dt in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8):
            for op in ("sum", "avg", "min", "max", "prod"):
                x = (np.arange(17) % 4 + 1).astype(dt)
                self.comm.allreduce(x, op=op)
                np.testing.assert_array_equal(x, (np.arange(17) % 4 + 1).astype(dt), err_msg="%s %s" % (dt, op))

    def test_buffer_protocol_objects_work_without_numpy(self):
        a = array.array("d", [1.5, 2.5])
        self.comm.allreduce(a)
        self.assertEqual(list(a), [1.5, 2.5])
        g = self.comm.allgather(array.array("i", [4, 5]), recv=array.array("i", [0, 0]))
        self.assertEqual(list(g), [4, 5])

    def test_collectives_return_their_result_arrays(self):
        np.testing.assert_array_equal(self.comm.reduce_scatter(np.arange(6, dtype=np.int64)), np.arange(6))
        np.testing.assert_array_equal(self.comm.allgather(np.arange(3, dtype=np.int32)), np.arange(3))
        y = np.ones(4, dtype=np.float64)
        self.assertIs(self.comm.broadcast(y, root=0), y)
        self.assertIs(self.comm.reduce(y, root=0), y)
        self.comm.barrier()

    def test_requests_complete_and_can_be_tested(self):
        x = np.ones(1000, dtype=np.float32)
        req = self.comm.iallreduce(x)
        self.assertIs(req.wait(), x)
        self.assertTrue(req.test())
        req.close()
        req.close()  # twice is harmless
        with self.comm.ibarrier() as r2:
            r2.wait()

    def test_send_to_self(self):
        s = self.comm.isend(np.arange(5, dtype=np.int32), 0, tag=9)
        got = self.comm.recv(np.zeros(5, dtype=np.int32), 0, tag=9)
        s.wait()
        np.testing.assert_array_equal(got, np.arange(5))

    def test_bad_arguments_raise_tandem_errors_naming_them(self):
        c = self.comm
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "op", c.allreduce, np.ones(2, np.float32), op="median")
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "op 42", c.allreduce, np.ones(2, np.float32), op=42)
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "contiguous", c.allreduce, np.ones(8, np.float32)[::2])
        ro = np.ones(3, np.float32)
        ro.flags.writeable = False
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "read-only", c.allreduce, ro)
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "dtype", c.allreduce, np.ones(3, np.complex64))
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "out has 2 elements, expected 3", c.allreduce,
                               np.ones(3, np.float32), out=np.ones(2, np.float32))
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "recv has 5 elements, expected 4", c.allgather,
                               np.ones(4, np.float32), recv=np.ones(5, np.float32))
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "root 3", c.broadcast, np.ones(3, np.float32), root=3)
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "peer", c.send, np.ones(3, np.float32), 1)
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "bf16", c.allreduce, np.ones(3, np.float32), dtype="bf16")
        # None of that hurt the communicator.
        self.assertEqual(c.async_status(), (tandem.OK, ""))
        c.barrier()

    def test_error_carries_status_name_and_message(self):
        try:
            self.comm.broadcast(np.ones(1, np.float32), root=-2)
        except tandem.TandemError as e:
            self.assertEqual(e.status_name, "invalid argument")
            self.assertIn("tandem_comm_broadcast", e.message)
            self.assertIn(e.message, str(e))
        else:
            self.fail("no error")

    def test_bad_creation_parameters(self):
        e = self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "size", tandem.Communicator, size=0)
        self.assertIn("params->size", str(e))
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "master_port", tandem.Communicator, master_port=99999)
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "algo", tandem.Communicator, algo="bogus")

    def test_explicit_parameters(self):
        with tandem.Communicator(rank=0, size=1, timeout_ms=5000, algo="ring", deterministic=True) as c:
            self.assertEqual(c.size, 1)
            x = np.full(3, 2.0, np.float32)
            c.allreduce(x)
            np.testing.assert_array_equal(x, [2, 2, 2])

    def test_closed_communicator_is_refused(self):
        c = tandem.Communicator()
        c.close()
        self.assertTandemError(tandem.ERR_INVALID_ARGUMENT, "closed", c.barrier)

    def test_split(self):
        sub = self.comm.split(0, 0)
        self.assertEqual(sub.size, 1)
        sub.close()
        self.assertIsNone(self.comm.split(-1))


class FourRanks(unittest.TestCase):
    def test_launch_four_ranks(self):
        # CTest sets TANDEM_CLI; otherwise the build tree's bin/ beside the loaded lib/.
        cli = os.environ.get("TANDEM_CLI") or os.path.join(os.path.dirname(tandem.LIBRARY_PATH), "..", "bin", "tandem")
        self.assertTrue(os.path.exists(cli), "no tandem executable at %s (set TANDEM_CLI)" % cli)
        env = dict(os.environ, TANDEM_LIBRARY=tandem.LIBRARY_PATH, TANDEM_TIMEOUT_MS="30000")
        p = subprocess.run([cli, "launch", "-n", "4", "--", sys.executable, os.path.join(HERE, "collectives_script.py")],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, text=True)
        self.assertEqual(p.returncode, 0, p.stdout)
        for r in range(4):
            self.assertIn("PASS rank %d of 4" % r, p.stdout)


if __name__ == "__main__":
    unittest.main()
