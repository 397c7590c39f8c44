#!/usr/bin/python3
"""The simulator against the emulated cluster, calibrated on ONE host (issue #16's validation table).

  bench/emu/validate_bench.py [--cases 2x65,3x65,4x65,4x200+1ms,4r2c] [--jobs JOB,...] [--tandem PATH]
                              [--width-mult 0.25] [--batch 32] [--json OUT] [--name N]

1. Calibration, on one emulated t2.micro host (65 Mbit/s, 1 GiB, CFS quota 0.5 core, period 5 ms) and nothing
   else: `tandem calibrate` of LeNet-5 and MobileNetV2 (one thread, batch 32, no batch curve) for Tandem's jobs;
   bench/emu/torch_job.py `profile` (PyTorch 1.13, /usr/bin/python3) for the PyTorch jobs, written in the
   simulator's profile format. Both profiles carry the host's quota (`cpu_quota`), which the simulator takes out
   of their times (a quota's average) and applies again, as on/off windows, on the nodes that have one.
2. Per cluster case, brought up with tools/emu-cluster (rank i on host i; 4r2c: four ranks on one host with no
   quota, i.e. the machine's two cores -- "four ranks on two cores", trying Tandem on one machine):
     tandem-lenet5, tandem-mobilenetv2   `tandem train --strategy ddp --batch 32 --predict` (the run's own job,
                                          predicted with the one-host profile for a description of the case)
     torch-lenet5, torch-mobilenetv2     PyTorch DDP on gloo (torch_job.py ddp) measured;
                                          `tandem simulate --framework pytorch-ddp --profile <PyTorch profile>`
     allreduce-1M, -4M, -16M              `tandem bench allreduce --transport tcp` (median of the slowest rank);
                                          predicted as a DDP step of a one-linear-layer model of that many
                                          gradient bytes in one bucket with no compute
   The cluster description (cluster_json): one node per host, the case's link rate and one-way delay (+50 us for
   the bridge and veth pairs), TCP, the host's quota and period, the CPU's memory bandwidth from the calibration;
   nothing is taken from a multi-host run.
3. One table: case, job, measured, predicted, error; max and median |error| against the targets (10% / 5%).
Needs root; wrap it in `flock /tmp/tandem-emu.lock`. Every cluster is brought down.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import predict_lib  # noqa: E402

SYSTEM_PYTHON = "/usr/bin/python3"
TORCH_JOB = os.path.join(HERE, "torch_job.py")
NETPROBE = os.path.join(predict_lib.REPO, "tests", "emu", "netprobe.py")
TCP_PAYLOAD = 1448.0 / 1514.0  # payload per wire byte of a full TCP segment (the simulator's TCP model)

# name: (hosts, ranks, link Mbit/s or None, one-way delay ms, CPU quota in cores or None)
CASES = {
    "2x65": (2, 2, 65.0, 0.0, 0.5),
    "3x65": (3, 3, 65.0, 0.0, 0.5),
    "4x65": (4, 4, 65.0, 0.0, 0.5),
    "4x200+1ms": (4, 4, 200.0, 1.0, 0.5),
    "4r2c": (1, 4, None, 0.0, None),
    # Not in the default list: 4x200+1ms without its delay, which tells the rate from the latency emulation.
    "4x200": (4, 4, 200.0, 0.0, 0.5),
}
DEFAULT_CASES = ["2x65", "3x65", "4x65", "4x200+1ms", "4r2c"]
JOBS = ["tandem-lenet5", "tandem-mobilenetv2", "torch-lenet5", "torch-mobilenetv2", "allreduce-1M", "allreduce-4M",
        "allreduce-16M"]
SIZES = {"1M": 1 << 20, "4M": 4 << 20, "16M": 16 << 20}
CPU_PERIOD_US = 5000  # tools/emu-cluster's default
CALIB_QUOTA = 0.5


def sh(cmd, timeout=900, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout


def host_exec(name, host):
    return [predict_lib.TOOL, "exec", "--name", name, str(host), "--"]


def up(name, hosts, bw, lat, quota):
    args = ["up", "--name", name, "--hosts", str(hosts)]
    if quota:
        args += ["--preset", "t2.micro", "--cpu-quota", str(quota), "--cpu-period-us", str(CPU_PERIOD_US)]
    else:
        args += ["--preset", "custom"]
    if bw:
        args += ["--bw-mbit", str(bw)]
    if lat:
        args += ["--latency-ms", str(lat)]
    predict_lib.emu(args, timeout=180)
    return predict_lib.cluster_status(name)


def pair_goodput(name, addr1, seconds=2.5):
    """One TCP flow from host 0 to host 1 alone (tests/emu/netprobe.py): its steady payload rate in Mbit/s, the
    one-pair measurement of the link (what `tandem calibrate --network` is meant to give)."""
    port = 5301
    recv = subprocess.Popen(host_exec(name, 1) + [SYSTEM_PYTHON, NETPROBE, "tcp-recv", str(port), str(seconds - 0.5),
                                                  "0.5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)
    sh(host_exec(name, 0) + [SYSTEM_PYTHON, NETPROBE, "tcp-send", addr1, str(port), str(seconds)], timeout=60)
    out = recv.communicate(timeout=60)[0]
    got = predict_lib.json_lines(out.splitlines(), "mbit")
    return got[-1]["mbit"] if got else None


def cluster_json(hosts, ranks, bw, lat, quota, mem_bytes_per_s, pair_mbit=None):
    """The simulator's description of a case: what the emulation was configured with (its tbf queue as
    `nic_queue_bytes`; TANDEM_SIM_NIC_QUEUE=0 leaves it out), and the one-pair TCP goodput where measured (as
    `tcp_goodput`, the share of the TCP ceiling one flow reached; at most 1)."""
    node = {"name": "emu", "count": hosts, "os_reserved_mib": 0, "peak_gflops": 20.0, "protocol": "tcp",
            "mem_gbps": mem_bytes_per_s / 1e9, "memory_mib": 1024 if quota else 8192}
    if quota:
        node.update(vcpus=1, cpu_quota=quota, cpu_period_us=CPU_PERIOD_US)
    else:
        node.update(vcpus=os.cpu_count())
    if ranks > hosts:
        node["ranks_per_node"] = ranks // hosts
    node["nic_mbps"] = bw or 10000.0
    node["nic_latency_us"] = 50.0 + 1000.0 * lat
    if bw and pair_mbit:
        node["tcp_goodput"] = round(min(1.0, pair_mbit / (bw * TCP_PAYLOAD)), 4)
    if bw and os.environ.get("TANDEM_SIM_NIC_QUEUE", "1") != "0":  # the host's tbf is a FIFO of emu-cluster's limit
        node["nic_queue_bytes"] = predict_lib.tbf_limit_bytes(bw, lat)
    return {"nodes": [node], "topology": {"kind": "star"}}


def model_args(model, width):
    a = ["--model", model]
    if model == "mobilenetv2":
        a += ["--width-mult", str(width)]
    return a


class Bench:
    def __init__(self, a, tandem, tmp):
        self.a, self.tandem, self.tmp = a, tandem, tmp
        self.profiles, self.rows, self.calib, self.pairs, self.clusters = {}, [], {}, {}, {}

    # ---- 1. one host ----------------------------------------------------------------------------------------
    def calibrate(self):
        a, name = self.a, self.a.name + "c"
        models = sorted({j.split("-", 1)[1] for j in self.jobs if not j.startswith("allreduce")} | {"lenet5"})
        try:
            up(name, 1, 65.0, 0.0, CALIB_QUOTA)
            print(f"# calibration: one emulated host, quota {CALIB_QUOTA} core (period {CPU_PERIOD_US} us), "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
            for model in models:
                out = os.path.join(self.tmp, f"tandem-{model}.json")
                iters = "30" if model == "lenet5" else "12"
                rc, text = sh(host_exec(name, 0) + [self.tandem, "calibrate"] + model_args(model, a.width_mult) + [
                    "--dataset", "synthetic", "--batch", str(a.batch), "--threads", "1", "--iters", iters,
                    "--curve", "none", "--out", out, "--json"])
                got = predict_lib.json_lines(text.splitlines(), "out")
                if rc != 0 or not got:
                    raise RuntimeError(f"tandem calibrate {model} failed ({rc}):\n{text[-2000:]}")
                with open(out) as f:
                    prof = json.load(f)
                # tandem calibrate records its cgroup's quota itself (the simulator takes it out of the times)
                if abs(float(prof.get("cpu_quota") or 0) - CALIB_QUOTA) > 1e-6:
                    raise RuntimeError(f"tandem calibrate on a {CALIB_QUOTA}-core host recorded cpu_quota "
                                       f"{prof.get('cpu_quota')} in {out}")
                self.profiles[f"tandem-{model}"] = out
                self.calib[f"tandem-{model}"] = got[-1]
                print(f"  tandem {model}: step {got[-1]['step_mean_s'] * 1e3:.2f} ms (mean, at the quota), full speed "
                      f"{got[-1]['step_mean_s'] * CALIB_QUOTA * 1e3:.2f} ms", flush=True)
                if f"torch-{model}" in self.jobs:
                    tout = os.path.join(self.tmp, f"torch-{model}.json")
                    rc, text = sh(host_exec(name, 0) + ["env", "OMP_NUM_THREADS=1", "GLOO_SOCKET_IFNAME=lo", SYSTEM_PYTHON, TORCH_JOB,
                                                        "profile", "--model", model, "--width-mult",
                                                        str(a.width_mult if model == "mobilenetv2" else 1.0),
                                                        "--batch", str(a.batch), "--iters", iters,
                                                        "--tandem-profile", out, "--cpu-quota", str(CALIB_QUOTA),
                                                        "--out", tout])
                    got = predict_lib.json_lines(text.splitlines(), "profile")
                    if rc != 0 or not got:
                        raise RuntimeError(f"torch profile {model} failed ({rc}):\n{text[-2000:]}")
                    # The CPU cost of moving a byte is the host's (tandem calibrate's loopback TCP), and gloo moves
                    # even a same-host rank's bytes through TCP: both fields from the Tandem profile's TCP figure.
                    with open(tout) as f:
                        tprof = json.load(f)
                    if "tcp_cpu_s_per_byte" in prof:
                        tprof["tcp_cpu_s_per_byte"] = tprof["copy_cpu_s_per_byte"] = prof["tcp_cpu_s_per_byte"]
                    if "tcp_cpu_s_per_wakeup" in prof:  # the host's, as the per-byte figure
                        tprof["tcp_cpu_s_per_wakeup"] = prof["tcp_cpu_s_per_wakeup"]
                    for k in SHARED_CORES:  # the host's too: measured by tandem calibrate beside its own passes
                        if k in prof:
                            tprof[k] = prof[k]
                    with open(tout, "w") as f:
                        json.dump(tprof, f, indent=1)
                    self.profiles[f"torch-{model}"] = tout
                    self.calib[f"torch-{model}"] = got[-1]
                    g = got[-1]
                    print(f"  pytorch {g['torch']} {model}: pass {g['wall_s'] * 1e3:.2f} ms (mean, at the quota), "
                          f"full speed {g['wall_s'] * CALIB_QUOTA * 1e3:.2f} ms; process CPU {g['cpu_s'] * 1e3:.2f} "
                          f"ms", flush=True)
        finally:
            predict_lib.emu(["down", "--name", name], check=False)
        with open(self.profiles["tandem-lenet5"]) as f:
            lp = json.load(f)
        self.mem_bps = lp.get("memory_bytes_per_s", 8e9)
        self.comm_cpu = {k: lp[k] for k in COMM_CPU + SHARED_CORES if k in lp}
        print(f"  communication CPU per side (per byte, per wake-up) and shared cores: {self.comm_cpu or 'not measured'}",
              flush=True)

    def stripped(self, profile):
        """`profile` without BEFORE_DROP (the shared-core figures): what the previous model (run 8b's) predicted."""
        out = profile[:-len(".json")] + ".nocomm.json"
        with open(profile) as f:
            p = json.load(f)
        for k in BEFORE_DROP:
            p.pop(k, None)
        with open(out, "w") as f:
            json.dump(p, f, indent=1)
        return out

    def before(self, cfile, args, profile):
        """`tandem simulate` with and without the profile's BEFORE_DROP fields: (with, without) step seconds."""
        return (self.simulate(cfile, args + ["--profile", profile])["step_time_s"],
                self.simulate(cfile, args + ["--profile", self.stripped(profile)])["step_time_s"])

    # ---- 2. the cases ---------------------------------------------------------------------------------------
    def run_case(self, case):
        hosts, ranks, bw, lat, quota = CASES[case]
        name = self.a.name
        try:
            st = up(name, hosts, bw, lat, quota)
            addr0 = st["hosts"][0]["addr"]
            pair = pair_goodput(name, st["hosts"][1]["addr"]) if hosts > 1 and bw and self.a.pair_probe else None
            if pair is not None:
                print(f"# one pair (host 0 -> 1, one TCP flow): {pair:.1f} Mbit/s of payload; TCP ceiling "
                      f"{bw * TCP_PAYLOAD:.1f}", flush=True)
            self.pairs[case] = pair
            cl = cluster_json(hosts, ranks, bw, lat, quota, self.mem_bps, pair)
            cfile = os.path.join(self.tmp, f"cluster-{case}.json")
            with open(cfile, "w") as f:
                json.dump(cl, f)
            self.clusters[case] = cl
            print(f"\n## {case}: {hosts} host(s), {ranks} ranks, link {bw or '-'} Mbit/s, delay {lat} ms, quota "
                  f"{quota or 'none'}; load {os.getloadavg()[0]:.2f}\n# simulator cluster: {json.dumps(cl)}",
                  flush=True)
            for job in self.jobs:
                t0 = time.monotonic()
                self.cpu0 = predict_lib.cpu_snapshot(name)
                try:
                    if job.startswith("tandem-"):
                        meas, pred, extra = self.tandem_job(job, name, addr0, hosts, ranks, cl, cfile)
                    elif job.startswith("torch-"):
                        meas, pred, extra = self.torch_job(job, name, addr0, hosts, ranks, cfile)
                    else:
                        continue
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"  {job}: FAILED: {e}", flush=True)
                    self.rows.append({"case": case, "job": job, "failure": str(e)[-1500:]})
                    continue
                self.add(case, job, meas, pred, extra, time.monotonic() - t0, name)
            ars = [j for j in self.jobs if j.startswith("allreduce-")]
            if ars:
                self.cpu0 = predict_lib.cpu_snapshot(name)
                self.allreduce(case, ars, name, addr0, hosts, ranks, cfile)
        finally:
            predict_lib.emu(["down", "--name", name], check=False)

    def add(self, case, job, meas, pred, extra, wall, name):
        """One row; with the machine's CPU over the job's run (the hosts' cgroups, every other process, softirq):
        a host slowed by anything but its quota shows there."""
        err = pred / meas - 1.0
        cpu = predict_lib.cpu_use(self.cpu0, predict_lib.cpu_snapshot(name))
        if extra.get("predicted_before_s"):
            extra["error_before"] = extra["predicted_before_s"] / meas - 1.0
        row = dict(case=case, job=job, measured_s=meas, predicted_s=pred, error=err, wall_s=wall,
                   load=os.getloadavg()[0], cpu_cores=cpu, **extra)
        self.rows.append(row)
        print(f"  {job:<20} measured {meas * 1e3:9.2f} ms  predicted {pred * 1e3:9.2f} ms  error {err * 100:+6.1f}%  "
              f"({wall:.0f} s; cores: hosts {cpu['hosts']:.2f}, outside {cpu['outside']:.2f}, irq {cpu['irq']:.2f})",
              flush=True)
        if "error_before" in extra:
            print(f"  {'':<20} without {'/'.join(BEFORE_DROP)}: predicted {extra['predicted_before_s'] * 1e3:9.2f} ms  error "
                  f"{extra['error_before'] * 100:+6.1f}%", flush=True)

    def launch(self, name, addr0, hosts, ranks, cmd, timeout=900):
        tmpl = f"{predict_lib.TOOL} exec --name {name} " + ("{rank}" if hosts == ranks else "0") + " --"
        full = [self.tandem, "launch", "--transport", "tcp", "--host-exec", tmpl, "--master-addr", addr0,
                "--timeout-ms", "120000", "-n", str(ranks), "--"] + cmd
        rc, text = sh(full, timeout=timeout)
        per = {}
        for line in text.splitlines():
            if line.startswith("[rank "):
                r, _, rest = line[6:].partition("] ")
                per.setdefault(int(r), []).append(rest)
        return rc, per, text

    def tandem_job(self, job, name, addr0, hosts, ranks, cl, cfile):
        model = job.split("-", 1)[1]
        steps = "30" if model == "lenet5" else "10"
        cmd = [self.tandem, "train"] + model_args(model, self.a.width_mult) + [
            "--dataset", "synthetic", "--strategy", "ddp", "--batch", str(self.a.batch), "--epochs", "2",
            "--limit-batches", steps, "--eval-limit-batches", "1", "--test-limit", "64", "--threads", "1",
            "--predict", "--predict-cluster", json.dumps(cl), "--profile", self.profiles[job], "--json"]
        rc, per, text = self.launch(name, addr0, hosts, ranks, cmd)
        pred = predict_lib.json_lines(per.get(0, []), "prediction")
        if rc != 0 or not pred:
            raise RuntimeError(f"tandem train failed ({rc}):\n{text[-2000:]}")
        p = pred[-1]["prediction"]
        # before (without BEFORE_DROP): the run's own prediction scaled by what `tandem simulate` of the same job
        # gives without the fields over with them
        with open(self.profiles[job]) as f:
            shape = "x".join(str(d) for d in json.load(f)["input"])  # the synthetic data set's: the profile's input
        sim_with, sim_without = self.before(cfile, model_args(model, self.a.width_mult) + [
            "--dataset", "", "--samples", "960", "--input", shape, "--batch", str(self.a.batch), "--strategy", "ddp"],
            self.profiles[job])
        return p["measured_step_s"], p["predicted_step_s"], {
            "measured_comm_s": p.get("measured_comm_s"), "predicted_comm_s": p.get("predicted_comm_s"),
            "predicted_before_s": p["predicted_step_s"] * sim_without / sim_with,
            "simulate_with_s": sim_with, "simulate_without_s": sim_without}

    def simulate(self, cfile, args):
        rc, text = sh([self.tandem, "simulate", "--cluster", cfile, "--json"] + args, timeout=300)
        if rc != 0:
            raise RuntimeError(f"tandem simulate failed ({rc}): {text[-1500:]}")
        return json.loads(text[text.index("{"):])

    def torch_job(self, job, name, addr0, hosts, ranks, cfile):
        model = job.split("-", 1)[1]
        steps = "30" if model == "lenet5" else "10"
        port = 29500 + os.getpid() % 1000
        procs = []
        for r in range(ranks):
            env = ["env", f"RANK={r}", f"WORLD_SIZE={ranks}", f"MASTER_ADDR={addr0}", f"MASTER_PORT={port}",
                   "GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1"]
            cmd = host_exec(name, r if hosts == ranks else 0) + env + [
                SYSTEM_PYTHON, TORCH_JOB, "ddp", "--model", model, "--width-mult",
                str(self.a.width_mult if model == "mobilenetv2" else 1.0), "--batch", str(self.a.batch),
                "--warmup", "5", "--steps", steps]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=600)[0])
            except subprocess.TimeoutExpired:
                p.kill()
                outs.append(p.communicate()[0])
        got = predict_lib.json_lines(outs[0].splitlines(), "peer")
        if any(p.returncode != 0 for p in procs) or not got:
            raise RuntimeError(f"pytorch ddp failed ({[p.returncode for p in procs]}):\n{outs[0][-2000:]}")
        args = model_args(model, self.a.width_mult) + [
            "--dataset", "fashion-mnist", "--batch", str(self.a.batch), "--strategy", "ddp", "--framework",
            "pytorch-ddp"]
        sim = self.simulate(cfile, args + ["--profile", self.profiles[job]])
        _, without = self.before(cfile, args, self.profiles[job])
        return got[-1]["step_s"], sim["step_time_s"], {"torch": got[-1]["torch"], "predicted_before_s": without,
                                                       "predicted_comm_s": sim["step_ranks"][0]["comm_exposed_s"]}

    def allreduce(self, case, jobs, name, addr0, hosts, ranks, cfile):
        sizes = [j.split("-", 1)[1] for j in jobs]
        t0 = time.monotonic()
        rc, per, text = self.launch(name, addr0, hosts, ranks, [
            self.tandem, "bench", "allreduce", "--transport", "tcp", "--sizes", ",".join(sizes), "--iters",
            str(self.a.ar_iters), "--warmup", "1", "--json"])
        got = {j["bytes"]: j for j in predict_lib.json_lines(per.get(0, []), "time_us")}
        wall = time.monotonic() - t0
        for s in sizes:
            job = f"allreduce-{s}"
            b = SIZES[s]
            if rc != 0 or b not in got:
                print(f"  {job}: FAILED ({rc}):\n{text[-1500:]}", flush=True)
                self.rows.append({"case": case, "job": job, "failure": text[-1500:]})
                continue
            try:
                # The algorithm the bench's `auto` ran (the runtime's choice for this size and world), by name.
                args = self.allreduce_model(b) + ["--batch", "1", "--strategy", "ddp", "--bucket-mb", "64",
                                                  "--no-overlap", "--algo", got[b]["algo"]]
                sim = self.simulate(cfile, args)
                without = self.simulate(cfile, args[:args.index("--profile") + 1] + [
                    self.stripped(args[args.index("--profile") + 1])] + args[args.index("--profile") + 2:])
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"  {job}: prediction FAILED: {e}", flush=True)
                continue
            self.add(case, job, got[b]["time_us"] * 1e-6, sim["step_time_s"],
                     {"algo": got[b]["algo"], "sim_allreduce": sim.get("allreduce"),
                      "predicted_before_s": without["step_time_s"]}, wall / len(sizes), name)

    def allreduce_model(self, nbytes):
        """A model whose gradients are `nbytes` (flatten + linear 1 -> K with bias: 2K floats) and a profile that
        gives it no compute and the calibrated host's memory bandwidth (the reductions)."""
        k = nbytes // 8
        spec = os.path.join(self.tmp, f"ar{nbytes}.json")
        prof = os.path.join(self.tmp, f"ar{nbytes}-profile.json")
        with open(spec, "w") as f:
            json.dump({"name": f"allreduce{nbytes}", "input": [1, 1, 1], "layers": [
                {"name": "flatten0", "type": "flatten", "inputs": ["input"]},
                {"name": "fc1", "type": "linear", "inputs": ["flatten0"], "out_features": k, "bias": True}]}, f)
        with open(prof, "w") as f:
            json.dump({"format": "tandem-calibration", "version": 1, "backend": "cpu", "model": f"allreduce{nbytes}",
                       "batch": 1, "optimizer_step_s": 1e-9, "memory_bytes_per_s": self.mem_bps, **self.comm_cpu,
                       "layers": [{"name": "flatten0", "forward_s": 1e-9, "backward_s": 1e-9},
                                  {"name": "fc1", "forward_s": 1e-9, "backward_s": 1e-9}]}, f)
        return ["--model-file", spec, "--profile", prof, "--dataset", "", "--samples", "64", "--input", "1x1x1"]


# the profile's communication CPU (simulator/README.md, simulator/comm_cpu.hpp)
COMM_CPU = ("tcp_cpu_s_per_byte", "copy_cpu_s_per_byte", "tcp_cpu_s_per_wakeup")
# the profile's shared-core figures (simulator/compute/profile.hpp; node_cpu.hpp, step.cpp)
SHARED_CORES = ("corun_slowdown", "wakeup_latency_s")
# the "before" column: the prediction without these (run 10: the shared-core figures; run 8: the per-wake-up cost;
# runs 6-7 dropped all of COMM_CPU)
BEFORE_DROP = SHARED_CORES


def print_table(rows):
    ok = [r for r in rows if "measured_s" in r]
    print("\n| case | job | measured | predicted | error | before: predicted | before: error |\n"
          "|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if r in ok:
            b = (f"{r['predicted_before_s'] * 1e3:.2f} ms | {r['error_before'] * 100:+.1f}%" if "error_before" in r
                 else "- | -")
            print(f"| {r['case']} | {r['job']} | {r['measured_s'] * 1e3:.2f} ms | {r['predicted_s'] * 1e3:.2f} ms | "
                  f"{r['error'] * 100:+.1f}% | {b} |")
        else:
            print(f"| {r['case']} | {r['job']} | failed | - | - |")
    if not ok:
        return {}
    errs = [abs(r["error"]) for r in ok]
    s = {"rows": len(ok), "failed": len(rows) - len(ok), "max_abs_error": max(errs),
         "median_abs_error": statistics.median(errs), "within_10": sum(e <= 0.10 for e in errs),
         "within_5": sum(e <= 0.05 for e in errs)}
    eb = [abs(r["error_before"]) for r in ok if "error_before" in r]
    if eb:
        s["before"] = {"rows": len(eb), "max_abs_error": max(eb), "median_abs_error": statistics.median(eb),
                       "within_10": sum(e <= 0.10 for e in eb), "within_5": sum(e <= 0.05 for e in eb)}
        print(f"\nbefore (without {', '.join(BEFORE_DROP)}): max |error| {max(eb) * 100:.1f}%, median |error| "
              f"{statistics.median(eb) * 100:.1f}%; within 10%: {s['before']['within_10']}/{len(eb)}, within 5%: "
              f"{s['before']['within_5']}/{len(eb)}", flush=True)
    print(f"\nmax |error| {s['max_abs_error'] * 100:.1f}% (target 10%: {'met' if s['max_abs_error'] <= 0.10 else 'NOT met'}),"
          f" median |error| {s['median_abs_error'] * 100:.1f}% (target 5%: "
          f"{'met' if s['median_abs_error'] <= 0.05 else 'NOT met'}); within 10%: {s['within_10']}/{len(ok)}, within "
          f"5%: {s['within_5']}/{len(ok)}" + (f"; {s['failed']} failed" if s["failed"] else ""), flush=True)
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"of {', '.join(CASES)}")
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--width-mult", type=float, default=0.25, help="MobileNetV2's width")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--ar-iters", type=int, default=4, help="timed all-reduces per size")
    ap.add_argument("--no-pair-probe", dest="pair_probe", action="store_false",
                    help="leave the one-pair TCP goodput out of the description (configured rate only)")
    ap.add_argument("--tandem")
    ap.add_argument("--json")
    ap.add_argument("--name", default=f"emuv{os.getpid() % 10000}")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("validate_bench: needs root (network namespaces, cgroups); not run", file=sys.stderr)
        return 77
    for c in a.cases.split(","):
        if c not in CASES:
            ap.error(f"--cases: unknown case {c!r} (known: {', '.join(CASES)})")
    for j in a.jobs.split(","):
        if j not in JOBS:
            ap.error(f"--jobs: unknown job {j!r} (known: {', '.join(JOBS)})")
    try:
        tandem = predict_lib.find_tandem(a.tandem)
    except predict_lib.NotReady as e:
        print(f"validate_bench: {e}", file=sys.stderr)
        return 2
    out = {"tandem": tandem, "load_start": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                                      time.gmtime())}
    rc = 0
    with tempfile.TemporaryDirectory(prefix="tandem_validate_") as tmp:
        os.chmod(tmp, 0o755)
        b = Bench(a, tandem, tmp)
        b.jobs = a.jobs.split(",")
        try:
            b.calibrate()
            out["calibration"] = b.calib
            out["profiles"] = {k: json.load(open(v)) for k, v in b.profiles.items()}
            for c in a.cases.split(","):
                b.run_case(c)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"validate_bench: {e}", file=sys.stderr)
            rc = 1
        out["rows"] = b.rows
        out["pair_mbit"], out["clusters"] = b.pairs, b.clusters
        out["summary"] = print_table(b.rows)
    out["load_end"] = os.getloadavg()
    print(f"# load average at start {out['load_start'][0]:.2f}, at end {out['load_end'][0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
