#!/usr/bin/python3
"""bench/emu/netcpu_calibrate.py's arithmetic, without a cluster or root: the least-squares split of a host's cgroup
CPU into a fixed part, a per-byte and a per-wake-up figure, which wake-ups each host's rows take, the profile's
means, and the merge into a calibration profile. Nothing here is timed. Exit 0 when every check passed, 1 otherwise.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "bench", "emu"))
import netcpu_calibrate as nc  # noqa: E402


def run(bytes_, writes, reads, cpu0, cpu1):
    return {"bytes": bytes_, "paced": {"sender_writes": writes, "receiver_reads": reads}, "cgroup_cpu_s": [cpu0, cpu1]}


class Fit(unittest.TestCase):
    def test_recovers_the_figures_of_exact_rows(self):
        fixed, b, w = 0.08, 2.5e-8, 3.0e-5
        rows = [(by, wk, fixed + b * by + w * wk) for by, wk in
                [(1.6e7, 500), (4.8e7, 500), (1.6e7, 2500), (4.8e7, 2500), (1.7e7, 500)]]
        f = nc.fit_usage(rows)
        self.assertAlmostEqual(f["fixed_s"], fixed, places=9)
        self.assertAlmostEqual(f["per_byte_s"] / b, 1.0, places=7)
        self.assertAlmostEqual(f["per_wakeup_s"] / w, 1.0, places=7)
        self.assertLess(f["residual_rms_s"], 1e-9)

    def test_least_squares_splits_the_noise(self):
        # +-1 ms alternating noise on a 2 x 2 plan repeated: the figures stay within a few percent
        rows = []
        for i, (by, wk) in enumerate([(1.6e7, 500), (4.8e7, 500), (1.6e7, 2500), (4.8e7, 2500)] * 2):
            rows.append((by, wk, 0.05 + 1e-8 * by + 2e-5 * wk + (1e-3 if i % 2 else -1e-3)))
        f = nc.fit_usage(rows)
        self.assertAlmostEqual(f["per_byte_s"] / 1e-8, 1.0, delta=0.05)
        self.assertAlmostEqual(f["per_wakeup_s"] / 2e-5, 1.0, delta=0.1)
        self.assertGreater(f["residual_rms_s"], 0)

    def test_a_plan_that_does_not_vary_wakeups_is_refused(self):
        rows = [(1.6e7, 500, 0.5), (4.8e7, 500, 1.3), (3.2e7, 500, 0.9)]
        with self.assertRaisesRegex(ValueError, "vary --seconds and --writes"):
            nc.fit_usage(rows)

    def test_too_few_runs_are_refused(self):
        with self.assertRaisesRegex(ValueError, "at least 3 runs, got 2"):
            nc.fit_usage([(1.0, 1.0, 1.0), (2.0, 3.0, 4.0)])


class Plumbing(unittest.TestCase):
    def test_sender_rows_take_writes_and_receiver_rows_reads(self):
        runs = [run(10, 500, 420, 0.1, 0.2), run(20, 2500, 2100, 0.3, 0.4)]
        self.assertEqual(nc.run_rows(runs, 0), [(10, 500, 0.1), (20, 2500, 0.3)])
        self.assertEqual(nc.run_rows(runs, 1), [(10, 420, 0.2), (20, 2100, 0.4)])

    def test_the_profile_takes_the_hosts_means_and_no_negative_wakeup(self):
        figs = nc.figures([{"per_byte_s": 1e-9, "per_wakeup_s": -5e-6}, {"per_byte_s": 3e-9, "per_wakeup_s": 4e-5}])
        self.assertAlmostEqual(figs["tcp_cpu_s_per_byte"], 2e-9)
        self.assertAlmostEqual(figs["tcp_cpu_s_per_wakeup"], 2e-5)

    def test_merge_replaces_the_transfer_figures_and_keeps_the_rest(self):
        prof = {"tcp_cpu_s_per_byte": 2.9e-10, "tcp_cpu_s_per_wakeup": 1.8e-5, "copy_cpu_s_per_byte": 1.3e-10,
                "layers": [1]}
        out = nc.merge_profile(prof, {"tcp_cpu_s_per_byte": 7e-9, "tcp_cpu_s_per_wakeup": 3e-5, "other": 1})
        self.assertEqual(out, {"tcp_cpu_s_per_byte": 7e-9, "tcp_cpu_s_per_wakeup": 3e-5, "copy_cpu_s_per_byte": 1.3e-10,
                               "layers": [1]})
        self.assertEqual(prof["tcp_cpu_s_per_byte"], 2.9e-10)  # the input is not changed

    def test_merge_refuses_a_missing_or_negative_figure(self):
        with self.assertRaisesRegex(ValueError, "tcp_cpu_s_per_wakeup: expected a figure >= 0, got None"):
            nc.merge_profile({}, {"tcp_cpu_s_per_byte": 1e-9})
        with self.assertRaisesRegex(ValueError, "tcp_cpu_s_per_byte: expected a figure >= 0, got -1"):
            nc.merge_profile({}, {"tcp_cpu_s_per_byte": -1, "tcp_cpu_s_per_wakeup": 0})

    def test_the_plan_crosses_times_and_writes(self):
        self.assertEqual(nc.plan([2.0, 6.0], [500, 2500], 2),
                         [(2.0, 500), (2.0, 2500), (6.0, 500), (6.0, 2500)] * 2)


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
