#!/usr/bin/python3
"""Accuracy: LeNet-5 on Fashion-MNIST, SGD lr 0.01 momentum 0.9, batch 64 -- Tandem vs PyTorch, same recipe, same
run. Prints test accuracy after each epoch for both and the difference (target: Tandem >= PyTorch - 0.5 points after
epochs 1, 2 and 5).

Usage: /usr/bin/python3 bench/train/bench_accuracy.py [--tandem build/x/bin/tandem] [--epochs 5] [--threads 1]
                                                      [--seed 0] [--json]
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_train import find_tandem, cpu_busy_fraction  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # the normalisation Tandem applies to 1-channel data (engine/data/augment.cpp)


def load(split):
    import numpy as np
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(DATA, prefix + "-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read()[16:], dtype=np.uint8).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(DATA, prefix + "-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read()[8:], dtype=np.uint8)
    return ((x.astype(np.float32) / 255.0 - MEAN) / STD), y.astype(np.int64)


def torch_curve(epochs, threads, seed):
    import torch
    import torch_models
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    xtr, ytr = (torch.from_numpy(a) for a in load("train"))
    xte, yte = (torch.from_numpy(a) for a in load("test"))
    model, _ = torch_models.build("lenet5")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    out = []
    for epoch in range(1, epochs + 1):
        model.train()
        t0 = time.perf_counter()
        perm = torch.randperm(len(ytr))
        for i in range(0, len(perm), 64):
            idx = perm[i:i + 64]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
        train_s = time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum()) for i in range(0, 10000, 1000))
        out.append({"epoch": epoch, "test_accuracy": correct / 10000.0, "images_per_sec": len(perm) / train_s})
    return out


def tandem_curve(tandem, epochs, threads, seed):
    cmd = [tandem, "train", "--model", "lenet5", "--dataset", "fashion-mnist", "--epochs", str(epochs), "--batch", "64",
           "--lr", "0.01", "--momentum", "0.9", "--optimizer", "sgd", "--threads", str(threads), "--seed", str(seed),
           "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads))).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default="")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    busy = cpu_busy_fraction(1.0)
    t = tandem_curve(find_tandem(args.tandem), args.epochs, args.threads, args.seed)
    p = torch_curve(args.epochs, args.threads, args.seed)
    rows = [{"epoch": a["epoch"], "tandem_test_accuracy": a["test_accuracy"], "torch_test_accuracy": b["test_accuracy"],
             "difference_points": 100 * (a["test_accuracy"] - b["test_accuracy"]),
             "tandem_images_per_sec": a["images_per_sec"], "torch_images_per_sec": b["images_per_sec"]}
            for a, b in zip(t, p)]
    ok = all(r["difference_points"] >= -0.5 for r in rows if r["epoch"] in (1, 2, 5))
    if args.json:
        print(json.dumps({"cpu_busy_before": busy, "within_half_point": ok, "epochs": rows}, indent=1))
        return
    print("CPU busy before the runs: %.0f%%" % (100 * busy))
    print("%5s %12s %12s %8s %14s %14s" % ("epoch", "tandem acc", "torch acc", "diff", "tandem img/s", "torch img/s"))
    for r in rows:
        print("%5d %11.2f%% %11.2f%% %+7.2f %14.0f %14.0f" % (r["epoch"], 100 * r["tandem_test_accuracy"],
                                                              100 * r["torch_test_accuracy"], r["difference_points"],
                                                              r["tandem_images_per_sec"], r["torch_images_per_sec"]))
    print("target (Tandem >= PyTorch - 0.5 points at epochs 1, 2, 5): %s" % ("met" if ok else "NOT met"))


if __name__ == "__main__":
    main()
