#!/usr/bin/env bash
# The main job (README quick start): train the DALLE transformer on the built-in Shapes data with the default
# image tokenizer and BPE vocabulary, then generate images for captions it never saw in training (two from the
# validation split, one from the held-out colour-shape compositions).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RUN_DIR=${RUN_DIR:-runs/dalle}
OUT_DIR=${OUT_DIR:-outputs}

"$PY" train_dalle.py --output_dir "$RUN_DIR" "$@"
"$PY" generate.py --dalle_path "$RUN_DIR/dalle.pt" --outputs_dir "$OUT_DIR" --num_images 8 \
    --text "a small green square on the left on a white background|a green square above a purple triangle on a gray background|a small blue circle at the bottom right on a black background"
echo
echo "checkpoint: $RUN_DIR/dalle.pt   samples during training: $RUN_DIR/samples/"
echo "generated images: $OUT_DIR/<caption>/*.png (grid.png per caption), index: $OUT_DIR/manifest.jsonl"
echo "measure quality: $PY benchmarks/dalle_quality.py --dalle_path $RUN_DIR/dalle.pt"
