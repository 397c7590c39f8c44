#!/bin/bash
# The GPU checks and measurements of issue #14, in one call on a lent GPU machine (the device tool), from a
# bundle built here by bench/gpu/make_bundle.sh (.gpu/bundle.tar.xz, carried with the call):
#   1. the gpu-labelled tests: test_compute_gpu (every CUDA op against the CPU reference) and
#      c_device_collectives_gpu_test (device-buffer all-reduce/broadcast, staged and NCCL, against the host);
#   2. device all-reduce (bench/gpu/device_allreduce_bench.c) at 1, 2 and 4 ranks beside host memory and NCCL
#      called directly;
#   3. training throughput against the machine's PyTorch on CUDA (bench/train/bench_train.py --device cuda);
#   4. tandem calibrate --device cuda and tandem train --predict against the measured step.
# Further steps by name: parallel (DDP and a pipeline on the GPU), bf16, fp16 (loss-scaled fp16 against PyTorch's
# autocast(float16) with GradScaler), fp16predict (calibrate and --predict at fp16), grouped (mobilenetv2 in 16-bit
# math with its depthwise convolutions in f32, the default, against in 16 bits).
# Writes $OUT/device_check.log (everything) and prints a summary. STEPS (default "tests allreduce train predict")
# picks steps, e.g. STEPS="tests fp16".
set -u
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
STEPS=${STEPS:-"tests allreduce train predict"}
repo=$(cd "$(dirname "$0")/../.." && pwd)
log=$OUT/device_check.log
exec > >(tee -a "$log") 2>&1
G=/tmp/tandem-gpu
rm -rf "$G" && mkdir -p "$G" && tar -C "$G" -xJf "$repo/.gpu/bundle.tar.xz" --strip-components=1
py=$(command -v python3)
site=$("$py" -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
nvlibs=$(find "$site" /usr/local/cuda/lib64 -maxdepth 3 -type d -name lib\* 2>/dev/null | tr '\n' ':')
export TANDEM_GPU_LD="$G/lib:$nvlibs"
cat > "$G/tandem" <<W
#!/bin/sh
LD_LIBRARY_PATH="$TANDEM_GPU_LD\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$G/bin/tandem" "\$@"
W
chmod +x "$G/tandem"
run() { LD_LIBRARY_PATH="$TANDEM_GPU_LD" "$@"; }
section() { echo; echo "=== $* ($(date +%T))"; }
# tandem calibrate at a 16-bit precision (resnet18, batch 256), then train --predict against that profile.
predict_at() {
  section "calibrate and train --predict with --precision $1"
  timeout 120 "$G/tandem" calibrate --device cuda --precision "$1" --model resnet18 --batch 256 \
    --out "$OUT/profile_resnet18_cuda_$1.json" | tail -3
  grep -o '"runtime_device_bytes": *[0-9.e+]*' "$OUT/profile_resnet18_cuda_$1.json"
  timeout 120 "$G/tandem" train --device cuda --precision "$1" --model resnet18 --dataset synthetic --input 3x32x32 \
    --epochs 2 --batch 256 --limit-batches 40 --train-limit 10240 --test-limit 256 --eval-limit-batches 1 --predict \
    --predict-cluster p5.48xlarge:1 --profile "$OUT/profile_resnet18_cuda_$1.json"
  echo "rc=$?"
}

section machine
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
lscpu | grep -E "Model name|^CPU\(s\)"
for l in libcudnn.so.9 libcublas.so.13 libnccl.so.2; do
  echo "$l: $(find ${nvlibs//:/ } -maxdepth 1 -name "$l" 2>/dev/null | head -1)"
done
run "$G/bin/tandem" version

case " $STEPS " in *" tests "*)
  section test_compute_gpu
  run timeout 300 "$G/bin/test_compute_gpu" --log_level=test_suite --report_level=short; echo "rc=$?"
  section c_device_collectives_gpu_test
  run timeout 120 "$G/bin/c_device_collectives_gpu_test"; echo "rc=$?"
;; esac

case " $STEPS " in *" allreduce "*)
  for n in 1 2 4; do
    section "device all-reduce, $n rank(s)"
    timeout 180 "$G/tandem" launch -n "$n" --timeout-ms 60000 -- "$G/bin/device_allreduce_bench" --sizes 1M,16M,64M \
      --iters 20 | tee "$OUT/allreduce_$n.jsonl"
  done
;; esac

case " $STEPS " in *" train "*)
  bt() { PYTHONUNBUFFERED=1 timeout 600 "$py" "$repo/bench/train/bench_train.py" --tandem "$G/tandem" --device cuda \
           --torch2 "$py" --torch1 "" --threads 1 --seconds ${TRAIN_SECONDS:-3} "$@"; }
  section "training throughput, strict f32 (no TF32 on either side), batch 64, against PyTorch on CUDA"
  bt --models ${TRAIN_MODELS:-lenet5,mlp,resnet18,mobilenetv2}
  section "training throughput, strict f32, batch 256"
  bt --batch 256 --models resnet18,mobilenetv2
  section "training throughput, TF32 allowed on both sides, batch 256"
  bt --batch 256 --tf32 1 --models resnet18,mobilenetv2
;; esac

case " $STEPS " in *" parallel "*)
  tr() { timeout 180 "$G/tandem" launch -n 2 --timeout-ms 60000 -- "$G/tandem" train --device cuda --model resnet18 \
           --dataset synthetic --input 3x32x32 --epochs 2 --batch 64 --limit-batches 30 --train-limit 3840 \
           --test-limit 64 --eval-limit-batches 1 "$@"; echo "rc=$?"; }
  section "DDP, 2 ranks sharing the GPU (device path: staged)"
  tr --strategy ddp
  section "pipeline, 2 stages on the GPU, 4 micro-batches"
  tr --strategy pipeline --microbatches 4
;; esac

case " $STEPS " in *" bf16 "*)
  section "training throughput, bf16: Tandem --precision bf16 against PyTorch autocast(bfloat16), batch 256"
  PYTHONUNBUFFERED=1 timeout 300 "$py" "$repo/bench/train/bench_train.py" --tandem "$G/tandem" --device cuda \
    --torch2 "$py" --torch1 "" --threads 1 --seconds ${TRAIN_SECONDS:-3} --batch 256 --precision bf16 \
    --models resnet18,mobilenetv2
  predict_at bf16
;; esac

case " $STEPS " in *" fp16 "*)
  section "fp16 with dynamic loss scaling: the GPU tests' fp16 case, then Tandem --precision fp16 against PyTorch autocast(float16) + GradScaler, batch 256"
  run timeout 300 "$G/bin/test_compute_gpu" --log_level=test_suite --report_level=short 2>&1 | grep -E 'fp16|bf16|error|passed|failed' | tail -8
  PYTHONUNBUFFERED=1 timeout 300 "$py" "$repo/bench/train/bench_train.py" --tandem "$G/tandem" --device cuda \
    --torch2 "$py" --torch1 "" --threads 1 --seconds ${TRAIN_SECONDS:-3} --batch 256 --precision fp16 \
    --models resnet18,mobilenetv2
  timeout 120 "$G/tandem" train --device cuda --precision fp16 --model resnet18 --dataset synthetic --input 3x32x32 \
    --epochs 2 --batch 256 --limit-batches 40 --train-limit 10240 --test-limit 256 --eval-limit-batches 1 --json | tail -2
  echo "rc=$?"
;; esac

case " $STEPS " in *" grouped "*)
  section "16-bit math and grouped convolutions: mobilenetv2, batch 256, depthwise in f32 (default) against in 16 bits (TANDEM_HALF_GROUPED_CONV=1)"
  for prec in bf16 fp16; do
    for g in 0 1; do
      echo "--- $prec, TANDEM_HALF_GROUPED_CONV=$g"
      TANDEM_HALF_GROUPED_CONV=$g PYTHONUNBUFFERED=1 timeout 200 "$py" "$repo/bench/train/bench_train.py" --tandem "$G/tandem" \
        --device cuda --torch2 "$py" --torch1 "" --threads 1 --seconds ${TRAIN_SECONDS:-3} --batch 256 --precision $prec \
        --models mobilenetv2
    done
  done
  for g in 0 1; do
    TANDEM_HALF_GROUPED_CONV=$g timeout 120 "$G/tandem" calibrate --device cuda --precision bf16 --model mobilenetv2 \
      --batch 256 --out "$OUT/profile_mobilenetv2_cuda_bf16_g$g.json" | tail -2
  done
  TANDEM_CUDA_ALLOW_TF32=1 timeout 120 "$G/tandem" calibrate --device cuda --model mobilenetv2 --batch 256 \
    --out "$OUT/profile_mobilenetv2_cuda_tf32.json" | tail -2 || true
;; esac

case " $STEPS " in *" fp16predict "*)
  predict_at fp16
;; esac

case " $STEPS " in *" predict "*)
  section "calibrate --device cuda, then train --predict on p5.48xlarge:1 (one of its GPUs)"
  timeout 300 "$G/tandem" calibrate --device cuda --model resnet18 --batch 64 --out "$OUT/profile_resnet18_cuda.json"
  echo "rc=$?"
  grep -o '"runtime_device_bytes": *[0-9.e+]*' "$OUT/profile_resnet18_cuda.json"
  timeout 300 "$G/tandem" train --device cuda --model resnet18 --dataset synthetic --input 3x32x32 --epochs 2 --batch 64 \
    --limit-batches 100 --train-limit 6400 --test-limit 64 --eval-limit-batches 1 --predict --predict-cluster p5.48xlarge:1 \
    --profile "$OUT/profile_resnet18_cuda.json"
  echo "rc=$?"
  timeout 300 "$G/tandem" train --device cuda --model resnet18 --dataset synthetic --input 3x32x32 --epochs 2 --batch 64 \
    --limit-batches 50 --train-limit 3200 --test-limit 64 --eval-limit-batches 1 --predict --predict-cluster p5.48xlarge:1
  echo "rc=$?"
;; esac
section done
