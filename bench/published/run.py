#!/usr/bin/env python3
"""Predict published GPU-cluster data-parallel results with `tandem simulate` and print the error per point.

Only what a user knows before renting the machines goes in: the GPU's data sheet (or, where the paper gives one,
its single-device rate), the node's GPUs per server and intra-node link, the NIC's rate and kind (RDMA / TCP),
the model and the per-GPU batch. Nothing is fitted to the scaling figures being predicted. See README.md for the
sources of every figure and the assumptions where a paper is silent.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

# GPU data sheets (f32 peak, memory bandwidth, memory).
P100_SXM2 = {"peak_tflops": 10.6, "mem_gbps": 732 * 8, "gpu_memory_gib": 16}
P100_PCIE = {"peak_tflops": 9.3, "mem_gbps": 732 * 8, "gpu_memory_gib": 16}

IMAGENET_TRAIN = 1281167

# Single-GPU training rates TensorFlow published for tf_cnn_benchmarks (the Horovod benchmark's own script) on a
# DGX-1's Tesla P100 (SXM2), batch 64 per GPU, synthetic data, May 2017: tensorflow/docs
# site/en/r1/guide/performance/benchmarks.md ("Details for NVIDIA DGX-1 (NVIDIA Tesla P100)"), formerly
# tensorflow.org/performance/benchmarks. ResNet-101 is not in that table: ResNet-152's rate scaled by the two
# networks' multiply-adds (He et al. 2016, Table 1: 11.3 and 7.6 billion).
TF_P100_SXM2_IMG_S = {"inception_v3": 142.0, "vgg16_imagenet": 154.0, "resnet101": 91.8 * 11.3 / 7.6}
# The Horovod servers are taken as P100 PCIe (4 per server): the SXM2 rate scaled by the data sheets' f32 peaks
# (9.3 / 10.6 TFLOP/s, the boost clocks' ratio; both have the same 732 GB/s memory).
PCIE_OVER_SXM2 = P100_PCIE["peak_tflops"] / P100_SXM2["peak_tflops"]
# Horovod's background loop: tensors are negotiated and all-reduced in cycles, every HOROVOD_CYCLE_TIME, 5 ms by
# default (horovod/common/operations.cc, SetCycleTimeMs(5)).
HOROVOD_CYCLE_MS = 5.0
# Horovod's all-reduce of the benchmark's time (2017): NCCL 2's allreduce over every GPU of the job, i.e. one ring
# through all of them (NCCL before 2.4 has rings only); its hierarchical all-reduce is opt-in
# (HOROVOD_HIERARCHICAL_ALLREDUCE=1, added later). So the ring, not the runtime's own rule (auto: hierarchical).
HOROVOD_ALGO = "ring"
# NCCL's own cost model of its ring (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel, the 2.7-era table read
# here; NCCL 2.0's is not published): an all-reduce of nRanks over nNodes costs, besides bytes / bandwidth,
# (2(nRanks-1) - 2(nNodes-1)) intra-node steps at hwLat[PCI][Ring][Simple] = 5.7 us and 2(nNodes-1) network steps at
# hwLat[NET][Ring][Simple] = 9.6 us, the sum times 1.9 for a multi-node ring all-reduce of at least nRanks/16 x 64 KiB
# ("plateau effect of ring", ncclTopoGetAlgoTime; every bucket here is far above it). The simulator's ring pays one
# link latency per step, so the per-step figures go in as the links' latencies. (The 8.4 us base per all-reduce is
# left out: ~20 all-reduces a step make it 0.2 ms.)
NCCL_RING_PLATEAU = 1.9
NCCL_PCI_STEP_US = 5.7 * NCCL_RING_PLATEAU
NCCL_NET_STEP_US = 9.6 * NCCL_RING_PLATEAU

# Each case: a published scaling point (efficiency of N GPUs against `base_gpus` GPUs, linear scaling = 1).
CASES = [
    {
        "source": "Goyal et al. 2017 (arXiv 1706.02677)",
        "what": "ResNet-50, batch 32/GPU, 8x P100 SXM2 (NVLink) per server, 50 Gbit/s Ethernet",
        "model": "resnet50", "batch": 32, "gpus_per_node": 8, "gpu": P100_SXM2,
        "intra_gbps": 8 * 40, "nic_gbps": 50, "protocol": "tcp",
        # the paper: 90 epochs take 29 h on 8 GPUs; the per-GPU rate assumes linear scaling inside the server
        "epoch_time_s": 29 * 3600 / 90 * 8,
        # Caffe2's Gloo all-reduce for GPUs (caffe2/contrib/gloo AllreduceOp: gloo::CudaAllreduceHalvingDoubling, its
        # default host workspace) reduces the server's GPUs, copies the result to host memory, all-reduces it there
        # and copies it back, one stage after the other: each bucket crosses PCIe 3.0 x16 down and up, taken at
        # 12 GB/s as the Horovod servers' PCIe below (the data sheet's 15.75 GB/s less the protocol's overhead).
        # Within one server (the 8-GPU base) Caffe2's data_parallel_model all-reduces on the GPUs: no Gloo, no staging.
        "host_staging_gbps": 8 * 12,
        "base_gpus": 8, "points": [(256, 0.90)],
    },
    {
        "source": "Sergeev & Del Balso 2018 (Horovod, 128-GPU benchmark)",
        "what": "Inception V3, batch 64/GPU, 4x Pascal per server, 25 Gbit/s RoCE",
        "model": "inception_v3", "input": "3x299x299", "batch": 64, "gpus_per_node": 4, "gpu": P100_PCIE,
        "intra_gbps": 8 * 12, "nic_gbps": 25, "protocol": "rdma",
        "epoch_time_s": IMAGENET_TRAIN / (TF_P100_SXM2_IMG_S["inception_v3"] * PCIE_OVER_SXM2),
        "comm_cycle_ms": HOROVOD_CYCLE_MS, "algo": HOROVOD_ALGO,
        "intra_latency_us": NCCL_PCI_STEP_US, "nic_latency_us": NCCL_NET_STEP_US,
        "base_gpus": 1, "points": [(128, 0.90), (512, 0.90)],
    },
    {
        "source": "Sergeev & Del Balso 2018 (Horovod)",
        "what": "ResNet-101, batch 64/GPU, 4x Pascal per server, 25 Gbit/s RoCE",
        "model": "resnet101", "batch": 64, "gpus_per_node": 4, "gpu": P100_PCIE,
        "intra_gbps": 8 * 12, "nic_gbps": 25, "protocol": "rdma",
        "epoch_time_s": IMAGENET_TRAIN / (TF_P100_SXM2_IMG_S["resnet101"] * PCIE_OVER_SXM2),
        "comm_cycle_ms": HOROVOD_CYCLE_MS, "algo": HOROVOD_ALGO,
        "intra_latency_us": NCCL_PCI_STEP_US, "nic_latency_us": NCCL_NET_STEP_US,
        "base_gpus": 1, "points": [(128, 0.90), (512, 0.90)],
    },
    {
        "source": "Sergeev & Del Balso 2018 (Horovod)",
        "what": "VGG-16, batch 64/GPU, 4x Pascal per server, 25 Gbit/s RoCE",
        "model": "vgg16_imagenet", "batch": 64, "gpus_per_node": 4, "gpu": P100_PCIE,
        "intra_gbps": 8 * 12, "nic_gbps": 25, "protocol": "rdma",
        "epoch_time_s": IMAGENET_TRAIN / (TF_P100_SXM2_IMG_S["vgg16_imagenet"] * PCIE_OVER_SXM2),
        "comm_cycle_ms": HOROVOD_CYCLE_MS, "algo": HOROVOD_ALGO,
        "intra_latency_us": NCCL_PCI_STEP_US, "nic_latency_us": NCCL_NET_STEP_US,
        "base_gpus": 1, "points": [(128, 0.79), (512, 0.68)],
    },
]


def horovod_negotiation_ms(lat_us, per_msg_us):
    """Horovod's coordination per cycle before its response cache (2017: horovod/tensorflow/mpi_ops.cc): rank 0
    MPI_Gathers the lengths of the ranks' ready lists, MPI_Gathervs the lists and MPI_Bcasts the plan's length and
    the plan. With binomial trees for the gather and the broadcasts (Open MPI's small-message choices) and a linear
    gatherv, N ranks take (3 ceil(log2 N) + 1) one-way latencies `lat_us` plus N - 1 receives of `per_msg_us` at
    rank 0. Neither figure is published for the benchmark's cluster (MPI over TCP, `-mca btl ^openib`): a what-if."""
    return lambda n: ((3 * math.ceil(math.log2(n)) + 1) * lat_us + (n - 1) * per_msg_us) / 1000


def cluster_file(case, nodes, tmp):
    node = {"name": case["model"] + "-node", "count": nodes, "vcpus": 32, "gpus": case["gpus_per_node"],
            "memory_gib": 256, "efficiency": 0.5, "nic_gbps": case["nic_gbps"], "nic_latency_us": case.get("nic_latency_us", 5),
            "intra_gbps": case["intra_gbps"], "intra_latency_us": case.get("intra_latency_us", 5), "protocol": case["protocol"]}
    node.update(case["gpu"])
    path = os.path.join(tmp, f"{case['model']}-{nodes}.json")
    with open(path, "w") as f:
        json.dump({"nodes": [node], "topology": {"kind": "star"}}, f)
    return path


def simulate(tandem, case, gpus, tmp):
    per = case["gpus_per_node"]
    nodes = max(1, gpus // per)
    cmd = [tandem, "simulate", "--cluster", cluster_file(case, nodes, tmp), "--model", case["model"],
           "--dataset", "imagenet", "--batch", str(case["batch"]), "--strategy", "ddp", "--dp", str(gpus), "--json"]
    if "input" in case:  # ImageNet at another crop size (Inception's 299x299): the data set described by hand
        cmd[cmd.index("--dataset") + 1] = ""
        cmd += ["--samples", str(IMAGENET_TRAIN), "--classes", "1000", "--input", case["input"]]
    if "epoch_time_s" in case:
        cmd += ["--epoch-time-s", f"{case['epoch_time_s']:.3f}"]
    if "algo" in case:
        cmd += ["--algo", case["algo"]]
    spec = {}  # the framework's collective loop and data path (job JSON keys)
    if "comm_cycle_ms" in case:
        spec["comm_cycle_ms"] = case["comm_cycle_ms"]
        if "negotiation_ms" in case and gpus > 1:
            spec["comm_negotiation_ms"] = case["negotiation_ms"](gpus)
    if case.get("host_staging_gbps") and gpus > case["gpus_per_node"]:  # one server: NCCL alone, no Gloo
        spec["host_staging_gbps"] = case["host_staging_gbps"]
    if spec:
        job = os.path.join(tmp, f"{case['model']}-{gpus}-job.json")
        with open(job, "w") as f:
            json.dump(spec, f)
        cmd += ["--job", job]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out), cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tandem", default="build/default/bin/tandem")
    ap.add_argument("--json", help="write every point here")
    ap.add_argument("--only", help="comma-separated models")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="what-if: override a case input for every case run (e.g. nic_latency_us=5)")
    ap.add_argument("--negotiation", metavar="LAT_US,PER_MSG_US",
                    help="what-if: Horovod's per-cycle coordination (horovod_negotiation_ms) on the cycled cases")
    args = ap.parse_args()
    for case in CASES:
        for kv in args.set:
            key, _, value = kv.partition("=")
            if key not in case and key not in ("intra_latency_us", "nic_latency_us", "host_staging_gbps"):
                sys.exit(f"--set {kv}: the case {case['model']} has no input {key!r}")
            case[key] = json.loads(value)
        if args.negotiation and "comm_cycle_ms" in case:
            lat, per = (float(x) for x in args.negotiation.split(","))
            case["negotiation_ms"] = horovod_negotiation_ms(lat, per)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            if args.only and case["model"] not in args.only.split(","):
                continue
            base, _ = simulate(args.tandem, case, case["base_gpus"], tmp)
            for gpus, published in case["points"]:
                d, cmd = simulate(args.tandem, case, gpus, tmp)
                eff = d["images_per_sec"] / base["images_per_sec"] * case["base_gpus"] / gpus
                rows.append({"source": case["source"], "what": case["what"], "gpus": gpus,
                             "base_gpus": case["base_gpus"], "published": published, "predicted": eff,
                             "error_points": 100 * (eff - published), "step_s": d["step_time_s"],
                             "base_step_s": base["step_time_s"], "exposed_comm_s": d["comm_exposed_s"],
                             "allreduce": d["allreduce"], "sim_wall_s": d["sim_wall_s"],
                             "per_gpu_img_s_base": base["images_per_sec"] / case["base_gpus"],
                             "command": " ".join(cmd[1:])})
                r = rows[-1]
                print(f"{case['model']:>14} {gpus:>4} GPUs vs {case['base_gpus']}: published {published:.0%} "
                      f"predicted {eff:.1%} ({r['error_points']:+.1f} points); step {d['step_time_s'] * 1e3:.1f} ms "
                      f"(base {base['step_time_s'] * 1e3:.1f} ms), simulated in {d['sim_wall_s']:.1f} s",
                      flush=True)
    errs = sorted(abs(r["error_points"]) for r in rows)
    if errs:
        print(f"{len(errs)} points: median |error| {errs[len(errs) // 2]:.1f} points, max {errs[-1]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
