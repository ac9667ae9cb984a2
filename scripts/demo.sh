#!/usr/bin/env bash
# The main job (README quick start): train the DALLE transformer on the built-in Shapes data with the default
# image tokenizer and BPE vocabulary, then generate images for captions it never saw in training (two from the
# validation split, one from the held-out colour-shape compositions).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RUN_DIR=${RUN_DIR:-runs/dalle}
OUT_DIR=${OUT_DIR:-outputs}

# The step budget fits the demo in about 10 minutes of training on 2 CPU cores. Where the processor computes
# bfloat16 natively (avx512_bf16 / AMX) a step under bf16 autocast is ~3x cheaper than in float32, so such machines
# train train_dalle.py's full 1800 steps; elsewhere (AVX2-only CPUs) --amp resolves to float32 and the demo trains
# DEMO_FP32_STEPS of global batch 32 (reports/recipe/runs/fp32_*: calibration; flags given to scripts/demo.sh win).
# There it trains as DEMO_PROCESSES=2 DDP processes of batch 16 (torchrun; cores/2 threads each), the same steps
# and sample stream: on 2 idle cores 1.05x faster in the loop than one process with both threads
# (reports/recipe/cpu_processes_speed-20261203-1509.json; DEMO_PROCESSES=1 trains in one process). A --batch_size
# given to scripts/demo.sh is then per process.
# DALLE_LAB_CPU_BF16=1 or 0 makes this script (and the package) treat the CPU as having native bf16 or not;
# DEMO_DRY_RUN=1 prints the two commands instead of running them (tests/test_cpu_kinds.py checks both recipes).
DEMO_FP32_STEPS=${DEMO_FP32_STEPS:-1000}
cores=$(nproc)
DEMO_PROCESSES=${DEMO_PROCESSES:-$(( cores >= 2 ? 2 : 1 ))}
launch=("$PY")
steps_flag=()
if ! "$PY" -c "import sys; from dalle_lab.utils import cpu_has_native_bf16; sys.exit(0 if cpu_has_native_bf16() else 1)"; then
    if ! [[ $DEMO_PROCESSES =~ ^[1-9][0-9]*$ ]] || (( 32 % DEMO_PROCESSES )); then
        echo "[demo] DEMO_PROCESSES=$DEMO_PROCESSES must divide the batch of 32: choose 1, 2, 4, 8, 16 or 32" >&2
        exit 2
    fi
    # gloo must be able to open a device on this host (a hostname that does not resolve is the usual failure)
    if (( DEMO_PROCESSES > 1 )) && ! gloo_error=$("$PY" -c "
import torch.distributed as dist
from dalle_lab.training.distributed import free_port
dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)
dist.destroy_process_group()" 2>&1); then
        echo "[demo] torch.distributed (gloo) cannot start on this host ($(echo "$gloo_error" | tail -n 1)):" \
             "training in one process instead"
        DEMO_PROCESSES=1
    fi
    echo "[demo] this CPU has no native bfloat16: float32 training, $DEMO_FP32_STEPS steps of batch 32" \
         "in $DEMO_PROCESSES process(es) (python train_dalle.py alone trains 1800)"
    steps_flag=(--max_steps "$DEMO_FP32_STEPS" --batch_size $(( 32 / DEMO_PROCESSES )) --warmup_steps 50)
    if (( DEMO_PROCESSES > 1 )); then
        threads=${OMP_NUM_THREADS:-$(( cores / DEMO_PROCESSES > 0 ? cores / DEMO_PROCESSES : 1 ))}
        launch=(env OMP_NUM_THREADS="$threads" "$PY" -m torch.distributed.run --standalone
                --nproc_per_node "$DEMO_PROCESSES")
    fi
fi
run() {
    if [ -n "${DEMO_DRY_RUN:-}" ]; then
        echo "[demo] would run: $*"
    else
        "$@"
    fi
}
run "${launch[@]}" train_dalle.py --output_dir "$RUN_DIR" "${steps_flag[@]}" "$@"
run "$PY" generate.py --dalle_path "$RUN_DIR/dalle.pt" --outputs_dir "$OUT_DIR" --num_images 8 \
    --text "a small green square on the left on a white background|a green square above a purple triangle on a gray background|a small blue circle at the bottom right on a black background"
if [ -n "${DEMO_DRY_RUN:-}" ]; then exit 0; fi
echo
echo "checkpoint: $RUN_DIR/dalle.pt   samples during training: $RUN_DIR/samples/"
echo "generated images: $OUT_DIR/<caption>/*.png (grid.png per caption), index: $OUT_DIR/manifest.jsonl"
echo "measure quality: $PY benchmarks/dalle_quality.py --dalle_path $RUN_DIR/dalle.pt"
