"""Fault scenarios through `tandem launch` (fault_rank.c is each rank). Run by CTest with
TANDEM_CLI and FAULT_RANK set; plain unittest, standard library only."""
import os
import re
import subprocess
import time
import unittest

CLI = os.environ.get("TANDEM_CLI", "tandem")
PROG = os.environ.get("FAULT_RANK", "fault_rank")
DEADLINE_MS = 4000  # every rank's collective deadline in these jobs


def launch(n, mode, timeout=90, launch_args=()):
    env = dict(os.environ, TANDEM_TIMEOUT_MS=str(DEADLINE_MS))
    t0 = time.monotonic()
    p = subprocess.run([CLI, "launch", "-n", str(n), *launch_args, "--", PROG, mode], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout, text=True)
    return p.returncode, p.stdout, time.monotonic() - t0


def pids(out):
    return [int(p) for p in re.findall(r"READY rank \d+ pid (\d+)", out)]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not running: read its state.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class Faults(unittest.TestCase):
    def assertNoLeftovers(self, out):
        ps = pids(out)
        self.assertTrue(ps, out)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in ps):
            time.sleep(0.05)
        self.assertEqual([p for p in ps if alive(p)], [], "processes left behind:\n" + out)

    def test_rank_killed_mid_allreduce_fails_every_other_rank_in_time(self):
        n = 4
        for transport in ("tcp", "zmq", "ucx"):
            with self.subTest(transport=transport):
                # The survivors ignore SIGTERM and get a grace period beyond their deadline, so what
                # they report is the library's own detection, not the launcher stopping them.
                rc, out, secs = launch(n, "kill", launch_args=("--transport", transport,
                                                               "--grace-ms", str(DEADLINE_MS + 10000)))
                self.assertNotEqual(rc, 0, out)
                self.assertIn("KILLING rank %d" % (n - 1), out)
                for r in range(n - 1):
                    m = re.search(r"EXPECTED rank %d: allreduce with a dead rank -> (.+?) after (\d+) ms: (.*)" % r,
                                  out)
                    self.assertIsNotNone(m, "rank %d reported no error:\n%s" % (r, out))
                    status, ms, message = m.group(1), int(m.group(2)), m.group(3)
                    self.assertIn(status, ("peer failure", "timeout", "transport error"), out)
                    self.assertLessEqual(ms, DEADLINE_MS + 3000, out)
                    self.assertRegex(message, r"rank %d" % (n - 1), "the error does not name the dead rank: " + message)
                    # tandem_comm_get_failure: the dead rank is blamed, nobody aborted, the origin is a survivor.
                    f = re.search(r"FAILURE rank %d: origin (-?\d+) aborted (\d) blamed([ \d]*)" % r, out)
                    self.assertIsNotNone(f, "rank %d printed no failure status:\n%s" % (r, out))
                    self.assertIn(int(f.group(1)), range(n), out)
                    self.assertEqual(f.group(2), "0", out)
                    self.assertIn(n - 1, [int(x) for x in f.group(3).split()], out)
                self.assertNotIn("UNEXPECTED", out)
                # Issue #17: tearing down after a peer died is bounded by what is outstanding, not a fixed
                # wait (rank 0's rendezvous server waited 3 s for the dead rank's goodbye).
                # zmq: its ROUTER may still hold segments of the failed collective addressed to the dead rank, and
                # ZeroMQ keeps them for the socket's linger (2 s) while a live peer still takes our goodbyes -- bounded,
                # seen in about one run of three; tcp and ucx drop what the dead rank will never take.
                # ucx: in about one run of ten the killed rank leaves its ring successor's shared-memory FIFO claimed
                # but never written, and that survivor's UCX worker receives nothing more (UCX 1.13's shared-memory
                # transports have no peer-failure support); its rendezvous with the other survivor cannot finish, and
                # both gave it up at the end of one 2 s cancel window (since, the deaf-worker check cuts them, and a ucx
                # cancel waits for nothing). The teardown does not wait for what a cancel let go of (it took 1.9 s
                # before, when the bound here was 2.5 s), so it is held to tcp's bound.
                bound = 2500 if transport == "zmq" else 1500
                for r in range(n - 1):
                    d = re.search(r"DESTROYED rank %d after (\d+) ms" % r, out)
                    self.assertIsNotNone(d, "rank %d did not report its teardown:\n%s" % (r, out))
                    self.assertLess(int(d.group(1)), bound, "rank %d took %s ms to tear down:\n%s" % (r, d.group(1), out))
                self.assertNoLeftovers(out)

    def check_mismatch(self, mode):
        n = 4
        rc, out, secs = launch(n, mode)
        self.assertNotIn("UNEXPECTED", out)
        for r in range(n):
            self.assertRegex(out, r"EXPECTED rank %d: .* -> mismatch between ranks after" % r, out)
        self.assertEqual(rc, 0, out)
        self.assertNoLeftovers(out)

    def test_mismatched_collective_kinds_are_a_mismatch_on_every_rank(self):
        self.check_mismatch("mismatch-kind")

    def test_mismatched_counts_are_a_mismatch_on_every_rank(self):
        self.check_mismatch("mismatch-count")

    def test_peer_with_the_wrong_secret_is_refused_and_the_job_goes_on(self):
        n = 3
        rc, out, secs = launch(n, "intruder")
        self.assertRegex(out, r"EXPECTED rank %d: joining with a wrong secret -> (authentication|auth)" % (n - 1))
        for r in range(n - 1):
            self.assertIn("JOB-OK rank %d" % r, out)
        self.assertNotIn("UNEXPECTED", out)
        self.assertEqual(rc, 0, out)
        self.assertNoLeftovers(out)


if __name__ == "__main__":
    unittest.main()
