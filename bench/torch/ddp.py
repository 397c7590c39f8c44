"""A plain PyTorch DDP training script; only the backend name differs between runs.

    tandem launch -n 2 -- /usr/bin/python3 bench/torch/ddp.py --backend tandem --model lenet5 --steps 20
    tandem launch -n 2 -- /usr/bin/python3 bench/torch/ddp.py --backend gloo   --model lenet5 --steps 20

Rank, world and rendezvous come from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which
`tandem launch` exports. Data are synthetic (seeded per rank), so runs on the two backends see the same batches.
Each rank prints one JSON line: its losses (float.hex, to compare bit for bit), a checksum of the final parameters,
and the measured throughput (images/s over all ranks, after --warmup steps).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 5, padding=2)
        self.c2 = nn.Conv2d(6, 16, 5)
        self.f1 = nn.Linear(16 * 5 * 5, 120)
        self.f2 = nn.Linear(120, 84)
        self.f3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = torch.flatten(x, 1)
        return self.f3(F.relu(self.f2(F.relu(self.f1(x)))))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.short(x))


class ResNet18(nn.Module):
    """ResNet-18 with the CIFAR stem (3x3 conv, no max-pool), as in Tandem's zoo."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS = {"lenet5": (LeNet5, (1, 28, 28)), "resnet18": (ResNet18, (3, 32, 32))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--model", choices=sorted(MODELS), default="lenet5")
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.backend == "tandem":
        try:
            import tandem.torch  # noqa: F401  registers the backend
        except ModuleNotFoundError as e:
            if e.name != "tandem":
                raise
            # Not installed (run from a checkout, as the README does): this repository's own package, which finds
            # the build's library itself.
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "bindings",
                                            "python"))
            import tandem.torch  # noqa: F401
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    make, shape = MODELS[a.model]
    torch.manual_seed(a.seed)
    model = DDP(make())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1000 * a.seed + rank)
    batches = [(torch.randn((a.batch,) + shape, generator=g), torch.randint(0, 10, (a.batch,), generator=g))
               for _ in range(4)]
    losses = []
    t0 = time.perf_counter()
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        x, y = batches[step % len(batches)]
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    dist.barrier()
    seconds = time.perf_counter() - t0
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    print(json.dumps({"backend": a.backend, "model": a.model, "world": world, "torch": torch.__version__,
                      "losses": [float(l).hex() for l in losses], "param_checksum": checksum.hex(),
                      "images_per_s": world * a.batch * a.steps / seconds, "step_ms": 1e3 * seconds / a.steps}),
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
