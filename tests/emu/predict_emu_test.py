#!/usr/bin/python3
"""CI short version of the predicted-vs-measured benchmark (issue #6; bench/emu/predict_bench.py is the full one).

  predict_emu_test.py --tool tools/emu-cluster --tandem build/.../bin/tandem

On 2 emulated t2.micro hosts (65 Mbit/s, 1 GiB, 0.5 core each):
  1. `tandem calibrate` on both hosts at once (lenet5, batch 32; p2p between the hosts);
  2. `tandem train --strategy ddp` for 2 short epochs with `--predict`: rank 0 prints the simulator's prediction
     beside the measured step; the error is printed and must be within a factor of two (a sanity bound: the
     benchmark reports the real accuracy);
  3. the memory guard on the host's real memory cgroup: a job needing well over 1 GiB exits with Tandem's own
     out-of-memory error naming the cgroup limit -- not killed by the kernel (exit 137).
Exit 0 when every check passed, 1 when one failed, 77 (CTest SKIP_RETURN_CODE) when this machine cannot run it
(not root, no network namespaces, no writable cgroups), with the reason printed. The cluster is always torn down.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "emu"))
import emu_test  # noqa: E402  (preconditions and checks shared with the cluster's own test)
import predict_lib  # noqa: E402

SKIP = 77


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tandem", required=True)
    a = ap.parse_args()
    tool = os.path.realpath(a.tool)
    name = f"emuq{os.getpid() % 100000}"
    checks = emu_test.Checks()
    t0 = time.monotonic()
    rc = 0
    up = False
    try:
        emu_test.preconditions(tool)
        why = emu_test.cgroups_writable(tool)
        if why:
            raise emu_test.Skip(f"the CPU quota and memory limit need writable cgroups: {why}")
        tandem = predict_lib.find_tandem(a.tandem)
        predict_lib.emu(["up", "--name", name, "--hosts", "2", "--preset", "t2.micro"])
        up = True
        st = predict_lib.cluster_status(name)
        addr0 = st["hosts"][0]["addr"]
        print(f"# 2 emulated t2.micro hosts: {st['config']['bw_mbit']} Mbit/s, {st['config']['mem_mb']} MiB")
        print(f"# {st['caveat']}", flush=True)
        with tempfile.TemporaryDirectory(prefix="tandem_emu_predict_") as tmp:
            os.chmod(tmp, 0o755)
            profile = os.path.join(tmp, "lenet5_b32.json")
            model = ["--model", "lenet5", "--dataset", "synthetic"]
            cal = predict_lib.calibrate(tandem, name, addr0, 2, model, 32, profile, iters=6)
            checks.check(os.path.isfile(profile), "calibrate writes the profile", profile)
            checks.check("p2p_bytes_per_s" in cal and 0 < cal["p2p_bytes_per_s"] * 8 / 1e6 < 70,
                         "calibrate measures the emulated link (<= 65 Mbit/s)",
                         f"{cal.get('p2p_bytes_per_s', 0) * 8 / 1e6:.1f} Mbit/s, "
                         f"latency {cal.get('p2p_latency_s', 0) * 1e6:.0f} us")
            print(f"# calibrated: step {cal['step_mean_s'] * 1e3:.2f} ms at batch 32 (mean; median "
                  f"{cal['step_median_s'] * 1e3:.2f} ms)", flush=True)
            cluster = predict_lib.cluster_description(st)
            train = model + ["--strategy", "ddp", "--batch", "32", "--epochs", "2", "--limit-batches", "10",
                             "--eval-limit-batches", "1", "--test-limit", "64", "--threads", "1"]
            pred, _ = predict_lib.train_predict(tandem, name, addr0, 2, train, cluster, profile, timeout=120)
            m, p = pred["measured_step_s"], pred["predicted_step_s"]
            err = pred["step_error"]
            print(f"ddp 2x1 lenet5 batch 32: measured step {m * 1e3:.2f} ms, predicted {p * 1e3:.2f} ms, "
                  f"error {err * 100:+.1f}% (exposed comm measured {pred['measured_comm_s'] * 1e3:.2f} ms, "
                  f"predicted {pred['predicted_comm_s'] * 1e3:.2f} ms)", flush=True)
            checks.check(m > 0 and p > 0 and abs(err) < 1.0, "prediction within a factor of two of the measured step",
                         f"error {err * 100:+.1f}%")

            # Emulated hosts are hosts: their ranks keep to TCP over the shaped link (local sockets are
            # scoped by the network namespace) and a communicator counts them as 2 hosts, though
            # they share the machine's host name.
            code, per_rank, out = predict_lib.run_launch(
                tandem, name, addr0, 2, [tandem, "bench", "allreduce", "--sizes", "64K", "--iters", "3"],
                timeout=120, env=dict(os.environ, TANDEM_LOG_LEVEL="debug"))
            tail = out.strip().splitlines()[-3:]
            checks.check(code == 0 and "0 of 1 peers over local sockets" in out and "(2 host(s))" in out,
                         "ranks on two emulated hosts meet over TCP and count as two hosts",
                         f"exit {code}: {' | '.join(tail)[:400]}")

            # The memory guard against the host's real cgroup limit (1 GiB): refused with Tandem's own error.
            big = [tandem, "train", "--model", "mobilenetv2", "--dataset", "synthetic", "--batch", "1024",
                   "--epochs", "1", "--limit-batches", "1", "--threads", "1"]
            g = subprocess.run([tool, "exec", "--name", name, "0", "--"] + big, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=120)
            last = g.stdout.strip().splitlines()[-1:] or [""]
            checks.check(g.returncode == 1 and "out of memory" in g.stdout and "cgroup" in g.stdout,
                         "an over-limit job fails with Tandem's out-of-memory error naming the cgroup limit",
                         f"exit {g.returncode}: {last[0][:400]}")
        rc = 1 if checks.failed else 0
    except emu_test.Skip as e:
        print(f"SKIPPED: {e}", flush=True)
        rc = SKIP
    except predict_lib.NotReady as e:
        print(f"FAIL: the tandem binary cannot run this test: {e}", flush=True)
        rc = 1
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - reported, then the cluster is torn down
        print(f"FAIL: {type(e).__name__}: {e}", flush=True)
        rc = 1
    finally:
        if up:
            predict_lib.emu(["down", "--name", name], check=False)
    if checks.failed:
        print(f"{len(checks.failed)} check(s) failed: {checks.failed}")
    print(f"emu predict test took {time.monotonic() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
