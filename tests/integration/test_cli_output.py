"""What the command line prints where issue #15 asks for it (run by CTest with TANDEM_CLI set; standard library only):
rank 0's progress bar reaches a terminal under `tandem launch` (and stays out of pipes, --json and --log-dir); a
`simulate --nodes` sweep names each point's bottleneck and the command that runs its fastest point; a FedAvg speedup
compares trained samples per second, not a round against a whole epoch; `train --strategy ddp` without a launcher
warns; the demo prints the simulator's prediction beside its measurement and gives its 1-rank baseline every core;
the plot labels each point's dp x pp; a rank program missing from PATH is explained; the README's version mentions
are the project's."""
import json
import os
import pty
import re
import select
import shutil
import subprocess
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET

CLI = os.path.realpath(os.environ.get("TANDEM_CLI", "tandem"))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# variables that would make a process think it is a rank of some job
RANK_VARS = ("TANDEM_RANK", "TANDEM_WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "PMI_SIZE", "PMI_RANK",
             "TANDEM_LAUNCH_PROGRESS", "TANDEM_JOIN")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env.update(OMP_NUM_THREADS="1", TANDEM_TIMEOUT_MS="30000")
    env.update(extra)
    return env


def tandem(*args, timeout=120, env=None):
    p = subprocess.run([CLI] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env or clean_env())
    return p.returncode, p.stdout


def on_terminal(args, timeout=120, stdout_too=False):
    """Runs CLI ARGS with stderr on a pseudo-terminal and stdout on a pipe (or on the terminal too): (rc, stdout,
    what the terminal got)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([CLI] + list(args), stdin=subprocess.DEVNULL,
                         stdout=slave if stdout_too else subprocess.PIPE, stderr=slave, env=clean_env())
    os.close(slave)
    term, out, deadline = b"", b"", time.monotonic() + timeout
    streams = [master] + ([] if stdout_too else [p.stdout.fileno()])
    try:
        while streams:
            left = deadline - time.monotonic()
            if left <= 0:
                p.kill()
                raise AssertionError("timed out after %d s; terminal so far: %r" % (timeout, term))
            ready, _, _ = select.select(streams, [], [], min(left, 1.0))
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # the pty's other side is closed: EIO
                    data = b""
                if not data:
                    streams.remove(fd)
                elif fd == master:
                    term += data
                else:
                    out += data
        return p.wait(timeout=30), out.decode(errors="replace"), term.decode(errors="replace")
    finally:
        os.close(master)
        if p.stdout is not None:
            p.stdout.close()
        if p.poll() is None:
            p.kill()
            p.wait()


TRAIN = ["train", "--model", "lenet5", "--dataset", "synthetic", "--strategy", "ddp", "--epochs", "1",
         "--limit-batches", "8", "--batch", "32", "--threads", "1"]
FULL_BAR = re.compile(r"epoch 1/1 \[#{30}\] 8/8 loss [0-9.]+ [0-9]+ img/s \(2 ranks\) ETA ")


class LaunchProgress(unittest.TestCase):
    def test_rank_0s_bar_reaches_a_terminal_unprefixed(self):
        rc, out, term = on_terminal(["launch", "-n", "2", "--", CLI] + TRAIN)
        self.assertEqual(rc, 0, out + term)
        self.assertRegex(term, FULL_BAR)  # the job's rate: "(2 ranks)"
        self.assertNotIn("[rank 0] \r", term)
        self.assertNotRegex(term, r"\[rank \d\] [^\n]*epoch 1/1 \[")  # drawn as it is, not as a rank's line
        # the finished bar is left as a line of its own
        self.assertRegex(term, FULL_BAR.pattern + r"[0-9:]+ *\r?\n")
        self.assertIn("[rank 0] epoch 1:", out)
        self.assertNotIn("\r", out)

    def test_no_bar_without_a_terminal(self):
        p = subprocess.run([CLI, "launch", "-n", "2", "--", CLI] + TRAIN, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120, env=clean_env())
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("[rank 0] epoch 1:", p.stdout)
        for text in (p.stdout, p.stderr):
            self.assertNotIn("\r", text)
            self.assertNotIn("epoch 1/1 [", text)

    def test_log_dir_files_and_json_stay_clean_on_a_terminal(self):
        with tempfile.TemporaryDirectory() as d:
            rc, out, term = on_terminal(["launch", "-n", "2", "--log-dir", d, "--", CLI] + TRAIN)
            self.assertEqual(rc, 0, out + term)
            self.assertNotIn("epoch 1/1 [", term)
            with open(os.path.join(d, "rank-0.err")) as f:
                err0 = f.read()
            with open(os.path.join(d, "rank-0.out")) as f:
                self.assertIn("epoch 1:", f.read())
            self.assertNotIn("\r", err0)
            self.assertNotIn("epoch 1/1 [", err0)
        rc, out, term = on_terminal(["launch", "-n", "2", "--json", "--", CLI] + TRAIN + ["--json"])
        self.assertEqual(rc, 0, out + term)
        self.assertNotIn("epoch 1/1 [", term)
        lines = out.splitlines()
        self.assertTrue(lines, term)
        for line in lines:
            self.assertIn("rank", json.loads(line), line)


def table(out):
    """The sweep's rows: {nodes: (dp, pp, total_s, fits)}."""
    rows = {}
    for m in re.finditer(r"^\s*(\d+)\s+(\d+)x(\d+)\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s+.*\s(yes|no)$", out, re.M):
        rows[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), float(m.group(4)), m.group(5) == "yes")
    return rows


class Sweeps(unittest.TestCase):
    def test_a_sweep_names_each_bottleneck_and_runs_its_fastest_point(self):
        rc, out = tandem("simulate", "--cluster", "t2.micro:4", "--model", "lenet5", "--dataset", "mnist",
                         "--strategy", "ddp", "--batch", "32", "--nodes", "1,2,4")
        self.assertEqual(rc, 0, out)
        rows = table(out)
        self.assertEqual(sorted(rows), [1, 2, 4], out)
        for n in rows:
            self.assertRegex(out, r"(?m)^  %d nodes: bottleneck \S.*\(\d+%% of the run\)$" % n)
        fitting = [n for n, r in rows.items() if r[3]]
        self.assertTrue(fitting, out)
        best = min(fitting, key=lambda n: rows[n][2])
        dp, pp = rows[best][0], rows[best][1]
        self.assertRegex(out, r"(?m)^  fastest +%d nodes \(dp %d x pp %d\)" % (best, dp, pp))
        run = [l for l in out.splitlines() if l.startswith("  run it ")]
        self.assertEqual(len(run), 1, out)
        args = run[0].split()[2:]
        ranks = dp * pp
        if ranks > 1:
            self.assertEqual(args[:5], ["tandem", "launch", "-n", str(ranks), "--"], run[0])
            cmd = [CLI] + args[1:5] + [CLI] + args[6:]
        else:
            cmd = [CLI] + args[1:]
        p = subprocess.run(cmd + ["--epochs", "1", "--limit-batches", "2", "--train-limit", "256", "--test-limit",
                                  "64", "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=120, env=clean_env())
        self.assertEqual(p.returncode, 0, run[0] + "\n" + p.stdout)
        self.assertIn("epoch 1:", p.stdout)

    def test_the_readmes_hybrid_sweep_and_its_plot(self):
        # README.md's sweep (fewer epochs): no 1-node row, said so as the README says; each point labelled dp x pp
        with tempfile.TemporaryDirectory() as d:
            svg = os.path.join(d, "scaling.svg")
            rc, out = tandem("simulate", "--cluster", "t2.micro:4", "--model", "mobilenetv2", "--dataset", "cifar10",
                             "--batch", "64", "--strategy", "hybrid", "--dp", "2", "--pp", "2", "--microbatches", "4",
                             "--nodes", "1,2,4,8", "--plot", svg)
            self.assertEqual(rc, 0, out)
            rows = table(out)
            self.assertEqual(sorted(rows), [2, 4, 8], out)
            self.assertIn("1 nodes: not simulated (1 device(s) do not split into --pp 2 stages)", out)
            with open(os.path.join(REPO, "README.md")) as f:
                readme = f.read()
            at = readme.index("--nodes 1,2,4,8 --plot scaling.svg")
            self.assertIn("1 node cannot split into --pp 2 stages: printed as not simulated", readme[at:at + 400])
            texts = [t.text for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}text")]
            self.assertTrue(any("labels: dp x pp" in (t or "") for t in texts), texts)
            for n, (dp, pp, _, _) in rows.items():
                self.assertIn("%dx%d" % (dp, pp), texts)
            self.assertEqual({"1x2", "2x2", "4x2"}, {t for t in texts if re.fullmatch(r"\d+x\d+", t or "")})

    def test_a_fedavg_speedup_counts_trained_samples(self):
        # A round (fedavg's epoch) trains only the sampled clients' data: with a quarter of 8 clients per round the
        # speedup was the whole-epoch baseline over a round, "7.2x, 180%", blamed on caches.
        base = ["simulate", "--cluster", "t2.micro:4", "--model", "lenet5", "--dataset", "mnist", "--strategy",
                "fedavg", "--clients", "8"]
        for fraction in ("0.25", "1"):
            rc, out = tandem(*base, "--client-fraction", fraction, "--json")
            self.assertEqual(rc, 0, out)
            j = json.loads(out)
            one_ips = j["samples"] * j["epochs"] / j["baseline_total_time_s"]
            self.assertAlmostEqual(j["speedup"], j["images_per_sec"] / one_ips, delta=1e-6 * j["speedup"])
            self.assertAlmostEqual(j["efficiency"], j["speedup"] / j["ranks"], delta=1e-9)
            trained = j["images_per_sec"] * j["total_time_s"]
            self.assertAlmostEqual(trained / (j["samples"] * j["epochs"]), float(fraction), delta=0.01)
            if fraction == "1":  # a round over every client is an epoch: the plain ratio of times
                self.assertAlmostEqual(j["speedup"], j["baseline_total_time_s"] / j["total_time_s"],
                                       delta=1e-6 * j["speedup"])
        rc, out = tandem(*base, "--client-fraction", "0.25")
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"speedup +[0-9.]+x in trained images/s against one device \([^)]*for an epoch of all "
                              r"60000 samples; a round here trains 15000\), efficiency \d+%")
        self.assertNotIn("caches", out)
        eff = int(re.search(r"efficiency (\d+)%", out).group(1))
        self.assertLessEqual(eff, 100, out)  # 2 clients on 4 workers: half of them idle
        rc, out = tandem(*base, "--client-fraction", "0.25", "--nodes", "1,2,4")
        self.assertEqual(rc, 0, out)
        self.assertIn("speedup: trained images/s against one device", out)
        self.assertNotIn("caches", out)


class Messages(unittest.TestCase):
    def test_ddp_without_a_launcher_warns_and_trains(self):
        rc, out = tandem("train", "--model", "lenet5", "--dataset", "synthetic", "--strategy", "ddp", "--epochs", "1",
                         "--limit-batches", "2", "--batch", "16", "--threads", "1")
        self.assertEqual(rc, 0, out)
        self.assertIn("tandem train: warning: --strategy ddp on a single rank (no launcher announced more); start "
                      "ranks with `tandem launch -n N -- tandem train ...`", out)
        self.assertIn("epoch 1:", out)

    def test_a_rank_program_missing_from_path_is_explained(self):
        if shutil.which("tandem", path="/usr/bin:/bin"):
            self.skipTest("a tandem is installed in /usr/bin or /bin")
        rc, out = tandem("launch", "-n", "1", "--", "tandem", "version", env=clean_env(PATH="/usr/bin:/bin"))
        self.assertEqual(rc, 127, out)
        self.assertIn("cannot run 'tandem': No such file or directory; it is looked up on PATH (this launcher is "
                      + CLI + ": give that path, or export PATH=\"" + os.path.dirname(CLI) + ":$PATH\")", out)
        rc, out = tandem("launch", "-n", "1", "--", "no-such-program-here")
        self.assertEqual(rc, 127, out)
        self.assertIn("it is looked up on PATH (give its path, or put its folder on PATH)", out)

    def test_the_demo_shows_its_prediction_beside_its_measurement(self):
        # on a terminal, as a user runs it: each training run draws its progress bar
        rc, _, out = on_terminal(["demo", "--model", "lenet5", "--batches", "2", "--batch", "32", "--test-limit",
                                  "100"], timeout=180, stdout_too=True)
        out = out.replace("\r\n", "\n")  # the terminal's own line ends
        if "cannot load Fashion-MNIST" in out:
            self.skipTest("Fashion-MNIST is not here: " + out.strip().splitlines()[-1])
        self.assertEqual(rc, 0, out)
        cores = os.sysconf("SC_NPROCESSORS_ONLN")
        self.assertIn("[2/3] 1 rank, %d thread(s)" % cores, out)  # the baseline gets every core
        self.assertIn("[3/3] 4 ranks, hybrid 2 x 2, 1 thread each", out)
        self.assertIn("the 1 rank uses all of them", out)
        self.assertRegex(out, r"(?m)^  per step +measured +predicted +error$")
        self.assertRegex(out, r"(?m)^  step +[0-9.]+ ms +[0-9.]+ ms +[-+]?[0-9.]+%$")
        for part in ("compute", "pipeline bubble", "exposed communication"):
            self.assertRegex(out, r"(?m)^  %s +[0-9.]+ ms +[0-9.]+ ms$" % part)
        # the bars, finished: the one-rank run's, then the 4-rank job's (rank 0's, the job's rate), each on its own
        # line after its phase's line, none prefixed as a rank's output
        one = re.search(r"\[2/3\][^\n]*\n[^\n]*\repoch 1/1 \[#{30}\] 2/2 loss [0-9.]+ [0-9]+ img/s ETA ", out)
        self.assertIsNotNone(one, out)
        # (rank 0 runs the pipeline's first stage: the loss is the last stage's, shown as "--", not "nan")
        four = re.search(r"\[3/3\][^\n]*\n(.*\n)*?[^\n]*epoch 1/1 \[#{30}\] 2/2 loss -- [0-9]+ img/s "
                         r"\(4 ranks\) ETA ", out)
        self.assertIsNotNone(four, out)
        self.assertNotRegex(out, r"\[rank \d\] [^\n]*epoch 1/1 \[")


class Readme(unittest.TestCase):
    def test_the_readmes_versions_are_the_projects(self):
        with open(os.path.join(REPO, "CMakeLists.txt")) as f:
            version = re.search(r"project\(tandem VERSION (\d+)\.(\d+)\.(\d+)", f.read())
        major, minor = version.group(1), version.group(2)
        with open(os.path.join(REPO, "README.md")) as f:
            readme = f.read()
        sonames = re.findall(r"libtandem\.so\.(\d+)\.(\d+)", readme)
        packages = re.findall(r"find_package\(Tandem (\d+)\.(\d+)", readme)
        self.assertTrue(sonames and packages, "the README names no soname or find_package version")
        for found in sonames + packages:
            self.assertEqual(found, (major, minor), "README.md names %s.%s; CMakeLists.txt's version is %s" %
                             (found + (version.group(0),)))
