"""Where a collective's time goes on the "tandem" torch.distributed backend, against raw Tandem and gloo.

    tandem launch -n 4 -- /usr/bin/python3 bench/torch/overhead.py [--sizes 1024,262144,11200000] [--iters 20]

For each float32 size, every rank times (after a barrier) the mean of --iters calls of:
  raw     tandem.Communicator.allreduce on the tensor's memory (ctypes; no torch, no worker thread)
  tandem  dist.all_reduce on the "tandem" group (what DDP pays: worker thread, future; tandem.torch.IMPL says which
          implementation, TANDEM_TORCH_IMPL picks it)
  gloo    dist.all_reduce on a gloo group over the same ranks
tandem - raw is the Python backend's own cost per call. Rank 0 prints one JSON line per size.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist

import tandem.torch


def timed(fn, iters):
    fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,262144,11200000", help="float32 elements (11.2M: ResNet-18's gradient)")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("tandem")
    pg = dist.distributed_c10d._get_default_group()
    comm = getattr(pg, "_comm", None)  # the Python backend's communicator
    if comm is None and tandem.torch._CPP_GROUPS:
        comm = tandem.torch._CPP_GROUPS[0][1]  # the C++ backend's (its worker is idle between our waits)
    gloo = dist.new_group(backend="gloo")
    for count in (int(s) for s in a.sizes.split(",")):
        x = torch.ones(count)
        arr = x.numpy()
        row = {"elements": count, "bytes": 4 * count, "world": dist.get_world_size(), "torch": torch.__version__,
               "impl": tandem.torch.IMPL}
        iters = max(3, min(a.iters, int(a.iters * 262144 / max(count, 1)) or 3))
        if comm is not None:
            row["raw_ms"] = 1e3 * timed(lambda: comm.allreduce(arr), iters)
        row["tandem_ms"] = 1e3 * timed(lambda: dist.all_reduce(x), iters)
        row["gloo_ms"] = 1e3 * timed(lambda: dist.all_reduce(x, group=gloo), iters)
        if dist.get_rank() == 0:
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
