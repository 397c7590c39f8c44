#!/bin/bash
# Issue #13 (asgd): two emulated t2.micro hosts exchange 246,824 bytes (LeNet-5 state) each way per step over one
# TCP connection, host B starting DELTA after host A (0, 8, 16, 24 ms). Run as root under the emu lock:
#   flock /tmp/tandem-emu.lock bench/strategies/exchange_pair.sh [OUTDIR]
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/exchange_pair}; mkdir -p $OUT; chmod 755 $OUT
tools/emu-cluster up --name noisex --hosts 2 --preset t2.micro > /tmp/exchange_pair_up.log 2>&1 || { echo up failed; cat /tmp/exchange_pair_up.log; }
A=$(tools/emu-cluster addr --name noisex 0)
port=23500
for d in 0 0.008 0.016 0.024; do
  t0=$(python3 -c "import time; print(time.time()+1.5)")
  port=$((port+1))
  tools/emu-cluster exec --name noisex 0 /usr/bin/python3 $PWD/bench/strategies/exchange_pair.py a $A $port 246824 $d 20 $t0 > $OUT/a_$d.json &
  pa=$!
  tools/emu-cluster exec --name noisex 1 /usr/bin/python3 $PWD/bench/strategies/exchange_pair.py b $A $port 246824 $d 20 $t0 > $OUT/b_$d.json
  wait $pa
done
tools/emu-cluster down --name noisex
