#!/bin/bash
# Issue #13 (asgd): which slow-start exit ends the slow direction's slow start in a two-way exchange.
# exchange_info.py on two emulated t2.micro hosts starting together (DELTA 0), with each host's HyStart counters
# (nstat TcpExtTCPHystart{Train,Delay}{Detect,Cwnd}) read before and after, and the hosts' TCP sysctls.
# Run as root under the emu lock:  flock /tmp/tandem-emu.lock bench/strategies/exchange_hystart.sh [OUTDIR] [STEPS]
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/exchange_hystart}; STEPS=${2:-1}; mkdir -p $OUT; chmod 755 $OUT
NAME=xhys$$
tools/emu-cluster up --name $NAME --hosts 2 --preset t2.micro > $OUT/up.log 2>&1 || { echo up failed; cat $OUT/up.log; }
A=$(tools/emu-cluster addr --name $NAME 0)
counters() { for h in 0 1; do echo "host $h"; tools/emu-cluster exec --name $NAME $h nstat -asz 2>&1 | grep -i hystart; done; }
for h in 0 1; do
  echo "host $h: $(tools/emu-cluster exec --name $NAME $h sysctl -n net.ipv4.tcp_congestion_control net.ipv4.tcp_slow_start_after_idle net.ipv4.tcp_rto_min_us 2>&1 | tr '\n' ' ')"
done > $OUT/sysctl.txt
counters > $OUT/nstat_before.txt
t0=$(python3 -c "import time; print(time.time()+1.5)")
tools/emu-cluster exec --name $NAME 0 /usr/bin/python3 $PWD/bench/strategies/exchange_info.py a $A 23611 246824 $STEPS $t0 > $OUT/a.json &
pa=$!
tools/emu-cluster exec --name $NAME 1 /usr/bin/python3 $PWD/bench/strategies/exchange_info.py b $A 23611 246824 $STEPS $t0 > $OUT/b.json
wait $pa
counters > $OUT/nstat_after.txt
tools/emu-cluster exec --name $NAME 0 tc -s qdisc show dev eth0 > $OUT/tc_a.txt 2>&1
tools/emu-cluster exec --name $NAME 1 tc -s qdisc show dev eth0 > $OUT/tc_b.txt 2>&1
tools/emu-cluster down --name $NAME
