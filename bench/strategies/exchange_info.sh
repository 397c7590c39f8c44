#!/bin/bash
# Issue #13 (asgd): exchange_info.py on two emulated t2.micro hosts, both starting together (DELTA 0). Run as root
# under the emu lock:  flock /tmp/tandem-emu.lock bench/strategies/exchange_info.sh [OUTDIR]
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/exchange_info}; mkdir -p $OUT; chmod 755 $OUT
tools/emu-cluster up --name xinfo --hosts 2 --preset t2.micro > /tmp/exchange_info_up.log 2>&1 || { echo up failed; cat /tmp/exchange_info_up.log; }
A=$(tools/emu-cluster addr --name xinfo 0)
t0=$(python3 -c "import time; print(time.time()+1.5)")
tools/emu-cluster exec --name xinfo 0 /usr/bin/python3 $PWD/bench/strategies/exchange_info.py a $A 23611 246824 20 $t0 > $OUT/a.json &
pa=$!
tools/emu-cluster exec --name xinfo 1 /usr/bin/python3 $PWD/bench/strategies/exchange_info.py b $A 23611 246824 20 $t0 > $OUT/b.json
wait $pa
tools/emu-cluster exec --name xinfo 0 tc -s qdisc show dev eth0 > $OUT/tc_a.txt 2>&1
tools/emu-cluster exec --name xinfo 1 tc -s qdisc show dev eth0 > $OUT/tc_b.txt 2>&1
tools/emu-cluster down --name xinfo
