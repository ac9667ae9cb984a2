#!/usr/bin/env bash
# What a lent GPU machine should show, in under 5 minutes on one GPU (docs/gpu.md says what to expect):
#
#   scripts/gpu_check.sh                        # with ./.venv, or PYTHON=/path/to/python (an env with a CUDA torch)
#   GPU_CHECK_DIR=/some/dir scripts/gpu_check.sh   # where the logs and results go (default runs/gpu_check)
#
# 1. the GPU facts: name, compute capability, native bfloat16, torch and CUDA versions;
# 2. the CUDA-path tests (tests/test_cuda.py): numerics against the CPU, --amp's choice, training in float32 / bf16 /
#    fp16 with loss scaling, DeepSpeed, CUDA-graph decoding, generate.py, the demo recipe;
# 3. the demo on the GPU, shortened to DEMO_CHECK_STEPS steps (default 300): it prints the recipe it chose, trains,
#    generates; the log shows the training speed;
# 4. the decoding paths side by side on the GPU (python -m lab.perf.run --device cuda --quick: the default, CUDA graph,
#    speculative), its results file in GPU_CHECK_DIR.
# Without CUDA it says so and exits 0. Each stage has a time limit (300 s in all); a failed stage does not stop
# the next, and the exit status is 1 if any failed. Install first where needed: PYTHON=/path/python scripts/install.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3 || command -v python)
OUT=${GPU_CHECK_DIR:-runs/gpu_check}
STEPS=${DEMO_CHECK_STEPS:-300}
export WANDB_MODE=${WANDB_MODE:-disabled} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "[gpu_check] no CUDA device for $PY (torch.cuda.is_available() is false): nothing to check, skipped"
    exit 0
fi
if ! missing=$("$PY" -c "
import importlib.util as u
need = ['dalle_lab', 'youtokentome', 'taming', 'deepspeed', 'pytest', 'einops', 'omegaconf']
print(' '.join(m for m in need if u.find_spec(m) is None))") || [ -n "$missing" ]; then
    echo "[gpu_check] $PY lacks: ${missing:-(could not ask)}; install with PYTHON=$PY scripts/install.sh" >&2
    exit 1
fi
mkdir -p "$OUT"

failed=()
stage() {  # stage NAME LIMIT_S COMMAND...: run it under a time limit, log to $OUT/NAME.log, remember a failure
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    echo "[gpu_check] == $name (at most ${limit} s): $*"
    timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local status=${PIPESTATUS[0]}
    echo "[gpu_check] == $name: exit $status after $(( SECONDS - start )) s"
    (( status == 0 )) || failed+=("$name (exit $status)")
}

stage facts 30 "$PY" -c "
import torch, platform
from dalle_lab.utils import cuda_has_native_bf16
p = torch.cuda.get_device_properties(0)
print(f'{torch.cuda.device_count()} GPU(s); GPU 0: {p.name}, compute capability {p.major}.{p.minor}, '
      f'{p.total_memory / 2**30:.0f} GiB; native bf16: {cuda_has_native_bf16()}')
print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, Python {platform.python_version()}')"
stage tests 120 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py
stage demo 70 env RUN_DIR="$OUT/demo_run" OUT_DIR="$OUT/demo_outputs" PYTHON="$PY" bash scripts/demo.sh \
    --max_steps "$STEPS" --warmup_steps 50 --sample_every_n_steps 0
stage side_by_side 80 "$PY" -m lab.perf.run --device cuda --quick --no-peer --json "$OUT/perf_cuda.json"

if (( ${#failed[@]} )); then
    echo "[gpu_check] FAILED: ${failed[*]}; logs in $OUT/"
    exit 1
fi
echo "[gpu_check] all stages passed; logs and results in $OUT/"
