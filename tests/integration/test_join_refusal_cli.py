"""Joiners refused fast (issue #17): `tandem launch --join` aimed at a port where no job runs, or at a job that admits
nobody (a parameter-server job at its --max-ranks, a job without --elastic), fails within seconds naming why, instead
of waiting for an admission that never comes (it waited its whole join wait, or until the job ended). Run by CTest with
TANDEM_CLI set; standard library only; loopback. Every process is bounded by a timeout and killed by PID."""
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from test_grow_cli import PS, TRAIN, env, free_port

CLI = os.environ.get("TANDEM_CLI", "tandem")
# A bound that guards the hang (a joiner waited up to its 60 s join wait, or the job's whole run): not a timing.
REFUSED_WITHIN_S = 30


def join(port, secret_file, train):
    """`tandem launch --join -n 1` at `port`; returns (the completed process, its wall time in s)."""
    t0 = time.monotonic()
    r = subprocess.run([CLI, "launch", "--join", "-n", "1", "--port", str(port), "--transport", "tcp",
                        "--secret-file", secret_file, "--", CLI] + train,
                       capture_output=True, text=True, timeout=120, env=env(TANDEM_JOIN_WAIT_MS="60000"))
    return r, time.monotonic() - t0


class JoinRefusal(unittest.TestCase):
    def files(self):
        tmp = tempfile.mkdtemp(prefix="tandem_joinref_")
        self.addCleanup(shutil.rmtree, tmp, True)
        return free_port(), os.path.join(tmp, "secret")

    def start_job(self, n, port, secret_file, train, launch_args=()):
        """A job of n ranks that trains long enough (its epochs), stopped by PID at the end of the test."""
        job = subprocess.Popen([CLI, "launch", "-n", str(n), "--transport", "tcp", "--port", str(port),
                                "--secret-file", secret_file] + list(launch_args) + ["--", CLI] + train,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), bufsize=1)

        def stop():
            if job.poll() is None:
                job.kill()
            job.communicate(timeout=60)
        self.addCleanup(stop)
        lines = []
        deadline = time.monotonic() + 120
        for line in job.stdout:  # until rank 0 has finished an epoch: the job is training
            lines.append(line)
            if '"epoch":1,' in line:
                return job
            self.assertLess(time.monotonic(), deadline, "".join(lines))
        self.fail("the job ended before its first epoch:\n" + "".join(lines))

    def assert_refused(self, r, wall, *texts):
        out = r.stdout + r.stderr
        self.assertNotEqual(r.returncode, 0, out)
        self.assertLess(wall, REFUSED_WITHIN_S, out)
        for t in texts:
            self.assertIn(t, out)

    def test_no_job_at_the_port_is_named(self):
        port, secret_file = self.files()
        with open(secret_file, "w") as f:
            f.write("a-secret-of-no-job")
        os.chmod(secret_file, 0o600)
        r, wall = join(port, secret_file, TRAIN)
        self.assert_refused(r, wall, "no job answers at 127.0.0.1:%d" % port)

    def test_a_parameter_server_job_at_max_ranks_refuses_a_joiner_at_once(self):
        port, secret_file = self.files()
        train = [w if i == 0 or PS[i - 1] != "--epochs" else "200" for i, w in enumerate(PS)]
        job = self.start_job(3, port, secret_file, train)  # --max-ranks defaults to -n: full
        r, wall = join(port, secret_file, train)
        self.assert_refused(r, wall, "the job is full: 3 ranks run")
        self.assertIsNone(job.poll())  # the job is not disturbed

    def test_a_ddp_job_at_max_ranks_refuses_a_joiner_naming_the_bound(self):
        port, secret_file = self.files()
        train = [w if i == 0 or TRAIN[i - 1] != "--epochs" else "200" for i, w in enumerate(TRAIN)]
        job = self.start_job(2, port, secret_file, train, ["--max-ranks", "2"])
        r, wall = join(port, secret_file, train)
        self.assert_refused(r, wall, "the job is full: 2 of --max-ranks 2")
        self.assertIsNone(job.poll())

    def test_a_job_without_elastic_refuses_a_joiner(self):
        port, secret_file = self.files()
        plain = [w for w in TRAIN if w != "--elastic"]
        plain = [w if i == 0 or plain[i - 1] != "--epochs" else "200" for i, w in enumerate(plain)]
        self.start_job(2, port, secret_file, plain, ["--max-ranks", "3"])
        r, wall = join(port, secret_file, TRAIN)
        self.assert_refused(r, wall, "the job is not elastic")


if __name__ == "__main__":
    unittest.main()
