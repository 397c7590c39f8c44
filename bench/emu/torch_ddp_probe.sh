#!/bin/bash
# usage: bench/emu/torch_ddp_probe.sh HOSTS [probe args]  (wrap in: flock -s /tmp/tandem-bench.lock flock /tmp/tandem-emu.lock)
# One-rank group on host 0, then one rank per host on HOSTS emulated t2.micro hosts at 65 Mbit/s (torch_ddp_probe.py).
set -u
cd "$(dirname "$0")/../.."
T=tools/emu-cluster; N=ptmnv2; H=$1; shift
$T up --name $N --hosts $H --preset t2.micro --cpu-quota 0.5 --cpu-period-us 5000 --bw-mbit 65 >/dev/null || exit 1
A0=$($T addr --name $N 0)
echo "# world 1 on host 0"
$T exec --name $N 0 -- env RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 /usr/bin/python3 bench/emu/torch_ddp_probe.py "$@"
echo "# world $H"
pids=()
for r in $(seq 0 $((H-1))); do
  $T exec --name $N $r -- env RANK=$r WORLD_SIZE=$H MASTER_ADDR=$A0 MASTER_PORT=29612 GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 /usr/bin/python3 bench/emu/torch_ddp_probe.py "$@" > /tmp/torch_ddp_probe_r$r.out 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
cat /tmp/torch_ddp_probe_r*.out
$T status --name $N --json | python3 -c "import json,sys; print([h.get('cpu_seconds') for h in json.load(sys.stdin)['hosts']])"
$T down --name $N >/dev/null
