#!/usr/bin/env bash
# A separate environment with Kyutai's moshi==0.2.13 for the moshi.client interoperability test
# (tests/transport/test_e2e_moshi_client.py skips without it). Run by bootstrap.sh: about two
# minutes and 1.1 GB (torch) the first time, nothing after. moshi pins torch<2.10; it runs on
# the CPU torch 2.13 this project uses, so moshi itself is installed without its pins.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DUPLEX_MOSHI_VENV:-build/moshi-venv}

if ! ldconfig -p 2>/dev/null | grep -q 'libportaudio\.so\.2'; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libportaudio2 >/dev/null
    else
        echo "moshi_client_venv: please install the system package libportaudio2" >&2
        exit 1
    fi
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import moshi.client" 2>/dev/null; then
    exit 0  # ready: nothing to install
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-deps moshi==0.2.13
"$VENV/bin/python" -m pip install -q "numpy<2.3,>=1.26" "safetensors<0.8" "huggingface-hub<1.0" \
    "einops<0.9" "sentencepiece<0.3" "sounddevice==0.5" "sphn==0.2.1" "aiohttp>=3.10.5,<3.12" \
    tqdm "torch==2.13.0"
"$VENV/bin/python" -c "import moshi.client" && echo "moshi_client_venv: ready at $VENV"
