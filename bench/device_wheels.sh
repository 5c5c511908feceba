#!/usr/bin/env bash
# The wheels a lent GPU host (Python 3.12, torch and triton, numpy and safetensors already
# there; no registry) needs to run the server and the engine benchmarks, gathered here into
# .whl/ (git-ignored through .git/info/exclude), with libopus and Kyutai's moshi==0.2.13 (the
# reference of bench/duplex_engine.py). On the host, before anything else:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=$PWD/.whl/lib
#
# (`source .whl/setup.sh` does both.) Only what the host lacks is carried: the run's carry limit
# is 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
rm -rf .whl
mkdir -p .whl/lib
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$p")
done
download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${PLATFORMS[@]}" -d .whl "$@"
}
# the server's own imports that the host lacks (pyproject.toml), and theirs
download trio==0.35.0 outcome==1.3.0.post0 sniffio==1.3.1 structlog==26.1.0 websockets==17.4 \
    hypercorn==0.18.0 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0 priority==2.0.0 wsproto==1.3.2 \
    starlette==1.10.0 python-multipart==0.0.34 pytest-trio==0.8.0 moshi==0.2.13 sphn==0.2.1
# opuslib is published as source only (pure Python): built into a wheel here
python3 -m pip wheel -q --no-deps -w .whl opuslib==3.0.1
# opuslib is pure Python over the system's libopus, which the host image lacks
cp -L "$(/sbin/ldconfig -p | awk '/libopus.so.0 /{print $NF; exit}')" .whl/lib/libopus.so.0
ln -sf libopus.so.0 .whl/lib/libopus.so
cat >.whl/setup.sh <<'EOF'
# source .whl/setup.sh   (on the GPU host, from the repository root)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=$PWD/.whl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1
EOF
du -sh .whl
