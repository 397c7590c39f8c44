"""tandem.torch: PyTorch's own DDP on the "tandem" torch.distributed backend, under `tandem launch`.

* Every collective the backend offers gives what it must (torch_collectives_script.py, 3 ranks).
* DDP trains LeNet-5 (bench/torch/ddp.py, a plain DDP script) on 2 ranks to the very same losses and parameters as on
  gloo, bit for bit: with two ranks every reduction is one addition, so the order cannot differ.
* On 4 ranks the reduction order may differ from gloo's: losses agree to float32 rounding, and every rank holds the
  same parameters.
Needs PyTorch for Debian's /usr/bin/python3 (python3-torch); without it the test SKIPs (exit 77) saying so.
"""
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CLI = os.environ.get("TANDEM_CLI", "tandem")
DDP = os.path.join(REPO, "bench", "torch", "ddp.py")


def launch(n, args, timeout=240):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1",
               TANDEM_TIMEOUT_MS="60000")
    p = subprocess.run([CLI, "launch", "-n", str(n), "--json", "--", sys.executable] + args, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    return p


def ddp(n, backend, steps=4):
    p = launch(n, [DDP, "--backend", backend, "--model", "lenet5", "--steps", str(steps), "--warmup", "1",
                   "--batch", "32"])
    if p.returncode != 0:
        raise AssertionError("%s on %d ranks failed:\n%s\n%s" % (backend, n, p.stdout, p.stderr[-3000:]))
    lines = sorted((json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")), key=lambda j: j["rank"])
    assert [j["rank"] for j in lines] == list(range(n)), p.stdout
    return lines


class TorchBackend(unittest.TestCase):
    def test_collectives(self):
        p = launch(3, [os.path.join(HERE, "torch_collectives_script.py")])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        for r in range(3):
            self.assertIn("PASS rank %d of 3" % r, p.stderr)  # not JSON: launch --json sends it to stderr

    def test_ddp_matches_gloo_bit_for_bit_on_two_ranks(self):
        ours, gloo = ddp(2, "tandem"), ddp(2, "gloo")
        for a, b in zip(ours, gloo):
            self.assertEqual(a["losses"], b["losses"], "rank %d" % a["rank"])
            self.assertEqual(a["param_checksum"], b["param_checksum"])
        self.assertEqual(ours[0]["param_checksum"], ours[1]["param_checksum"])

    def test_ddp_on_four_ranks_agrees_with_gloo(self):
        ours, gloo = ddp(4, "tandem", steps=2), ddp(4, "gloo", steps=2)
        self.assertEqual(len({j["param_checksum"] for j in ours}), 1, "ranks ended with different parameters")
        for a, b in zip(ours, gloo):
            for x, y in zip(a["losses"], b["losses"]):
                self.assertAlmostEqual(float.fromhex(x), float.fromhex(y), delta=1e-5 * abs(float.fromhex(y)))


if __name__ == "__main__":
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIPPED: PyTorch is not installed for %s (apt-get install python3-torch, or "
              "TANDEM_BENCH_DEPS=1 tools/install-deps)" % sys.executable)
        sys.exit(77)
    unittest.main()
