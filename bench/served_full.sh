#!/usr/bin/env bash
# The 7B served at full context on a lent GPU, in one call: Moshi-7B with int4 KV, fp8 weights
# and bf16 Mimi, N sessions over sockets streamed 242 s (past the 3,000-frame rings) before the
# 8 s measured, the engine alone at full rings in the same run (bench/served.py). N defaults to
# the card's batch (256 on an H200, 128 on an H100); each call is about 330 s, under the run
# tool's 600 s. Needs .whl/ (bench/device_wheels.sh) carried. Results go to $OUT (out/ here when
# unset). Usage:
#
#   bash bench/served_full.sh [N] [extra bench/served.py arguments, e.g. --warmup 2]
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/_device_env.sh
source bench/_device_env.sh || exit 1
count=$card_batch
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then count=$1; shift; fi
nvidia-smi --query-gpu=name --format=csv,noheader
echo "N=$count tree $(python3 bench/_source.py)"
timeout 585 python3 bench/served.py --counts "$count" --seconds 8 --warmup 242 --client-procs 8 \
    --engine-bench --engine-context full --engine-out "$OUT/served-engine-full-$count" \
    --out "$OUT/served-full-$count.json" "$@" -- --model moshi-7b --random-weights \
    --model-device cuda --tts none --no-agent --kv-cache-dtype int4 --weight-dtype fp8 \
    --codec-dtype bf16 2>&1 | grep -v "^\s*$" | tail -30 | cut -c1-400
rm -f "$OUT"/*.png "$OUT"/*.md  # the run tool returns 8 files a call: keep the JSON
