#!/usr/bin/python3
"""Where a PyTorch DDP (gloo) step's time goes on an emulated host (issue #16, PyTorch MobileNetV2 rows).

  torch_ddp_probe.py [--model mobilenetv2] [--width-mult 0.25] [--batch 32] [--steps 10] [--warmup 5]

Run as one rank per host (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment; WORLD_SIZE=1 is the
one-rank group that torch_job.py `profile` times). Same model, data and optimizer as torch_job.py. Per timed step
it records the wall time of forward + loss, backward (which returns once DDP's all-reduces are done), the optimizer
step, and the process CPU time; around the timed loop, each thread's CPU time (/proc/self/task/*/stat) so that
the main thread's compute can be told apart from gloo's threads. DDP's buckets (count, sizes) are read back from
the reducer's logging data, and every bucket's all-reduce is timed by a comm hook (PyTorch's own allreduce_hook,
wrapped) from its launch to its completion, relative to backward's start. Last, a bare gloo all_reduce of the
same number of bytes as the gradients, timed with its CPU. Every rank prints one JSON line.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_job  # noqa: E402


def thread_cpu():
    """{thread name: CPU seconds} of this process's threads."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                s = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        fields = s[s.rindex(")") + 2:].split()
        key = f"{name}:{tid}" if int(tid) != os.getpid() else "main"
        out[key] = (int(fields[11]) + int(fields[12])) / hz
    return out


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenetv2", choices=("lenet5", "mobilenetv2"))
    ap.add_argument("--width-mult", type=float, default=0.25)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--no-hook", action="store_true", help="DDP's built-in all-reduce (no timing of buckets)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 500))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    net = torch_job.build(a.model, a.width_mult)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 1, 28, 28)
    y = torch.randint(0, 10, (a.batch,))
    net = torch.nn.parallel.DistributedDataParallel(net)
    events = []  # (bucket index, bytes, launch, done) relative to perf_counter
    launch_abs = []  # (wall clock, process CPU) at each bucket's launch: the emulated hosts share one clock

    def hook(state, bucket):
        t = time.perf_counter()
        launch_abs.append((time.time(), time.process_time()))
        fut = default_hooks.allreduce_hook(state, bucket)
        n = bucket.buffer().numel() * bucket.buffer().element_size()
        idx = bucket.index()

        def done(f):
            events.append((idx, n, t, time.perf_counter()))
            return f.value()
        return fut.then(done)

    if not a.no_hook:
        net.register_comm_hook(None, hook)
    rows = []
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            dist.barrier()
            cpu0, th0, w0 = time.process_time(), thread_cpu(), time.perf_counter()
        events.clear()
        launch_abs.clear()
        c0 = time.process_time()
        a0 = time.time()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i >= a.warmup:
            rows.append({"fwd": t1 - t0, "bwd": t2 - t1, "opt": t3 - t2, "cpu": time.process_time() - c0,
                         "start_abs": a0, "launch_abs": launch_abs[0][0] if launch_abs else None,
                         "cpu_to_launch": launch_abs[0][1] - c0 if launch_abs else None,
                         "buckets": [(b, n, s - t1, d - t1) for b, n, s, d in sorted(events)]})
    dist.barrier()
    wall = time.perf_counter() - w0
    cpu = time.process_time() - cpu0
    th1 = thread_cpu()
    threads = {k: round((th1[k] - th0.get(k, 0.0)) / a.steps * 1e3, 2) for k in th1 if th1[k] - th0.get(k, 0.0) > 0}
    ld = net._get_ddp_logging_data()
    grad = sum(p.numel() * p.element_size() for p in net.parameters())
    buf = torch.ones(grad // 4)
    for _ in range(2):
        dist.all_reduce(buf)
    ar = []
    for _ in range(5):
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        dist.all_reduce(buf)
        ar.append((time.perf_counter() - t0, time.process_time() - c0))
    out = {"rank": rank, "world": world, "torch": torch.__version__, "steps": a.steps,
           "step_ms": wall / a.steps * 1e3, "cpu_ms_per_step": cpu / a.steps * 1e3,
           "thread_cpu_ms_per_step": threads,
           "median_ms": {k: median([r[k] for r in rows]) * 1e3 for k in ("fwd", "bwd", "opt", "cpu")},
           "buckets_last_step": [[b, n, round(s * 1e3, 2), round(d * 1e3, 2)] for b, n, s, d in rows[-1]["buckets"]],
           "per_step": [[round(r["start_abs"], 6), r["launch_abs"] and round(r["launch_abs"], 6),
                         r["cpu_to_launch"] and round(r["cpu_to_launch"] * 1e3, 2), round(r["fwd"] * 1e3, 2),
                         round(r["bwd"] * 1e3, 2), round(r["cpu"] * 1e3, 2)] for r in rows],
           "grad_bytes": grad, "params": len(list(net.parameters())),
           "ddp_bucket_sizes": ld.get("bucket_sizes"), "ddp_rebuilt_bucket_sizes": ld.get("rebuilt_bucket_sizes"),
           "ddp_bucket_cap_bytes": ld.get("bucket_cap_bytes"),
           "bare_allreduce_ms": median([w for w, _ in ar]) * 1e3, "bare_allreduce_cpu_ms": median([c for _, c in ar]) * 1e3}
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
