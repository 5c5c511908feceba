# Sourced from the repository root by the scripts run on a lent GPU host (device_checks.sh,
# served_full.sh): the carried wheels onto PYTHONPATH (.whl/, bench/device_wheels.sh), a
# Triton cache, $OUT (the run tool's folder; out/ here when unset), and the card's batch in
# $card_batch: 256 on an H200 (over 100 GB), 128 on an H100.
# shellcheck disable=SC1091
source .whl/setup.sh || return 1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
OUT=${OUT:-out}
mkdir -p "$OUT"
memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
card_batch=128
if [ "$memory" -gt 100000 ]; then card_batch=256; fi
