"""PyTorch peer for bench_parallel.py: trains lenet5 (or another zoo twin from bench/train/torch_models.py) on
Fashion-MNIST with batch B per rank, 1 thread per rank, for a fixed number of steps -- alone, or as one rank of a
DistributedDataParallel job on gloo (started by bench_parallel.py with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT).
Prints one JSON line on rank 0: global images/s over the timed steps, like Tandem's epoch line.
With --eval-every N (time to accuracy, bench/strategies): trains until the test accuracy, evaluated on rank 0 every
N steps, reaches --target or --max-evals evaluations ran; the JSON line then gives the wall time and steps to the
target (null when not reached), the steps run and the final accuracy.

Run with Debian's interpreter: /usr/bin/python3 (python3-torch)."""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
import torch_models  # noqa: E402


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def normalise(images):
    return torch.from_numpy(((images.astype(np.float32) / 255.0 - 0.2860) / 0.3530)[:, None, :, :].copy())


def time_to_accuracy(args, model, step, rank, world):
    """Trains in chunks of --eval-every steps; after each, rank 0 evaluates on the test set (not timed as training:
    the wall time to the target counts training only, as Tandem's epochs' wall_s) and tells the others whether to
    go on."""
    x_test = y_test = None
    if rank == 0:
        xt = read_idx(os.path.join(args.data_dir, "t10k-images-idx3-ubyte.gz"))
        yt = read_idx(os.path.join(args.data_dir, "t10k-labels-idx1-ubyte.gz"))
        if args.test_limit:
            xt, yt = xt[:args.test_limit], yt[:args.test_limit]
        x_test, y_test = normalise(xt), torch.from_numpy(yt.astype(np.int64))
    if world > 1:
        dist.barrier()
    train_s, steps, acc, reached = 0.0, 0, 0.0, None
    for _ in range(args.max_evals):
        t0 = time.perf_counter()
        for _ in range(args.eval_every):
            step(steps)
            steps += 1
        if world > 1:
            dist.barrier()
        train_s += time.perf_counter() - t0
        go_on = torch.zeros(1)
        if rank == 0:
            model.eval()
            with torch.no_grad():
                correct = sum(int((model(x_test[i:i + 500]).argmax(1) == y_test[i:i + 500]).sum())
                              for i in range(0, len(y_test), 500))
            model.train()
            acc = correct / len(y_test)
            if reached is None and acc >= args.target:
                reached = (train_s, steps)
            go_on[0] = 0.0 if reached else 1.0
        if world > 1:
            dist.broadcast(go_on, 0)
        if go_on[0] == 0.0:
            break
    if rank == 0:
        print(json.dumps({"peer": "pytorch-ddp-gloo" if world > 1 else "pytorch", "torch": torch.__version__,
                          "world": world, "threads": torch.get_num_threads(), "batch_per_rank": args.batch,
                          "lr": args.lr, "target": args.target, "tta_wall_s": reached[0] if reached else None,
                          "tta_steps": reached[1] if reached else None, "steps_run": steps, "train_wall_s": train_s,
                          "final_accuracy": acc, "images_per_sec": world * args.batch * steps / train_s}),
              flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=0, help="time to accuracy: evaluate every N steps")
    ap.add_argument("--max-evals", type=int, default=4)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--test-limit", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    images = read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz"))
    if args.train_limit:
        images, labels = images[:args.train_limit], labels[:args.train_limit]
    x_all = normalise(images)
    y_all = torch.from_numpy(labels.astype(np.int64))
    model = getattr(torch_models, args.model)(1, 28, 28, 10)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)  # bucket_cap_mb 25, like Tandem's default
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Each rank's shard, like a DistributedSampler: every world-th sample of a shuffled permutation.
    perm = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(0))[rank::world]

    def step(i):
        idx = perm[(i * args.batch) % (len(perm) - args.batch):][:args.batch]
        x, y = x_all[idx], y_all[idx]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    if args.eval_every > 0:
        return time_to_accuracy(args, model, step, rank, world)
    for i in range(args.warmup):
        step(i)
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(args.warmup + i)
    if world > 1:
        dist.barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"peer": "pytorch-ddp-gloo" if world > 1 else "pytorch", "torch": torch.__version__,
                          "world": world, "threads": torch.get_num_threads(), "batch_per_rank": args.batch,
                          "steps": args.steps, "images_per_sec": world * args.batch * args.steps / elapsed}),
              flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
