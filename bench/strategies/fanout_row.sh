#!/bin/sh
# The fan-out CV measured first, then a strategy_bench row predicted with it (issue #13, SSP; session 15):
#   flock /tmp/tandem-emu.lock bench/strategies/fanout_row.sh OUT_PREFIX TANDEM [STRATEGIES] [REPS]
# writes OUT_PREFIX_fanout.json (fanout_calibrate.py: tcp_fanout_cv) and OUT_PREFIX.json/.txt (strategy_bench.py
# --parts tta with --tcp-fanout-cv and --tcp-fanout-corr set to the calibration's figures, given before the run).
set -eu
[ $# -ge 2 ] || { echo "usage: fanout_row.sh OUT_PREFIX TANDEM [STRATEGIES] [REPS]" >&2; exit 2; }
out=$1 tandem=$2 strategies=${3:-ssp,ps-async} reps=${4:-43}
here=$(dirname "$0")
python3 "$here/fanout_calibrate.py" --reps "$reps" --name "fanrow$$" --json "${out}_fanout.json"
cv=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['tcp_fanout_cv'], 4))" "${out}_fanout.json")
corr=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['tcp_fanout_corr'], 4))" "${out}_fanout.json")
echo "tcp_fanout_cv $cv, tcp_fanout_corr $corr (measured above, before the run)"
python3 "$here/strategy_bench.py" --parts tta --strategies "$strategies" --tandem "$tandem" --tcp-fanout-cv "$cv" \
  --tcp-fanout-corr "$corr" \
  --name "sbrow$$" --json "${out}.json" | tee "${out}.txt"
