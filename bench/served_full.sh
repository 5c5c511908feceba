#!/usr/bin/env bash
# The 7B served at full context on a lent GPU, in one call: Moshi-7B with int4 KV, fp8 weights
# and bf16 Mimi, over sockets (bench/served.py --step-down): the largest N opens and streams
# 242 s (past the 3,000-frame rings), then each N is measured for 8 s, the sessions above the
# next N closing in between, so every N runs at full context for one warm-up; then, the server
# stopped, the engine alone at full rings at the Ns served, in the same call. COUNTS defaults
# to the card's: capacity,256,192,128 on an H200, capacity,128 on an H100 ("capacity": the
# sessions /health says the server admits, the largest N it offers). About 320 s a call on an
# H100, 440 s on an H200, under the run tool's 600 s. Needs .whl/ (bench/device_wheels.sh)
# carried. Results go to $OUT (out/ here when unset). Usage:
#
#   bash bench/served_full.sh [COUNTS] [extra bench/served.py arguments, e.g. --warmup 2]
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/_device_env.sh
source bench/_device_env.sh || exit 1
counts=capacity,128
if [ "$card_batch" -eq 256 ]; then counts=capacity,256,192,128; fi
if [ $# -gt 0 ] && [[ "$1" =~ ^(capacity|[0-9]+)(,(capacity|[0-9]+))*$ ]]; then counts=$1; shift; fi
name=${counts//,/-}
nvidia-smi --query-gpu=name --format=csv,noheader
echo "N=$counts tree $(python3 bench/_source.py)"
timeout 585 python3 bench/served.py --counts "$counts" --step-down --seconds 8 --warmup 242 \
    --client-procs 8 --engine-bench --engine-context full \
    --engine-out "$OUT/served-engine-full-$name" --out "$OUT/served-full-$name.json" "$@" \
    -- --model moshi-7b --random-weights \
    --model-device cuda --tts none --no-agent --kv-cache-dtype int4 --weight-dtype fp8 \
    --codec-dtype bf16 2>&1 | grep -E '^\{"sessions"|median|rror|Traceback|exited' | cut -c1-700
rm -f "$OUT"/*.png "$OUT"/*.md  # the run tool returns 8 files a call: keep the JSON
