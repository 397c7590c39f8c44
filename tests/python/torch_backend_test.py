"""tandem.torch: PyTorch's own DDP on the "tandem" torch.distributed backend, under `tandem launch`.

* Every collective the backend offers gives what it must, and bad calls (a non-contiguous or wrong-size tensor, an
  unsupported op or dtype, sizes that differ between ranks) raise an exception naming the operation on every rank and
  never hang (torch_collectives_script.py, 2 and 4 ranks).
* Without a compiler, `import tandem.torch` falls back to the Python backend with a warning that says why.
* DDP trains LeNet-5 (bench/torch/ddp.py, a plain DDP script) on 2 ranks to the very same losses and parameters as on
  gloo, bit for bit: with two ranks every reduction is one addition, so the order cannot differ.
* On 4 ranks the reduction order may differ from gloo's: losses agree to float32 rounding, and every rank holds the
  same parameters.
The ranks run under TANDEM_TORCH_PYTHON when set (CTest `python_torch2_backend`: PyTorch 2.x from PyPI in
/opt/torch2, see shared/TESTBED.md), else under this interpreter (Debian's /usr/bin/python3 with python3-torch).
TANDEM_TORCH_IMPL (cpp or python) picks the implementation under test; cpp is built once, before the ranks start.
Without PyTorch there the test SKIPs (exit 77) saying so.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CLI = os.environ.get("TANDEM_CLI", "tandem")
PYTHON = os.environ.get("TANDEM_TORCH_PYTHON") or sys.executable
IMPL = os.environ.get("TANDEM_TORCH_IMPL") or "python"
sys.path.insert(0, os.path.join(REPO, "bench", "torch"))
import run as bench_run  # noqa: E402  (bench/torch/run.py: torch_env, the environment a PyPI wheel needs)
DDP = os.path.join(REPO, "bench", "torch", "ddp.py")


def torch_env():
    return bench_run.torch_env(PYTHON)


def launch(n, args, timeout=480):  # 4 ranks importing PyTorch 2.x took over 240 s at load 25
    env = dict(torch_env(), PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1",
               TANDEM_TIMEOUT_MS="60000")
    p = subprocess.run([CLI, "launch", "-n", str(n), "--json", "--", PYTHON] + args, env=env,
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
    def script_passes_on_every_rank(self, script, n):
        p = launch(n, [os.path.join(HERE, script)])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        for r in range(n):
            self.assertIn("PASS rank %d of %d (%s)" % (r, n, IMPL), p.stderr)  # launch --json: prints go to stderr

    def test_collectives_and_errors_on_two_ranks(self):
        self.script_passes_on_every_rank("torch_collectives_script.py", 2)

    def test_collectives_and_errors_on_four_ranks(self):
        self.script_passes_on_every_rank("torch_collectives_script.py", 4)

    def test_import_without_a_compiler_falls_back_with_a_warning(self):
        with tempfile.TemporaryDirectory() as empty:
            env = dict(torch_env(), PYTHONPATH=os.path.join(REPO, "bindings", "python"), TANDEM_TORCH_IMPL="auto",
                       CXX="/nonexistent/c++", TANDEM_TORCH_EXT_DIR=empty)
            p = subprocess.run([PYTHON, "-c", "import tandem.torch as t; print('IMPL', t.IMPL)"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("IMPL python", p.stdout)
        self.assertIn("tandem.torch: using the Python backend", p.stderr)
        self.assertIn("because", p.stderr)

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
    if not os.path.exists(PYTHON):
        print("SKIPPED: %s does not exist (PyTorch 2.x from PyPI goes there: see shared/TESTBED.md)" % PYTHON)
        sys.exit(77)
    probe = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"], env=torch_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if probe.returncode != 0:
        print("SKIPPED: PyTorch does not import for %s (apt-get install python3-torch, or TANDEM_BENCH_DEPS=1 "
              "tools/install-deps):\n%s" % (PYTHON, probe.stderr[-1000:]))
        sys.exit(77)
    print("PyTorch %s under %s" % (probe.stdout.strip(), PYTHON))
    if IMPL == "cpp":  # build the extension once here, not in every rank at once
        env = dict(torch_env(), PYTHONPATH=os.path.join(REPO, "bindings", "python"))
        build = subprocess.run([PYTHON, "-c", "import tandem.torch as t; assert t.IMPL == 'cpp'"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
        if build.returncode != 0:
            print("the C++ backend did not build:\n" + build.stderr[-5000:])
            sys.exit(1)
    unittest.main()
