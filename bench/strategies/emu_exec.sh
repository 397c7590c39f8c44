#!/bin/sh
# strategy_bench.py --ranks-per-host R: `tandem launch --host-exec` wrapper placing rank RANK of a job with W worker
# ranks on its emulated host: worker w on host w / R, server rank W + s on host W / R + s (a host of its own).
#   emu_exec.sh NAME R W RANK -- COMMAND...
set -eu
[ $# -ge 5 ] && [ "$5" = "--" ] || { echo "usage: emu_exec.sh NAME R W RANK -- COMMAND..." >&2; exit 2; }
name=$1 r=$2 w=$3 rank=$4
shift 5
if [ "$rank" -lt "$w" ]; then host=$((rank / r)); else host=$((w / r + rank - w)); fi
exec "$(dirname "$0")/../../tools/emu-cluster" exec --name "$name" "$host" -- "$@"
