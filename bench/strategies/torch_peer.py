"""The PyTorch peer of strategy_bench.py: bench/parallel/torch_ddp.py (DDP on gloo, time to accuracy) with
MobileNetV2's width multiplier, which torch_ddp.py does not take. `--model mobilenetv2 --width-mult W` trains
bench/train/torch_models.mobilenetv2(..., wm=W), the twin of Tandem's `--model mobilenetv2 --width-mult W`; every
other argument goes to torch_ddp.py unchanged.

Run with Debian's interpreter: /usr/bin/python3 (python3-torch)."""
import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parallel"))
import torch_ddp  # noqa: E402  (puts bench/train on the path)
import torch_models  # noqa: E402


def evaluate_unwrapped(tta):
    """torch_ddp.time_to_accuracy evaluates on rank 0 alone; a DDP-wrapped model with buffers (MobileNetV2's batch
    norms) would broadcast them in that forward, a collective the other ranks never join (gloo: connection reset).
    Evaluate the wrapped module instead: DDP keeps every rank's buffers equal to rank 0's in training."""
    def run(args, model, step, rank, world):
        return tta(args, getattr(model, "module", model), step, rank, world)
    return run


def main():
    argv, width, model = [], 1.0, None
    it = iter(sys.argv[1:])
    for arg in it:
        if arg == "--width-mult":
            width = float(next(it))
        elif arg == "--model":
            model = next(it)
        else:
            argv.append(arg)
    if model == "mobilenetv2":
        torch_models.mobilenetv2_width = functools.partial(torch_models.mobilenetv2, wm=width)
        model = "mobilenetv2_width"
    torch_ddp.time_to_accuracy = evaluate_unwrapped(torch_ddp.time_to_accuracy)
    sys.argv = [sys.argv[0]] + (["--model", model] if model else []) + argv
    return torch_ddp.main()


if __name__ == "__main__":
    sys.exit(main())
