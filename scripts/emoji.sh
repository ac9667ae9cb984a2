#!/usr/bin/env bash
# The emoji model (`make emoji`; its measurements: docs/results.md, "The emoji model"): train the DALLE transformer on the built-in Twemoji data with its
# shipped vocabulary and image tokenizer, then draw names it never saw and measure it (held-out loss, skin tone).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RUN_DIR=${RUN_DIR:-runs/emoji}
OUT_DIR=${OUT_DIR:-outputs/emoji}

"$PY" train_dalle.py --dataset emoji --dim 256 --heads 8 --text_seq_len 24 --max_steps 1500 --attn_dropout 0.1 --ff_dropout 0.1 \
    --save_every_n_steps 500 --keep_n_checkpoints 0 --output_dir "$RUN_DIR" "$@"
"$PY" generate.py --dalle_path "$RUN_DIR/dalle.pt" --outputs_dir "$OUT_DIR" --overwrite --num_images 8 \
    --text "woman firefighter medium skin tone|man raising hand medium-dark skin tone|red apple|smiling cat with heart-eyes"
"$PY" -m lab.studies.emoji.quality --dalle_path "$RUN_DIR/dalle.pt" --grid "$OUT_DIR/unseen_names.png" \
    --json "$OUT_DIR/quality.json"
echo
echo "checkpoint: $RUN_DIR/dalle.pt   generated images: $OUT_DIR/<name>/   grid: $OUT_DIR/unseen_names.png"
