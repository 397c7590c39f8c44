#!/bin/bash
# bench/emu/torch_corun.sh (wrap in both locks): one-rank PyTorch passes on k emulated hosts at once (k = 1 2 4 1): CPU per pass alone and beside others
set -u
cd "$(dirname "$0")/../.."
T=tools/emu-cluster; N=ptmnv2c
$T up --name $N --hosts 4 --preset t2.micro --cpu-quota 0.5 --cpu-period-us 5000 --bw-mbit 65 >/dev/null || exit 1
for k in 1 2 4 1; do
  echo "# k=$k load $(cut -d' ' -f1 /proc/loadavg)"
  pids=()
  for r in $(seq 0 $((k-1))); do
    $T exec --name $N $r -- env RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29621 GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 /usr/bin/python3 bench/emu/torch_ddp_probe.py --steps 15 "$@" > /tmp/torch_corun_$r.out 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  for r in $(seq 0 $((k-1))); do python3 -c "
import json,sys; j=[json.loads(l) for l in open('/tmp/torch_corun_$r.out') if l.startswith('{')][-1]
print('  host $r: wall/step %.1f ms, cpu/step %.1f ms, ratio %.2f' % (j['step_ms'], j['cpu_ms_per_step'], j['step_ms']/j['cpu_ms_per_step']))"; done
done
$T down --name $N >/dev/null
