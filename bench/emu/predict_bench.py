#!/usr/bin/python3
"""Predicted beside measured on 4 emulated t2.micro hosts (issue #6).

  bench/emu/predict_bench.py [--hosts 4] [--models lenet5,mobilenetv2] [--width-mult 0.25] [--micro-batch 32]
                             [--epochs 2] [--steps 20] [--configs ddp,gpipe,1f1b,hybrid] [--tandem PATH]
                             [--no-memory] [--json OUT]

Brings up the cluster (tools/emu-cluster, preset t2.micro: 65 Mbit/s, 1 GiB and 0.5 core per host -- see the CPU
caveat printed below), then per model:
  1. `tandem calibrate` on all hosts at once at the micro-batch size every configuration runs (compute averaged
     over the hosts, point-to-point bandwidth and latency between hosts 0 and 1), rank i on host i;
  2. per configuration -- DDP 4x1 (batch 32 per replica), pipeline 1x4 with GPipe and with 1F1B (batch 128 in 4
     micro-batches), hybrid 2x2 (batch 64 per replica in 2 micro-batches, 1F1B) -- the same global batch of 128
     and the same micro-batch of 32: `tandem train --epochs E --limit-batches S --predict` (E - 1 warm-up epochs;
     the figures are the last epoch's per-step means over the ranks), and the simulator's prediction for the
     same job on a cluster description matching the emulation (cluster_description in predict_lib.py), with
     the calibration profile and its measured link figures;
  3. a table: configuration, measured step, predicted step, error; exposed communication and bubble measured and
     predicted; whether the simulator orders the configurations as the measurements do.
Then (unless --no-memory) the memory target: mobilenetv2 at a batch whose single-host need exceeds the 1 GiB limit
fails on one host with Tandem's own out-of-memory error (exit 1; with TANDEM_MEMORY_GUARD=0 the kernel kills the
same job, exit 137), runs when
pipelined over the 4 hosts (1F1B, 8 micro-batches), and the simulator's memory check predicts both outcomes.
The cluster is always torn down. Needs root. Takes several minutes; the machine is shared -- run it once.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import predict_lib  # noqa: E402

GLOBAL_BATCH = 128


def configs(micro, hosts):
    """(label, train flags) for the four configurations; every one runs micro-batches of `micro` samples."""
    g = micro * hosts  # the global batch
    # Stages balanced by measured time (rank 0 times the layers when the trainer is created); the prediction is
    # handed the run's own cut (tandem_trainer_predict passes the trainer's boundaries), so same_cut is always yes.
    cut = ["--partition", "measured"]
    return {
        "ddp": (f"DDP {hosts}x1", ["--strategy", "ddp", "--batch", str(micro)]),
        "gpipe": (f"pipeline 1x{hosts} GPipe", ["--strategy", "pipeline", "--batch", str(g), "--microbatches",
                                                 str(hosts), "--schedule", "gpipe"] + cut),
        "1f1b": (f"pipeline 1x{hosts} 1F1B", ["--strategy", "pipeline", "--batch", str(g), "--microbatches",
                                               str(hosts), "--schedule", "1f1b"] + cut),
        "hybrid": (f"hybrid {hosts // 2}x2", ["--strategy", "hybrid", "--dp", str(hosts // 2), "--pp", "2", "--batch",
                                               str(2 * micro), "--microbatches", "2", "--schedule", "1f1b"] + cut),
    }


def model_args(model, width):
    a = ["--model", model, "--dataset", "synthetic"]
    if model == "mobilenetv2":
        a += ["--width-mult", str(width)]
    return a


def order(rows, key):
    return [r["config"] for r in sorted(rows, key=lambda r: r[key])]


def simulate_memory(tandem, cluster, model, width, dataset_input, batch, strategy, pp, micro, schedule):
    """The simulator's memory verdict through the Python binding (the C ABI): (fits, need of the largest node in
    bytes). libtandem.so is the one next to the tandem binary (build/<x>/lib)."""
    libs = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(tandem)), "lib", "libtandem.so*")))
    if not libs:
        raise RuntimeError(f"no libtandem.so next to {tandem}")
    os.environ.setdefault("TANDEM_LIBRARY", libs[0])
    sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
    import tandem.simulate as ts  # noqa: E402 - after TANDEM_LIBRARY is set
    r = ts.simulate(cluster, model=model, width_mult=width, dataset="", samples=6000, input=dataset_input, classes=10,
                    batch=batch, strategy=strategy, pp=pp, micro_batches=micro, schedule=schedule,
                    optimizer="momentum", baseline=0)
    return bool(r.fits), r.memory_per_node_bytes


def memory_target(tandem, name, addr0, hosts, cluster, out):
    """mobilenetv2 over the 1 GiB limit on one host; 1F1B over all hosts."""
    batch, micro = 96, 8
    args = ["--model", "mobilenetv2", "--dataset", "synthetic", "--threads", "1", "--epochs", "1",
            "--limit-batches", "2", "--eval-limit-batches", "1", "--test-limit", "64"]
    res = {"model": "mobilenetv2", "batch": batch}
    t0 = time.monotonic()
    one = subprocess.run([predict_lib.TOOL, "exec", "--name", name, "0", "--", tandem, "train", "--batch", str(batch)]
                         + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    res["single_exit"] = one.returncode
    res["single_message"] = (one.stdout.strip().splitlines() or [""])[-1][:600]
    res["single_s"] = time.monotonic() - t0
    # The same job with the guard off: what the kernel does with it (the guard's verdict, checked).
    t0 = time.monotonic()
    off = subprocess.run([predict_lib.TOOL, "exec", "--name", name, "0", "--", "env", "TANDEM_MEMORY_GUARD=0", tandem,
                          "train", "--batch", str(batch)] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=600)
    res["unguarded_exit"] = off.returncode if off.returncode >= 0 else 128 - off.returncode
    res["unguarded_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    rc, per_rank, text = predict_lib.run_launch(
        tandem, name, addr0, hosts, [tandem, "train", "--strategy", "pipeline", "--batch", str(batch),
                                     "--microbatches", str(micro), "--schedule", "1f1b", "--json"] + args, timeout=900)
    res["pipeline_exit"] = rc
    res["pipeline_s"] = time.monotonic() - t0
    if rc != 0:
        res["pipeline_tail"] = text[-1500:]
    try:
        res["sim_single_fits"], res["sim_single_bytes"] = simulate_memory(
            tandem, json.dumps({"nodes": [dict(json.loads(cluster)["nodes"][0], count=1)]}), "mobilenetv2", 1.0,
            (1, 28, 28), batch, "single", 1, 1, "1f1b")
        res["sim_pipeline_fits"], res["sim_pipeline_bytes"] = simulate_memory(
            tandem, cluster, "mobilenetv2", 1.0, (1, 28, 28), batch, "pipeline", hosts, micro, "1f1b")
    except Exception as e:  # noqa: BLE001 - a simulator failure is reported beside the measurement, not fatal
        res["sim_error"] = str(e)
    print(f"\n# memory target: mobilenetv2 (width 1.0), batch {batch}, 1 GiB per host")
    kind = {0: "ran", 1: "Tandem's error", 137: "KILLED by the kernel (137)"}
    print(f"  one host:                exit {res['single_exit']} ({kind.get(res['single_exit'], 'failed')}) in "
          f"{res['single_s']:.1f} s: {res['single_message']}")
    print(f"  one host, guard off:     exit {res['unguarded_exit']} ({kind.get(res['unguarded_exit'], 'failed')}) in "
          f"{res['unguarded_s']:.1f} s")
    print(f"  pipeline 1x{hosts} 1F1B M={micro}: exit {rc} ({kind.get(rc, 'failed')}) in {res['pipeline_s']:.1f} s")
    if "sim_error" in res:
        print(f"  simulator: not run: {res['sim_error']}")
    else:
        print(f"  simulator: one host needs {res['sim_single_bytes'] / 2**20:.0f} MiB -> "
              f"{'fits' if res['sim_single_fits'] else 'does NOT fit'}; pipelined, the largest node needs "
              f"{res['sim_pipeline_bytes'] / 2**20:.0f} MiB -> {'fits' if res['sim_pipeline_fits'] else 'does NOT fit'}")
        res["simulator_agrees"] = (res["sim_single_fits"] == (res["single_exit"] == 0)) and \
            (res["sim_pipeline_fits"] == (rc == 0))
        print(f"  simulator predicts both outcomes: {'yes' if res['simulator_agrees'] else 'NO'}")
    out["memory"] = res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--models", default="lenet5,mobilenetv2")
    ap.add_argument("--width-mult", type=float, default=0.25, help="the reduced mobilenetv2")
    ap.add_argument("--micro-batch", type=int, default=GLOBAL_BATCH // 4)
    ap.add_argument("--epochs", type=int, default=2, help="the last one is measured; the others warm up")
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch")
    ap.add_argument("--configs", default="ddp,gpipe,1f1b,hybrid")
    ap.add_argument("--iters", type=int, default=8, help="calibration passes")
    ap.add_argument("--tandem")
    ap.add_argument("--transport", choices=predict_lib.TRANSPORTS, default=predict_lib.DEFAULT_TRANSPORT,
                    help="what the ranks talk over (default tcp: no I/O thread on the 0.5-core hosts)")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--name", default=f"emup{os.getpid() % 100000}")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("predict_bench: needs root (network namespaces, cgroups); not run", file=sys.stderr)
        return 77
    try:
        tandem = predict_lib.find_tandem(a.tandem)
    except predict_lib.NotReady as e:
        print(f"predict_bench: {e}", file=sys.stderr)
        return 2
    out = {"tandem": tandem, "models": {}}
    rc = 0
    try:
        predict_lib.emu(["up", "--name", a.name, "--hosts", str(a.hosts), "--preset", "t2.micro"])
        st = predict_lib.cluster_status(a.name)
        addr0 = st["hosts"][0]["addr"]
        cluster = predict_lib.cluster_description(st)
        cfg = st["config"]
        print(f"# emulated cluster {a.name}: {a.hosts} x t2.micro: link {cfg['bw_mbit']} Mbit/s, memory "
              f"{cfg['mem_mb']} MiB, cpu {cfg['cpu_quota']} core (period {cfg.get('cpu_period_us')} us)")
        print(f"# {st['caveat']}")
        print(f"# simulator cluster: {cluster}")
        print(f"# {tandem}; global batch {a.micro_batch * a.hosts}, micro-batch {a.micro_batch}; {a.epochs} epochs of "
              f"{a.steps} steps, the last measured; transport {a.transport}; machine load at start "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        out.update(cluster=json.loads(cluster), caveat=st["caveat"], load_start=os.getloadavg()[0],
                   transport=a.transport)
        all_cfg = configs(a.micro_batch, a.hosts)
        with tempfile.TemporaryDirectory(prefix="tandem_predict_bench_") as tmp:
            os.chmod(tmp, 0o755)
            for model in a.models.split(","):
                margs = model_args(model, a.width_mult)
                label = model if model != "mobilenetv2" else f"mobilenetv2 (width {a.width_mult})"
                profile = os.path.join(tmp, f"{model}.json")
                t0 = time.monotonic()
                cpu0 = predict_lib.cpu_snapshot(a.name)
                cal = predict_lib.calibrate(tandem, a.name, addr0, a.hosts, margs, a.micro_batch, profile,
                                            iters=a.iters, transport=a.transport)
                print(f"\n## {label}: calibrated in {time.monotonic() - t0:.0f} s on {cal['ranks']} hosts at batch "
                      f"{cal['batch']}: step {cal['step_mean_s'] * 1e3:.2f} ms (mean; median "
                      f"{cal['step_median_s'] * 1e3:.2f}), link {cal.get('p2p_bytes_per_s', 0) * 8 / 1e6:.1f} Mbit/s, "
                      f"latency {cal.get('p2p_latency_s', 0) * 1e6:.0f} us", flush=True)
                cal["cpu_cores"] = cpu = predict_lib.cpu_use(cpu0, predict_lib.cpu_snapshot(a.name))
                print(f"  calibration's cores: hosts {cpu['hosts']:.2f}, outside {cpu['outside']:.2f}, irq "
                      f"{cpu['irq']:.2f}, steal {cpu['steal']:.2f}", flush=True)
                with open(profile) as f:
                    prof = json.load(f)
                rows = []
                for key in a.configs.split(","):
                    name, flags = all_cfg[key]
                    train = margs + flags + ["--epochs", str(a.epochs), "--limit-batches", str(a.steps),
                                             "--eval-limit-batches", "1", "--test-limit", "64", "--threads", "1"]
                    t0 = time.monotonic()
                    cpu0 = predict_lib.cpu_snapshot(a.name)
                    try:
                        pred, epochs = predict_lib.train_predict(tandem, a.name, addr0, a.hosts, train, cluster,
                                                                 profile, transport=a.transport)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        print(f"  {name}: FAILED: {e}", flush=True)
                        rc = 1
                        continue
                    # What the machine did meanwhile (the whole run, warm-up included) and rank 0's compute per
                    # step: a host slowed by anything but its quota shows here, not only as an error.
                    cpu = predict_lib.cpu_use(cpu0, predict_lib.cpu_snapshot(a.name))
                    split = (epochs[-1].get("time_split") or {}) if epochs else {}
                    row = dict(config=name, wall_s=time.monotonic() - t0, cpu_cores=cpu, **pred)
                    rows.append(row)
                    print(f"  {name:<22} measured {pred['measured_step_s'] * 1e3:8.2f} ms  predicted "
                          f"{pred['predicted_step_s'] * 1e3:8.2f} ms  error {pred['step_error'] * 100:+6.1f}%  "
                          f"({row['wall_s']:.0f} s; rank 0 compute {split.get('compute_s', 0) * 1e3:.1f} ms/step; "
                          f"cores: hosts {cpu['hosts']:.2f}, outside {cpu['outside']:.2f}, irq {cpu['irq']:.2f}, "
                          f"steal {cpu['steal']:.2f})", flush=True)
                out["models"][label] = {"calibration": cal, "profile": prof, "rows": rows}
                print_table(label, rows)
            if not a.no_memory:
                memory_target(tandem, a.name, addr0, a.hosts, cluster, out)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"predict_bench: {e}", file=sys.stderr)
        rc = 1
    finally:
        predict_lib.emu(["down", "--name", a.name], check=False)
    out["load_end"] = os.getloadavg()[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return rc


def print_table(label, rows):
    if not rows:
        return
    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    print(f"\n{label}: per step (mean over ranks, last epoch)")
    print(f"{'configuration':<24} {'measured ms':>11} {'predicted ms':>12} {'error':>7} | {'comm meas':>9} "
          f"{'comm pred':>9} | {'bubble meas':>11} {'bubble pred':>11} | {'mem MiB meas':>12} {'pred':>6} | same cut")
    for r in rows:
        print(f"{r['config']:<24} {ms(r['measured_step_s']):>11} {ms(r['predicted_step_s']):>12} "
              f"{r['step_error'] * 100:>+6.1f}% | {ms(r['measured_comm_s']):>9} {ms(r['predicted_comm_s']):>9} | "
              f"{ms(r['measured_bubble_s']):>11} {ms(r['predicted_bubble_s']):>11} | "
              f"{r['measured_memory_bytes'] / 2**20:>12.0f} {r['predicted_memory_bytes'] / 2**20:>6.0f} | "
              f"{'yes' if r.get('same_cut', True) else 'NO'}")
    for r in rows:
        if len(r.get("sim_stage_boundaries") or []) > 2:
            print(f"  cut of {r['config']}: layers {','.join(map(str, r['sim_stage_boundaries']))} (run and simulator)")
    errs = [abs(r["step_error"]) for r in rows]
    mo, po = order(rows, "measured_step_s"), order(rows, "predicted_step_s")
    print(f"max |error| {max(errs) * 100:.1f}%, mean |error| {sum(errs) / len(errs) * 100:.1f}%; within 10%: "
          f"{sum(e <= 0.10 for e in errs)}/{len(errs)}, within 5%: {sum(e <= 0.05 for e in errs)}/{len(errs)}")
    print(f"order by measured step:  {' < '.join(mo)}")
    print(f"order by predicted step: {' < '.join(po)}")
    print(f"simulator orders the configurations as measured: {'yes' if mo == po else 'NO'}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
