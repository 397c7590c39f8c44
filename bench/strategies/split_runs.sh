#!/bin/bash
# Quick repeats of single strategy rows on 4 emulated hosts, printing each job's own per-step time split (rank
# 0's epoch line, `time_split`): how bench/strategies' run 12 checked run 11's outliers. Run as root, under the
# emulator lock:
#   flock /tmp/tandem-emu.lock bench/strategies/split_runs.sh NAME "UP_ARGS" LABEL:FLAGS...
# e.g. bench/strategies/split_runs.sh rep "--preset t2.micro" "ddp:--strategy ddp" "asgd:--strategy asgd"
# Each job: LeNet-5, batch 32 per worker, lr 0.02, 234 steps (strategy_bench.py's first evaluation), tcp.
# The cluster is brought down on exit; TANDEM (default build/default/bin/tandem) names the binary.
set -u
[ $# -ge 3 ] || { echo "usage: split_runs.sh NAME \"UP_ARGS\" LABEL:FLAGS..." >&2; exit 2; }
cd "$(dirname "$0")/../.."
T=${TANDEM:-build/default/bin/tandem}
N=$1 UP=$2
shift 2
trap 'tools/emu-cluster down --name "$N" > /dev/null 2>&1' EXIT
# shellcheck disable=SC2086
tools/emu-cluster up --name "$N" --hosts 4 $UP > /dev/null || exit 1
A0=$(tools/emu-cluster addr --name "$N" 0)
echo "# $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg), cluster: $UP"
for spec in "$@"; do
  label=${spec%%:*} flags=${spec#*:}
  # shellcheck disable=SC2086
  out=$(timeout 300 "$T" launch --transport tcp --host-exec "tools/emu-cluster exec --name $N {rank} --" \
    --master-addr "$A0" --timeout-ms 120000 -n 4 -- \
    "$T" train --model lenet5 --dataset fashion-mnist --threads 1 --batch 32 --lr 0.02 --seed 1 --epochs 1 \
    --limit-batches 234 --test-limit 200 --json $flags 2>&1)
  rc=$?
  split=$(printf '%s\n' "$out" | grep '^\[rank 0\] {' | grep -o '"time_split":{[^}]*}' | tail -1)
  echo "$label rc=$rc $split"
done
