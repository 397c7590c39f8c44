#!/usr/bin/python3
"""PyTorch jobs for bench/emu/validate_bench.py (issue #16), run with Debian's interpreter (/usr/bin/python3,
python3-torch 1.13) on an emulated host. Two modes, the same model (a zoo twin from bench/train/torch_models.py),
the same synthetic 1x28x28 samples and SGD with momentum, one thread:

  profile  one process, DDP over a one-rank gloo group (the job as its user runs it, on one host): times forward + loss, backward and the optimizer step at --batch, --iters passes
           back to back after --warmup, and writes a calibration profile in the simulator's documented format
           (simulator/compute/profile.hpp, "tandem-calibration" version 1) that `tandem simulate --profile` reads:
             - the layer names and their order are the Tandem zoo model's (taken from --tandem-profile, a
               `tandem calibrate` profile of the same model on the same host); PyTorch's forward total is split
               over them by the Tandem profile's forward shares, its backward total by the backward shares (the
               per-layer split only decides when a DDP bucket's gradients are ready; the totals are PyTorch's);
             - the times are trimmed means (middle 80%) over the passes (wall clock), as `tandem calibrate` scales its layers to; the
               host's CFS quota goes in "cpu_quota" and the thread count in "threads", so the simulator takes the
               quota's average out (simulator: full_speed_profile) and applies the target node's own quota;
             - the process CPU time per pass is recorded in "machine" as a cross-check of that full-speed figure.
  ddp      one rank of a DistributedDataParallel job on gloo (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the
           environment; PyTorch's defaults: 25 MiB buckets with a 1 MiB first bucket, buffers broadcast every
           step): --warmup steps, a barrier, --steps timed steps, a barrier; rank 0 prints one JSON line with the
           mean step time.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
import torch_models  # noqa: E402


def build(model, width):
    if model == "mobilenetv2":
        return torch_models.mobilenetv2(1, 28, 28, 10, width)
    return getattr(torch_models, model)(1, 28, 28, 10)


def trimmed_mean(v):
    """The mean of the middle 80% (all of them below 10 values), as `tandem calibrate` takes its step: a quota's
    throttling stays in, a few passes preempted on a shared machine do not."""
    v = sorted(v)
    cut = len(v) // 10 if len(v) >= 10 else 0
    v = v[cut:len(v) - cut]
    return sum(v) / len(v)


def profile(a, net, opt, x, y):
    # The job as the user runs it, on one rank: DistributedDataParallel over a one-rank gloo group, so the
    # profile's backward holds DDP's gradient hooks, bucket copies and its (one-rank) all-reduce calls.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 500))
    dist.init_process_group("gloo", rank=0, world_size=1)
    net = torch.nn.parallel.DistributedDataParallel(net)
    fwd, bwd, step, cpu = [], [], [], []
    for i in range(a.warmup + a.iters):
        c0 = time.process_time()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i >= a.warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            step.append(t3 - t2)
            cpu.append(time.process_time() - c0)
    f, b, o, c = trimmed_mean(fwd), trimmed_mean(bwd), trimmed_mean(step), trimmed_mean(cpu)
    with open(a.tandem_profile) as fh:
        tp = json.load(fh)
    tf = sum(l["forward_s"] for l in tp["layers"]) or 1.0
    tb = sum(l["backward_s"] for l in tp["layers"]) or 1.0
    layers = [{"name": l["name"], "forward_s": f * l["forward_s"] / tf, "backward_s": b * l["backward_s"] / tb}
              for l in tp["layers"]]
    prof = {"format": "tandem-calibration", "version": 1, "backend": "cpu", "model": tp["model"],
            "input": tp.get("input", [1, 28, 28]), "batch": a.batch, "optimizer": "momentum",
            "optimizer_step_s": o, "layers": layers, "threads": a.threads,
            "machine": (f"PyTorch {torch.__version__}, {a.threads} thread(s), {os.environ.get('TANDEM_EMU_HOST', '')} "
                        f"{a.model} width {a.width_mult}: forward {f * 1e3:.3f} backward {b * 1e3:.3f} step "
                        f"{o * 1e3:.3f} ms wall (means of {a.iters}), process CPU {c * 1e3:.3f} ms per pass; "
                        f"DDP on a one-rank gloo group; layer split by the Tandem profile's shares")}
    if a.cpu_quota:
        prof["cpu_quota"] = a.cpu_quota
    # The passes' variability, as `tandem calibrate` records it (api/src/calibrate.cpp): of their process CPU time
    # under a quota (the simulator applies the quota's windows itself), else of their wall time. A DDP step waits
    # for its slowest rank; without it the simulator predicts PyTorch ranks that never drift apart.
    v = cpu if a.cpu_quota else [x + y + z for x, y, z in zip(fwd, bwd, step)]
    mean = sum(v) / len(v)
    if len(v) > 1 and mean > 0:
        prof["compute_cv"] = (sum((x - mean) ** 2 for x in v) / len(v)) ** 0.5 / mean
    if "memory_bytes_per_s" in tp:
        prof["memory_bytes_per_s"] = tp["memory_bytes_per_s"]
    with open(a.out, "w") as fh:
        json.dump(prof, fh, indent=1)
    print(json.dumps({"profile": a.out, "forward_s": f, "backward_s": b, "optimizer_step_s": o, "cpu_s": c,
                      "wall_s": f + b + o, "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


def ddp(a, net, opt, x, y):
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    net = torch.nn.parallel.DistributedDataParallel(net)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dist.barrier()
    el = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"peer": "pytorch-ddp-gloo", "torch": torch.__version__, "world": world,
                          "batch_per_rank": a.batch, "steps": a.steps, "step_s": el / a.steps}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("profile", "ddp"))
    ap.add_argument("--model", default="lenet5", choices=("lenet5", "mobilenetv2"))
    ap.add_argument("--width-mult", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30, help="profile: timed passes")
    ap.add_argument("--steps", type=int, default=30, help="ddp: timed steps")
    ap.add_argument("--tandem-profile", help="profile: `tandem calibrate`'s profile of the same model (layer names)")
    ap.add_argument("--cpu-quota", type=float, help="profile: this host's CFS quota in cores")
    ap.add_argument("--out", help="profile: where to write it")
    a = ap.parse_args()
    if a.mode == "profile" and not (a.tandem_profile and a.out):
        ap.error("profile needs --tandem-profile and --out")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    net = build(a.model, a.width_mult)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 1, 28, 28)
    y = torch.randint(0, 10, (a.batch,))
    (profile if a.mode == "profile" else ddp)(a, net, opt, x, y)


if __name__ == "__main__":
    main()
