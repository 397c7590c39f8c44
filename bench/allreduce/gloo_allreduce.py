"""The PyTorch gloo peer of `tandem bench allreduce`, with the same method (barrier, timed call,
slowest rank per iteration, median). One process per rank: RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT from the environment (run.py sets them). Prints one JSON object per size from rank 0.
Usage: gloo_allreduce.py ITERS WARMUP BYTES..."""
import json
import sys
import time

import torch
import torch.distributed as dist


def main():
    iters, warmup, sizes = int(sys.argv[1]), int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    for nbytes in sizes:
        count = nbytes // 4
        idx = torch.arange(count, dtype=torch.float32)
        send = torch.remainder(idx, 4) + 2.0 * rank
        buf = send.clone()
        for _ in range(warmup):
            buf.copy_(send)
            dist.all_reduce(buf)
        times = torch.zeros(iters, dtype=torch.float64)
        for it in range(iters):
            buf.copy_(send)  # gloo reduces in place; the copy stays outside the timed region
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            times[it] = (time.perf_counter() - t0) * 1e6
        wrong = torch.tensor([int((buf != torch.remainder(idx, 4) * n + n * (n - 1)).sum())], dtype=torch.int64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        dist.all_reduce(wrong)
        if rank == 0:
            t = float(times.median()) if iters % 2 else float(times.sort().values[iters // 2 - 1:iters // 2 + 1].mean())
            algbw = count * 4 / (t * 1e-6) / 1e9
            print(json.dumps({"bytes": count * 4, "count": count, "world": n, "time_us": t, "algbw_gbps": algbw,
                              "busbw_gbps": algbw * 2 * (n - 1) / n, "wrong": int(wrong[0])}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
