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
# DEMO_FP32_STEPS of batch 32 (reports/recipe/runs/fp32_*: calibration; flags given to scripts/demo.sh win).
DEMO_FP32_STEPS=${DEMO_FP32_STEPS:-1000}
steps_flag=()
if ! "$PY" -c "import sys; from dalle_lab.utils import cpu_has_native_bf16; sys.exit(0 if cpu_has_native_bf16() else 1)"; then
    echo "[demo] this CPU has no native bfloat16: float32 training, $DEMO_FP32_STEPS steps of batch 32 (python train_dalle.py alone trains 1800)"
    steps_flag=(--max_steps "$DEMO_FP32_STEPS" --batch_size 32 --warmup_steps 50)
fi
"$PY" train_dalle.py --output_dir "$RUN_DIR" "${steps_flag[@]}" "$@"
"$PY" generate.py --dalle_path "$RUN_DIR/dalle.pt" --outputs_dir "$OUT_DIR" --num_images 8 \
    --text "a small green square on the left on a white background|a green square above a purple triangle on a gray background|a small blue circle at the bottom right on a black background"
echo
echo "checkpoint: $RUN_DIR/dalle.pt   samples during training: $RUN_DIR/samples/"
echo "generated images: $OUT_DIR/<caption>/*.png (grid.png per caption), index: $OUT_DIR/manifest.jsonl"
echo "measure quality: $PY benchmarks/dalle_quality.py --dalle_path $RUN_DIR/dalle.pt"
