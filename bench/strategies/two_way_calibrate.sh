#!/bin/bash
# `tandem calibrate --network`'s two-way phase (cli/calibrate_network.hpp) on a fresh pair of emulated t2.micro hosts
# (65 Mbit/s): the gossip swap's tcp_two_way_factor at asgd's message size (LeNet-5's 246,824 parameter bytes), at
# each idle gap given. Run as root under the emu lock:
#   flock /tmp/tandem-emu.lock bench/strategies/two_way_calibrate.sh OUTDIR [TANDEM] [GAP_MS...]
# Writes OUTDIR/two_way_gapG.json per gap (default gaps 100 and 300 ms) and brings the cluster down on every exit.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: two_way_calibrate.sh OUTDIR [TANDEM] [GAP_MS...]}
T=$(realpath "${2:-build/default/bin/tandem}")
shift 2 2>/dev/null || shift $#
GAPS=${*:-100 300}
NAME=tw$$
mkdir -p "$OUT" && chmod 755 "$OUT"
trap 'tools/emu-cluster down --name $NAME > /dev/null 2>&1' EXIT
tools/emu-cluster up --name $NAME --hosts 2 --preset t2.micro > "$OUT/up.log" 2>&1 || { echo "up failed"; cat "$OUT/up.log"; exit 1; }
A=$(tools/emu-cluster addr --name $NAME 1)
BW=$(tools/emu-cluster status --name $NAME --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['config']['bw_mbit'])" 2>/dev/null || echo 65)
for g in $GAPS; do
  PORT=$((23700 + g % 100))
  tools/emu-cluster exec --name $NAME 1 -- "$T" calibrate --network --listen $PORT --timeout-s 60 > "$OUT/listen_gap$g.txt" 2>&1 &
  pl=$!
  sleep 1
  tools/emu-cluster exec --name $NAME 0 -- "$T" calibrate --network --peer "$A:$PORT" --seconds 3 --nominal-mbps "$BW" \
    --two-way-bytes 246824 --two-way-reps 20 --two-way-gap-ms $g --out "$OUT/two_way_gap$g.json"
  wait $pl
  python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['two_way']; print(f'gap {t[\"gap_ms\"]:.0f} ms: factor {t[\"factor_mean\"]:.3f} +- {t[\"factor_sd\"]:.3f} (min {t[\"factor_min\"]:.3f}, max {t[\"factor_max\"]:.3f}) over {t[\"repetitions\"]}')" "$OUT/two_way_gap$g.json"
done
