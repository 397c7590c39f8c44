#!/usr/bin/python3
"""Where a training run's oneDNN time goes: sums a ONEDNN_VERBOSE=1 / DNNL_VERBOSE=1 log's exec times.

Prints the total, the time per (primitive, implementation, propagation kind), and per convolution layer its time,
calls and rate (direct-convolution FLOPs / time, so a Winograd layer shows above the machine's FMA peak).
Reads oneDNN 2.x (Tandem, Debian's PyTorch 1.13) and 3.x (PyTorch 2.x: "onednn_verbose,v1,primitive,exec,...") logs.

Usage: python3 bench/train/onednn_verbose_summary.py LOG [--top N]
e.g.   TANDEM_CPU_MAX_ISA=avx2 DNNL_VERBOSE=1 build/default/bin/tandem train --model resnet18 ... > LOG
"""
import argparse
import collections
import re

CONV = re.compile(r"mb(\d+)(?:_g\d+)?_?ic(\d+)oc(\d+)_ih(\d+)oh(\d+)kh(\d+)sh(\d+)\w*?_iw(\d+)ow(\d+)kw(\d+)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    by_prim, calls = collections.Counter(), collections.Counter()
    by_layer, layer_calls, flops = collections.Counter(), collections.Counter(), {}
    with open(args.log, errors="replace") as f:
        for line in f:
            if "verbose" not in line or ",exec," not in line:
                continue
            fields = line.strip().split(",")
            i = fields.index("exec")  # ...,exec,cpu,KIND,IMPL,PROP,...,TIME_MS
            try:
                kind, impl, prop, ms = fields[i + 2], fields[i + 3], fields[i + 4], float(fields[-1])
            except (IndexError, ValueError):
                continue
            by_prim[(kind, impl, prop)] += ms
            calls[(kind, impl, prop)] += 1
            m = CONV.search(line) if kind == "convolution" else None
            if m:
                mb, ic, oc, ih, oh, kh, sh, iw, ow, kw = map(int, m.groups())
                key = (prop, impl, "ic%d oc%d %dx%d->%dx%d k%d s%d" % (ic, oc, ih, iw, oh, ow, kh, sh))
                by_layer[key] += ms
                layer_calls[key] += 1
                flops[key] = 2.0 * mb * ic * oc * oh * ow * kh * kw
    total = sum(by_prim.values())
    print("oneDNN exec time: %.0f ms" % total)
    for k, ms in by_prim.most_common(args.top):
        print("%8.0f ms %5.1f%% %5d calls  %s" % (ms, 100 * ms / max(total, 1e-9), calls[k], " ".join(k)))
    print("convolution layers (GFLOP/s of the direct algorithm's FLOPs):")
    for k, ms in by_layer.most_common(args.top):
        print("%8.0f ms %4d calls %7.1f GFLOP/s  %s" % (ms, layer_calls[k], flops[k] * layer_calls[k] / ms / 1e6,
                                                        " ".join(k)))


if __name__ == "__main__":
    main()
