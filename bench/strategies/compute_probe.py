#!/usr/bin/python3
"""Where a compute-bound strategy's step goes on the emulated t2.micro cluster, beside what the calibration saw.

  flock /tmp/tandem-emu.lock bench/strategies/compute_probe.py [--tandem PATH] [--name N] [--steps 234]
        [--jobs solo,compute4,localsgd,easgd,ddp] [--calib-iters 40] [--json OUT]

On one fresh 4-host t2.micro cluster (65 Mbit/s, 0.5 core, 5 ms CFS period), in this order:
  cal1      `tandem calibrate` (LeNet-5, batch 32, synthetic data, 1 thread) on host 0 ALONE
  cal4      the same on the 4 hosts at once, as strategy_bench does (--iters 8 there)
  solo      `tandem train` (fashion-mnist, batch 32, the bench's job) as ONE rank on host 0, the others idle
  compute4  local SGD with --average-every far beyond the run on 4 hosts: the job's compute path, no exchange
  localsgd  local SGD H=8; easgd: EASGD tau=4; ddp: DDP ring (the control) -- the bench's jobs
Each training job runs --steps steps with `--trace` (forward, backward, optimizer, load batch, exchange spans per
rank) and `--predict` from cal4's profile (as strategy_bench). For every phase the hosts' cgroup counters (cpuacct CPU seconds, CFS
nr_periods / nr_throttled / throttled_time) are read before and after, and /proc/stat gives the machine's CPU
(hosts, everything outside them, interrupts, steal).

Printed per job: wall per step; per rank the mean forward+backward+optimizer span (wall) and its CPU per step
(the host's cgroup CPU over the steps, all threads); the calibration's figures beside them: the pass's CPU time
(step_mean_s x quota, i.e. the profile after full_speed_profile) and the wall time the quota alone gives it.
Nothing here is fed to the simulator; it measures.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench", "emu"))
import predict_lib  # noqa: E402

DATA = ["--model", "lenet5", "--dataset", "fashion-mnist", "--threads", "1", "--batch", "32", "--lr", "0.02",
        "--seed", "1"]
JOBS = {  # key -> (ranks, train flags)
    "solo": (1, ["--strategy", "single"]),
    "compute4": (4, ["--strategy", "localsgd", "--average-every", "10000"]),
    "localsgd": (4, ["--strategy", "localsgd", "--average-every", "8"]),
    "easgd": (4, ["--strategy", "easgd", "--tau", "4"]),
    "ddp": (4, ["--strategy", "ddp"]),
}


def host_counters(name):
    st = predict_lib.cluster_status(name)
    out = []
    for h in st["hosts"]:
        cs = h.get("cpu_stat") or {}
        out.append({"cpu_s": h.get("cpu_seconds") or 0.0, "nr_periods": cs.get("nr_periods", 0),
                    "nr_throttled": cs.get("nr_throttled", 0), "throttled_s": cs.get("throttled_time", 0) / 1e9})
    return out


def counters_delta(a, b):
    return [{k: y[k] - x[k] for k in x} for x, y in zip(a, b)]


def host_task_files(name):
    """Each host's cgroup v1 `tasks` file (every thread of its processes), from the tool's state."""
    st = predict_lib.cluster_status(name)
    with open(os.path.join(st["state_dir"], "state.json")) as f:
        state = json.load(f)
    return [os.path.join(h["cgroups"]["cpu"], "tasks") for h in state["hosts"]]


class ThreadSampler:
    """Every `every_s`, each host's threads' /proc schedstat (ns on a CPU, ns runnable but waiting -- a CFS quota's
    stall included -- and timeslices): the last reading of every thread is kept, so a thread's CPU is known to
    within one interval before it exited."""

    def __init__(self, task_files, every_s=0.05):
        self.files, self.every, self.seen = task_files, every_s, [{} for _ in task_files]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop.is_set():
            for i, tf in enumerate(self.files):
                try:
                    with open(tf) as f:
                        tids = [int(x) for x in f.read().split()]
                except OSError:
                    continue
                for tid in tids:
                    try:
                        with open(f"/proc/{tid}/schedstat") as f:
                            run_ns, wait_ns, slices = (int(x) for x in f.read().split())
                        with open(f"/proc/{tid}/comm") as f:
                            comm = f.read().strip()
                        with open(f"/proc/{tid}/status") as f:
                            tgid = next(int(l.split()[1]) for l in f if l.startswith("Tgid:"))
                    except (OSError, ValueError, StopIteration):
                        continue
                    self.seen[i][tid] = {"tid": tid, "pid": tgid, "comm": comm, "cpu_s": run_ns / 1e9,
                                         "wait_s": wait_ns / 1e9, "slices": slices}
            self.stop.wait(self.every)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def threads(self):
        """Per host: its threads (tandem processes only), by TID."""
        return [sorted((t for t in s.values() if t["comm"].startswith("tandem")), key=lambda t: t["tid"])
                for s in self.seen]


class Phase:
    def __init__(self, name, task_files=None):
        self.name, self.task_files = name, task_files

    def __enter__(self):
        self.h0, self.c0 = host_counters(self.name), predict_lib.cpu_snapshot(self.name)
        self.sampler = ThreadSampler(self.task_files).__enter__() if self.task_files else None
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.wall = time.monotonic() - self.t0
        if self.sampler:
            self.sampler.__exit__()
            self.threads = self.sampler.threads()
        self.hosts = counters_delta(self.h0, host_counters(self.name))
        self.machine = predict_lib.cpu_use(self.c0, predict_lib.cpu_snapshot(self.name))


def run(cmd, timeout):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def trace_split(path, ranks):
    """Per rank: training steps' spans by kind (sum of wall seconds, count): forward, backward, optimizer, data,
    exchange (the strategy's allreduce spans) -- evaluation spans left out."""
    with open(path) as f:
        d = json.load(f)
    ev = d["traceEvents"] if isinstance(d, dict) else d
    out = [{} for _ in range(ranks)]
    for e in ev:
        if e.get("ph") != "X" or not isinstance(e.get("pid"), int) or e["pid"] >= ranks:
            continue
        n, cat = e.get("name", ""), e.get("cat", "")
        if n.startswith("eval"):
            continue
        kind = ("forward" if n.startswith("forward") else "backward" if n.startswith("backward") else
                "optimizer" if cat == "optimizer" else "data" if cat == "data" else
                "exchange" if cat in ("allreduce", "comm") else cat or n)
        s = out[e["pid"]].setdefault(kind, [0.0, 0])
        s[0] += e.get("dur", 0) / 1e6
        s[1] += 1
    return out


def marginal(out, quota):
    """For a job run at two lengths: what the extra steps cost per step (start-up, evaluation and the end cancel):
    per host, its cgroup CPU, its main thread's and its other threads' CPU, the main thread's runnable wait and the
    CFS throttled time; and the training time (the trainer's train_s) per step."""
    ph, res = out["phases"], {}
    by_key = {}
    for spec, rec in ph.items():
        if rec.get("steps") and rec.get("rc") == 0:
            by_key.setdefault(spec.partition(":")[0], []).append(rec)
    cal_cpu = out["phases"]["cal1"]["summary"]["step_mean_s"] * quota
    for key, recs in by_key.items():
        if len(recs) < 2:
            continue
        lo, hi = sorted(recs, key=lambda r: r["steps"])[:: len(recs) - 1]
        d = hi["steps"] - lo["steps"]
        rows = []
        for h in range(hi["ranks"]):
            def main_other(rec):
                ts = rec["threads"][h]
                pids = {t["pid"] for t in ts}
                main = [t for t in ts if t["tid"] in pids]
                return (sum(t["cpu_s"] for t in main), sum(t["cpu_s"] for t in ts if t["tid"] not in pids),
                        sum(t["wait_s"] for t in main))
            m0, o0, w0 = main_other(lo)
            m1, o1, w1 = main_other(hi)
            rows.append({"host_cpu_ms": (hi["hosts"][h]["cpu_s"] - lo["hosts"][h]["cpu_s"]) / d * 1e3,
                         "main_cpu_ms": (m1 - m0) / d * 1e3, "other_cpu_ms": (o1 - o0) / d * 1e3,
                         "main_wait_ms": (w1 - w0) / d * 1e3,
                         "throttled_ms": (hi["hosts"][h]["throttled_s"] - lo["hosts"][h]["throttled_s"]) / d * 1e3})
        train = (hi["epoch"]["train_s"] - lo["epoch"]["train_s"]) / d * 1e3
        res[key] = {"steps": [lo["steps"], hi["steps"]], "train_ms_per_step": train, "hosts": rows}
        for h, r in enumerate(rows):
            r["cores_sustained"] = r["host_cpu_ms"] / train if train > 0 else None
        if key == "solo":  # the job's data path beyond the pass, on the calibrating host: the profile's field
            res[key]["step_overhead_cpu_s"] = rows[0]["host_cpu_ms"] / 1e3 - cal_cpu
            print(f"   step_overhead_cpu_s = {rows[0]['host_cpu_ms']:.3f} - {cal_cpu * 1e3:.3f} ms = "
                  f"{res[key]['step_overhead_cpu_s'] * 1e3:.3f} ms", flush=True)
        print(f"marginal {key} (steps {lo['steps']} -> {hi['steps']}): training {train:.2f} ms a step; calibration "
              f"CPU {cal_cpu * 1e3:.2f} ms a pass (cal1)", flush=True)
        for h, r in enumerate(rows):
            print(f"   host {h}: sustained {r['cores_sustained'] or 0:.3f} cores; CPU {r['host_cpu_ms']:.2f} ms a step (main thread {r['main_cpu_ms']:.2f}, other threads "
                  f"{r['other_cpu_ms']:.2f}); main thread runnable-waiting {r['main_wait_ms']:.2f} ms; throttled "
                  f"{r['throttled_ms']:.2f} ms", flush=True)
    out["marginal"] = res


def main():
    ap = predict_lib.probe_args(__doc__, "cprobe", full_doc=True)
    ap.add_argument("--steps", type=int, default=234, help="steps per job (a job given as KEY:STEPS runs STEPS)")
    ap.add_argument("--jobs", default="solo,compute4,localsgd,easgd,ddp")
    ap.add_argument("--calib-iters", type=int, default=40)
    ap.add_argument("--cpu-period-us", type=int, default=0, help="the hosts' CFS period (0: the tool's default)")
    ap.add_argument("--calib-iters-long", type=int, default=0,
                    help="also calibrate host 0 alone with this many iterations: the loop's sustained cores")
    ap.add_argument("--keep-traces", metavar="DIR", help="copy each job's Chrome trace here")
    a = ap.parse_args()
    if not predict_lib.is_root("compute_probe", "namespaces, cgroups"):
        return 77
    tandem = predict_lib.find_tandem(a.tandem)
    keys = [k for k in a.jobs.split(",") if k]
    bad = [k for k in keys if k.partition(":")[0] not in JOBS]
    if bad:
        print(f"compute_probe: unknown job(s) {bad}; known: {', '.join(JOBS)}", file=sys.stderr)
        return 2
    out = dict(predict_lib.probe_results(a), tandem=tandem, phases={},
               started_utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
    with predict_lib.emu_cluster(a.name, 4, up_args=["--cpu-period-us", str(a.cpu_period_us)] if a.cpu_period_us
                                 else []) as st:
        addr0 = st["hosts"][0]["addr"]
        cfg = st["config"]
        out["cluster_config"] = cfg
        quota = float(cfg["cpu_quota"])
        tasks = host_task_files(a.name)
        print(f"# {out['started_utc']} UTC, load {out['load_start'][0]:.1f}; cluster {a.name}: 4 x t2.micro, "
              f"{cfg['bw_mbit']} Mbit/s, {quota} core, period {cfg.get('cpu_period_us')} us", flush=True)
        with tempfile.TemporaryDirectory(prefix="tandem_cprobe_") as tmp:
            os.chmod(tmp, 0o777)
            cal = {}
            cals = [("cal1", 1, a.calib_iters), ("cal4", 4, 8)]
            if a.calib_iters_long:  # cal1 again, longer: the calibration loop's own sustained share of a core
                cals.append(("cal1long", 1, a.calib_iters_long))
            for key, n, iters in cals:
                prof = os.path.join(tmp, f"{key}.json")
                with Phase(a.name, tasks) as ph:
                    c = predict_lib.calibrate(tandem, a.name, addr0, n, ["--model", "lenet5", "--dataset",
                                              "synthetic"], 32, prof, iters=iters)
                with open(prof) as f:
                    cal[key] = json.load(f)
                passes = (iters + 2) * n  # warmup 2; each iteration times layer-wise passes AND a whole step
                rec = {"summary": c, "profile": cal[key], "wall_s": ph.wall, "hosts": ph.hosts[:n],
                       "machine": ph.machine, "threads": ph.threads[:n]}
                out["phases"][key] = rec
                cpu_pass = c["step_mean_s"] * quota
                print(f"{key}: step_mean {c['step_mean_s'] * 1e3:.2f} ms at the quota (CPU {cpu_pass * 1e3:.2f} ms a "
                      f"pass), median {c['step_median_s'] * 1e3:.2f}, compute_cv {cal[key].get('compute_cv', 0):.3f}; "
                      f"throttled {[h['nr_throttled'] for h in ph.hosts[:n]]}/{[h['nr_periods'] for h in ph.hosts[:n]]}"
                      f" periods; machine: hosts {ph.machine['hosts']:.2f} outside {ph.machine['outside']:.2f} irq "
                      f"{ph.machine['irq']:.2f} steal {ph.machine['steal']:.2f} cores", flush=True)
            if a.calib_iters_long:
                lo, hi = out["phases"]["cal1"], out["phases"]["cal1long"]
                dc, dw = hi["hosts"][0]["cpu_s"] - lo["hosts"][0]["cpu_s"], hi["wall_s"] - lo["wall_s"]
                out["calibration_share"] = {"cpu_s": dc, "wall_s": dw, "cores": dc / dw}
                print(f"calibration loop ({a.calib_iters} -> {a.calib_iters_long} iterations, host 0 alone): "
                      f"{dc:.3f} CPU s over {dw:.3f} s = {dc / dw:.3f} cores sustained under the {quota} quota", flush=True)
            cal_cpu = cal["cal1"]
            full = sum(l["forward_s"] + l["backward_s"] for l in cal_cpu["layers"]) + cal_cpu["optimizer_step_s"]
            cluster = json.loads(predict_lib.cluster_description(st, hosts=4))
            for node in cluster["nodes"]:
                node.update(vcpus=1, cpu_quota=quota, cpu_period_us=int(cfg.get("cpu_period_us") or 5000))
            cl = os.path.join(tmp, "cluster.json")
            with open(cl, "w") as f:
                json.dump(cluster, f)
            for spec in keys:
                key, _, steps = spec.partition(":")
                steps = int(steps) if steps else a.steps
                n, flags = JOBS[key]
                trace = os.path.join(tmp, f"{key}_{steps}_trace.json")
                cmd = [tandem, "train"] + DATA + flags + ["--epochs", "1", "--limit-batches", str(steps),
                                                          "--eval-limit-batches", "1", "--trace", trace, "--json"]
                if n > 1:
                    cmd += ["--predict", "--predict-cluster", cl, "--profile", os.path.join(tmp, "cal4.json"),
                            "--profile-network"]
                    cmd = predict_lib.launch_cmd(tandem, a.name, addr0, n, cmd)
                else:
                    cmd = [predict_lib.TOOL, "exec", "--name", a.name, "0", "--"] + cmd
                with Phase(a.name, tasks) as ph:
                    rc, text = run(cmd, 600)
                lines = [l.split("] ", 1)[1] if l.startswith("[rank ") else l for l in text.splitlines()
                         if l.startswith("[rank 0]") or (n == 1 and l.startswith("{"))]
                epochs = predict_lib.json_lines(lines, "epoch")
                pred = predict_lib.json_lines(lines, "prediction")
                rec = {"rc": rc, "ranks": n, "wall_s": ph.wall, "hosts": ph.hosts[:n], "machine": ph.machine,
                       "threads": ph.threads[:n],
                       "epoch": epochs[-1] if epochs else None, "prediction": pred[-1]["prediction"] if pred else None,
                       "tail": text[-2000:] if rc != 0 else ""}
                rec["steps"] = steps
                if a.keep_traces and os.path.exists(trace):
                    os.makedirs(a.keep_traces, exist_ok=True)
                    shutil.copy(trace, a.keep_traces)
                rec["trace"] = trace_split(trace, n) if rc == 0 and os.path.exists(trace) else None
                out["phases"][spec] = rec
                if rc != 0 or not epochs:
                    print(f"{key}: FAILED rc {rc}\n{text[-1500:]}", flush=True)
                    continue
                ts = epochs[-1]["time_split"]
                step = ts["step_s"]
                print(f"{spec} ({n} rank(s), {steps} steps): step {step * 1e3:.2f} ms (compute {ts['compute_s'] * 1e3:.2f}"
                      f", data {ts['data_s'] * 1e3:.2f}, exchange {ts['exposed_comm_s'] * 1e3:.2f}, other "
                      f"{ts['other_s'] * 1e3:.2f}); machine: hosts {ph.machine['hosts']:.2f} outside "
                      f"{ph.machine['outside']:.2f} irq {ph.machine['irq']:.2f} steal {ph.machine['steal']:.2f} cores",
                      flush=True)
                for r in range(n):
                    t = rec["trace"][r] if rec["trace"] else {}
                    fb = sum(t.get(k, [0, 0])[0] for k in ("forward", "backward", "optimizer")) / steps
                    h = ph.hosts[r]
                    print(f"   rank {r}: fwd+bwd+opt {fb * 1e3:.2f} ms wall/step; host CPU {h['cpu_s'] / steps * 1e3:.2f}"
                          f" ms/step (whole phase incl. start-up and eval); throttled {h['nr_throttled']}/"
                          f"{h['nr_periods']} periods, {h['throttled_s']:.2f} s; spans "
                          + ", ".join(f"{k} {v[0] / max(v[1], 1) * 1e3:.2f} ms x{v[1]}" for k, v in sorted(t.items())),
                          flush=True)
                    print("      threads (tid: CPU s, runnable-waiting s, slices): " + "; ".join(
                        f"{x['tid']}: {x['cpu_s']:.3f}, {x['wait_s']:.3f}, {x['slices']}" for x in ph.threads[r]
                        if x["cpu_s"] > 0.005), flush=True)
                print(f"   calibration (cal1): CPU {full * quota * 1e3:.2f} ms a pass -> {full * 1e3:.2f} ms at the "
                      f"quota; cal4: {out['phases']['cal4']['summary']['step_mean_s'] * 1e3:.2f} ms at the quota", flush=True)
                if rec["prediction"]:
                    p = rec["prediction"]
                    print(f"   predicted (cal4 profile) {p['predicted_step_s'] * 1e3:.2f} ms, measured "
                          f"{p['measured_step_s'] * 1e3:.2f} ms ({p['step_error'] * 100:+.1f}%); compute "
                          f"{(p.get('predicted_compute_s') or 0) * 1e3:.2f} / {(p.get('measured_compute_s') or 0) * 1e3:.2f} ms",
                          flush=True)
            marginal(out, quota)
    predict_lib.write_probe_results(out, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
