"""`tandem calibrate --network` (cli/calibrate_network.hpp) on loopback (run by CTest with TANDEM_CLI set; standard
library only): the two sides measure RTT and goodput and the peer writes the JSON the cluster JSON takes; no peer,
a peer that speaks something else, one that dies mid-way and bad arguments each end in a clear error within the
deadline. Every process the test starts is bounded by a timeout and killed by its PID."""
import json
import math
import os
import socket
import subprocess
import tempfile
import threading
import time
import unittest

CLI = os.environ.get("TANDEM_CLI", "tandem")


def tandem(*args, timeout=60):
    p = subprocess.run([CLI] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout


class Listener:
    """`calibrate --network --listen 0` in the background; .port is the port it printed."""

    def __init__(self, *extra):
        self.p = subprocess.Popen([CLI, "calibrate", "--network", "--listen", "0", *extra], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        line = self.p.stdout.readline()
        assert line.startswith("listening on port "), line
        self.port = int(line.split()[-1])

    def finish(self, timeout=30):
        try:
            out, _ = self.p.communicate(timeout=timeout)
        finally:
            if self.p.poll() is None:
                os.kill(self.p.pid, 9)
                self.p.wait()
        return self.p.returncode, out


def fake_server(behaviour):
    """A one-connection TCP server on loopback running behaviour(conn) in a thread; returns (port, thread)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(20)

    def run():
        try:
            conn, _ = srv.accept()
            with conn:
                behaviour(conn)
        except OSError:
            pass
        finally:
            srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv.getsockname()[1], t


HELLO = b"TANDEM-NET v3\n\0\0"
OLD_HELLO = b"TANDEM-NET v1\n\0\0"  # a tandem from before the CPU phases
V2_HELLO = b"TANDEM-NET v2\n\0\0"  # a tandem from before the two-way phase


def peer_against(behaviour, timeout_s):
    """`calibrate --network --peer` against a fake server; (exit code, output, seconds it took)."""
    port, t = fake_server(behaviour)
    t0 = time.monotonic()
    rc, out = tandem("calibrate", "--network", "--peer", f"127.0.0.1:{port}", "--timeout-s", str(timeout_s))
    took = time.monotonic() - t0
    t.join(10)
    return rc, out, took


class NetworkCalibrate(unittest.TestCase):
    def test_loopback_measures_rtt_and_goodput(self):
        lst = Listener()
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "net.json")
            t0 = time.monotonic()
            rc, text = tandem("calibrate", "--network", "--peer", f"127.0.0.1:{lst.port}", "--seconds", "0.5",
                              "--rounds", "20", "--nominal-mbps", "1000000", "--out", out)
            self.assertEqual(rc, 0, text)
            self.assertLess(time.monotonic() - t0, 20)
            lrc, ltext = lst.finish()
            self.assertEqual(lrc, 0, ltext)
            self.assertIn("Mbit/s", ltext)
            with open(out) as f:
                j = json.load(f)
        self.assertEqual(j["rtt_samples"], 20)
        self.assertGreater(j["rtt_us"], 0)
        self.assertLess(j["rtt_us"], 1e5)  # loopback: well under 100 ms
        self.assertLessEqual(j["rtt_min_us"], j["rtt_us"])
        self.assertGreater(j["goodput_mbps"], 10)  # loopback moves far more than 10 Mbit/s
        self.assertGreater(j["seconds"], 0.1)
        self.assertAlmostEqual(j["goodput_mbps"], j["bytes"] * 8 / j["seconds"] / 1e6, delta=1e-6 * j["goodput_mbps"])
        # the factor the link model wants: goodput over what the headers allow at the nominal rate
        self.assertAlmostEqual(j["tcp_goodput"], j["goodput_mbps"] / (1e6 * 1448 / 1514), delta=1e-9)
        node = j["cluster_node"]
        self.assertEqual(node["nic_mbps"], 1e6)
        self.assertEqual(node["tcp_goodput"], j["tcp_goodput"])
        self.assertAlmostEqual(node["nic_latency_us"], j["rtt_us"] / 2)
        # the CPU a transfer costs on each side: per byte (bulk phase) and per wake-up (paced phase)
        for key in ("tcp_cpu_s_per_byte", "tcp_cpu_s_per_wakeup"):
            f = j[key]
            for side in ("sender", "receiver", "mean"):
                self.assertTrue(math.isfinite(f[side]), (key, f))
                self.assertGreater(f[side], 0, (key, f))
            self.assertAlmostEqual(f["mean"], (f["sender"] + f["receiver"]) / 2, delta=1e-9 * f["mean"])
        self.assertLess(j["tcp_cpu_s_per_byte"]["mean"], 1e-6)  # loopback: ~2e-10 here; 1 us a byte is absurd
        self.assertLess(j["tcp_cpu_s_per_wakeup"]["mean"], 0.01)
        cpu = j["comm_cpu"]
        self.assertEqual(cpu["bulk"]["bytes"], j["bytes"])
        self.assertAlmostEqual(j["tcp_cpu_s_per_byte"]["sender"], cpu["bulk"]["sender_cpu_s"] / j["bytes"])
        paced = cpu["paced"]
        self.assertEqual(paced["bytes"], paced["chunk_bytes"] * paced["sender_writes"])
        self.assertGreaterEqual(paced["receiver_reads"], 1)
        self.assertLessEqual(paced["receiver_reads"], paced["bytes"])
        # per wake-up: the paced CPU less the bytes' share at the bulk per-byte figure (api/src/comm_cpu_fit.hpp)
        want = (paced["receiver_cpu_s"] - paced["bytes"] * j["tcp_cpu_s_per_byte"]["receiver"]) / paced["receiver_reads"]
        self.assertAlmostEqual(j["tcp_cpu_s_per_wakeup"]["receiver"], max(want, 0), delta=1e-9)
        # it writes at a fixed interval: 1000 writes 400 us apart take at least 0.4 s
        self.assertGreater(paced["seconds"], paced["sender_writes"] * paced["interval_us"] * 1e-6)

    def test_without_a_nominal_rate_the_line_rate_carries_the_goodput(self):
        lst = Listener()
        rc, text = tandem("calibrate", "--network", "--peer", f"localhost:{lst.port}", "--seconds", "0.2")
        self.assertEqual(rc, 0, text)
        self.assertEqual(lst.finish()[0], 0)
        j = json.loads(text)
        self.assertNotIn("tcp_goodput", j)
        self.assertAlmostEqual(j["cluster_node"]["nic_mbps"], j["goodput_mbps"] * 1514 / 1448)

    def test_paced_writes_sets_the_paced_phase(self):
        # bench/emu/netcpu_calibrate.py varies it; the listener takes the count from the protocol, so both sides agree
        lst = Listener()
        rc, text = tandem("calibrate", "--network", "--peer", f"127.0.0.1:{lst.port}", "--seconds", "0.1",
                          "--paced-writes", "37", "--two-way-reps", "0")
        self.assertEqual(rc, 0, text)
        self.assertEqual(lst.finish()[0], 0)
        paced = json.loads(text)["comm_cpu"]["paced"]
        self.assertEqual(paced["sender_writes"], 37)
        self.assertEqual(paced["bytes"], 37 * paced["chunk_bytes"])
        self.assertLessEqual(paced["receiver_reads"], 37 * paced["chunk_bytes"])

    def test_no_peer_is_a_clear_error(self):
        held = socket.socket()  # bound, never listening: connections to it are refused
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        t0 = time.monotonic()
        rc, out = tandem("calibrate", "--network", "--peer", f"127.0.0.1:{port}", "--timeout-s", "5")
        self.assertEqual(rc, 1, out)
        self.assertIn(f"cannot connect to 127.0.0.1:{port}", out)
        self.assertLess(time.monotonic() - t0, 10)
        held.close()

    def test_a_peer_speaking_something_else_is_named(self):
        rc, out, _ = peer_against(lambda c: (c.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\0\0"), time.sleep(1)), 5)
        self.assertEqual(rc, 1, out)
        self.assertIn("did not answer as `tandem calibrate --network`", out)
        self.assertIn("SSH-2.0", out)

    def test_a_peer_speaking_the_old_version_is_named(self):
        rc, out, _ = peer_against(lambda c: (c.sendall(OLD_HELLO), time.sleep(1)), 5)
        self.assertEqual(rc, 1, out)
        self.assertIn("protocol v1 and this tandem speaks v3", out)
        self.assertIn("run the same tandem version on both hosts", out)
        lst = Listener("--timeout-s", "5")  # and the listener, when an old peer connects to it
        with socket.create_connection(("127.0.0.1", lst.port), timeout=5) as s:
            s.sendall(OLD_HELLO)
            self.assertEqual(s.recv(16), HELLO)
            rc, out = lst.finish()
        self.assertEqual(rc, 1, out)
        self.assertIn("the peer speaks `tandem calibrate --network` protocol v1", out)

    def test_a_peer_from_before_the_two_way_phase_is_named(self):
        rc, out, _ = peer_against(lambda c: (c.sendall(V2_HELLO), time.sleep(1)), 5)
        self.assertEqual(rc, 1, out)
        self.assertIn("protocol v2 and this tandem speaks v3", out)
        self.assertIn("v3 the two-way exchange", out)

    def test_two_way_exchange_against_one_way_transfers(self):
        lst = Listener()
        reps, size, gap = 4, 300000, 20
        rc, text = tandem("calibrate", "--network", "--peer", f"127.0.0.1:{lst.port}", "--seconds", "0.2",
                          "--rounds", "10", "--two-way-bytes", str(size), "--two-way-reps", str(reps),
                          "--two-way-gap-ms", str(gap))
        self.assertEqual(rc, 0, text)
        self.assertEqual(lst.finish()[0], 0)
        j = json.loads(text)
        t = j["two_way"]
        self.assertEqual((t["bytes"], t["repetitions"], t["gap_ms"]), (size, reps, gap))
        for key in ("peer_to_listener", "listener_to_peer"):
            self.assertEqual(len(t["one_way_ms"][key]), reps)
            self.assertEqual(len(t["exchange_direction_ms"][key]), reps)
            for ms in t["one_way_ms"][key] + t["exchange_direction_ms"][key]:
                self.assertTrue(0 < ms < 5000, t)  # loopback: 300 kB in well under 5 s
        for i in range(reps):  # the exchange is its slower direction; the factor, it over the slower one-way transfer
            d = t["exchange_direction_ms"]
            self.assertAlmostEqual(t["exchange_ms"][i], max(d["peer_to_listener"][i], d["listener_to_peer"][i]))
            one = max(t["one_way_ms"]["peer_to_listener"][i], t["one_way_ms"]["listener_to_peer"][i])
            self.assertAlmostEqual(t["factor"][i], t["exchange_ms"][i] / one, delta=1e-9 * t["factor"][i])
        f = t["factor"]
        mean = sum(f) / reps
        self.assertAlmostEqual(t["factor_mean"], mean, delta=1e-9 * mean)
        self.assertAlmostEqual(j["tcp_two_way_factor"], mean, delta=1e-9 * mean)
        sd = math.sqrt(sum((x - mean) ** 2 for x in f) / (reps - 1))
        self.assertAlmostEqual(t["factor_sd"], sd, delta=1e-9 + 1e-9 * sd)
        self.assertEqual((t["factor_min"], t["factor_max"]), (min(f), max(f)))
        self.assertEqual(j["cluster_node"]["tcp_two_way_factor"], max(1.0, mean))  # what the cluster JSON takes
        # each repetition waits the gap before each of its three transfers
        lst = Listener()
        t0 = time.monotonic()
        rc, text = tandem("calibrate", "--network", "--peer", f"127.0.0.1:{lst.port}", "--seconds", "0.1",
                          "--rounds", "5", "--two-way-bytes", "1000", "--two-way-reps", "3", "--two-way-gap-ms", "300")
        self.assertEqual(rc, 0, text)
        self.assertEqual(lst.finish()[0], 0)
        self.assertGreater(time.monotonic() - t0, 3 * 3 * 0.3)
        # none asked for: no two-way figures, and none in the cluster node
        lst = Listener()
        rc, text = tandem("calibrate", "--network", "--peer", f"127.0.0.1:{lst.port}", "--seconds", "0.1",
                          "--two-way-reps", "0")
        self.assertEqual(rc, 0, text)
        self.assertEqual(lst.finish()[0], 0)
        j = json.loads(text)
        self.assertNotIn("two_way", j)
        self.assertNotIn("tcp_two_way_factor", j["cluster_node"])

    def test_a_listener_that_stops_in_the_two_way_phase_is_named(self):
        def until_two_way_then_silent(c):
            c.sendall(HELLO)
            f = c.makefile("rb")
            f.read(16)
            rounds = int.from_bytes(f.read(8), "big")
            for _ in range(rounds):
                c.sendall(f.read(64))
            total = 0
            while True:  # bulk frames until a zero length
                n = int.from_bytes(f.read(4), "big")
                if n == 0:
                    break
                f.read(n)
                total += n
            c.sendall(total.to_bytes(8, "big") + (10**8).to_bytes(8, "big") + (10**6).to_bytes(8, "big"))
            chunk, writes = int.from_bytes(f.read(8), "big"), int.from_bytes(f.read(8), "big")
            f.read(8)
            f.read(chunk * writes)
            c.sendall((chunk * writes).to_bytes(8, "big") + writes.to_bytes(8, "big") + (10**6).to_bytes(8, "big"))
            f.read(24)  # the two-way phase's size, then no answer to the one-way transfer
            time.sleep(4)

        port, t = fake_server(until_two_way_then_silent)
        t0 = time.monotonic()
        rc, out = tandem("calibrate", "--network", "--peer", f"127.0.0.1:{port}", "--seconds", "0.1", "--rounds", "3",
                         "--two-way-bytes", "1000", "--two-way-gap-ms", "0", "--timeout-s", "1")
        took = time.monotonic() - t0
        t.join(10)
        self.assertEqual(rc, 1, out)
        self.assertIn("two-way phase: waiting for the one-way transfer's answer: timed out", out)
        self.assertLess(took, 3.5)

    def test_a_peer_that_dies_mid_way_is_named(self):
        def hello_then_die(c):
            c.sendall(HELLO)
            c.recv(16)
            c.recv(8)  # the round count
            c.recv(64)  # one ping, no answer

        rc, out, took = peer_against(hello_then_die, 5)
        self.assertEqual(rc, 1, out)
        self.assertIn("RTT phase", out)
        self.assertIn("closed the connection", out)
        self.assertLess(took, 4)

    def test_a_silent_peer_times_out(self):
        rc, out, took = peer_against(lambda c: time.sleep(4), 1)
        self.assertEqual(rc, 1, out)
        self.assertIn("hello", out)
        self.assertIn("timed out", out)
        self.assertLess(took, 3.5)

    def test_the_listener_refuses_garbage_and_a_missing_peer(self):
        lst = Listener("--timeout-s", "5")
        with socket.create_connection(("127.0.0.1", lst.port), timeout=5) as s:
            s.sendall(HELLO)
            s.recv(16)
            s.sendall(b"\xff" * 8)  # an absurd round count
            rc, out = lst.finish()
        self.assertEqual(rc, 1, out)
        self.assertIn("rounds", out)
        lst = Listener("--timeout-s", "1")
        t0 = time.monotonic()
        rc, out = lst.finish()
        self.assertEqual(rc, 1, out)
        self.assertIn("waiting for a peer: timed out", out)
        self.assertLess(time.monotonic() - t0, 5)

    def test_bad_arguments(self):
        rc, out = tandem("calibrate", "--network")
        self.assertEqual(rc, 1, out)
        self.assertIn("exactly one of --listen PORT", out)
        rc, out = tandem("calibrate", "--network", "--listen", "0", "--peer", "a:1")
        self.assertEqual(rc, 1, out)
        self.assertIn("exactly one of", out)
        for bad, msg in (("nohost", "expected HOST:PORT"), ("h:99999", "port must be 1..65535"),
                         ("h:x", "port must be")):
            rc, out = tandem("calibrate", "--network", "--peer", bad)
            self.assertEqual(rc, 1, out)
            self.assertIn(msg, out)
        rc, out = tandem("calibrate", "--network", "--peer", "no-such-host.invalid:5", "--timeout-s", "5")
        self.assertEqual(rc, 1, out)
        self.assertIn("cannot resolve", out)
        for flag, value, msg in (("--two-way-reps", "-1", "--two-way-reps: expected 0..1000"),
                                 ("--two-way-bytes", "0", "--two-way-bytes: expected 1.."),
                                 ("--two-way-gap-ms", "-5", "--two-way-gap-ms: expected 0.."),
                                 ("--paced-writes", "0", "--paced-writes: expected 1..1000000, got 0")):
            rc, out = tandem("calibrate", "--network", "--peer", "h:1", flag, value)
            self.assertEqual(rc, 1, out)
            self.assertIn(msg, out)
        rc, out = tandem("calibrate", "--peer", "h:1", "--out", os.devnull)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("--listen and --peer are for --network", out)
        rc, out = tandem("calibrate", "--model", "lenet5")
        self.assertNotEqual(rc, 0, out)
        self.assertIn("--out", out)


if __name__ == "__main__":
    unittest.main()
