#!/usr/bin/env bash
# The one install recipe for dalle_lab. The README's quick start and .ci/run both call it.
#
#   scripts/install.sh            # create ./.venv (if needed) and install dalle_lab + test tools into it
#   PYTHON=/path/python scripts/install.sh   # install into an existing environment instead (e.g. your GPU env)
#
# What it takes care of (see ../shared/ENVIRONMENT.md for the measurements behind each point):
# - torch: a torch you already have is never replaced (its version is pinned in a constraints file for every
#   later pip call, so no dependency can drag in another build). With no torch present it installs
#   torch==$TORCH_VERSION; set TORCH_INDEX to a wheel index (e.g. the CPU-only one) to choose the build.
# - youtokentome's setup imports Cython without declaring it: Cython first, then --no-build-isolation.
# - taming-transformers' PyPI build cannot import as shipped: it is installed --no-deps with its real needs;
#   dalle_lab/vae/taming_compat.py supplies the two import paths it lacks at import time.
# - deepspeed builds no C++/CUDA ops at install time (DS_BUILD_OPS=0); it JIT-compiles what it needs later.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=${TORCH_VERSION:-2.13.0}
if [ -z "${PYTHON:-}" ]; then
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    PYTHON=.venv/bin/python
fi
pip() { "$PYTHON" -m pip --disable-pip-version-check -q "$@"; }

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "[install] no torch found: installing torch==$TORCH_VERSION"
    if [ -n "${TORCH_INDEX:-}" ]; then
        pip install "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX"
    else
        pip install "torch==$TORCH_VERSION"
    fi
fi
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PYTHON" -c "import torch; print('torch==' + torch.__version__)" > "$constraints"
echo "[install] keeping $(cat "$constraints")"

pip install -c "$constraints" Cython wheel setuptools
pip install -c "$constraints" --no-build-isolation youtokentome==1.0.6
pip install -c "$constraints" --no-deps taming-transformers-rom1504==0.0.6
DS_BUILD_OPS=0 pip install -c "$constraints" -e ".[all,test]"
"$PYTHON" -c "import dalle_lab, youtokentome, deepspeed; from dalle_lab.vae.taming_compat import import_taming; import_taming()" \
    && echo "[install] ok: $("$PYTHON" -c 'import sys; print(sys.executable)')"
