#!/usr/bin/env bash
# The main job (README quick start): train the DALLE transformer on the built-in Shapes data with the default
# image tokenizer and BPE vocabulary, then generate images for captions it never saw in training (two from the
# validation split, one from the held-out colour-shape compositions).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RUN_DIR=${RUN_DIR:-runs/dalle}
OUT_DIR=${OUT_DIR:-outputs}

# The recipe depends on the machine; the first line the demo prints says which it chose. Flags given to
# scripts/demo.sh are passed on to train_dalle.py and win.
# - CUDA GPUs (DEMO_GPUS, default: as many as torch sees): train_dalle.py's own 1800 steps of global batch 64 on the
#   GPUs, one process per GPU (torchrun where there are several; DEMO_PROCESSES uses fewer), under bf16 autocast
#   where the GPU computes bfloat16 natively (compute capability 8.0+), else fp16 autocast with dynamic loss
#   scaling. DEMO_GPUS=0 trains on the CPU even where a GPU is; DEMO_GPU_BF16=1 or 0 overrides the bf16 probe.
# - No GPU: the step budget fits the demo in about 10 minutes of training on 2 CPU cores. Where the processor
#   computes bfloat16 natively (avx512_bf16 / AMX) a step under bf16 autocast is ~3x cheaper than in float32, so such
#   machines train train_dalle.py's full 1800 steps; elsewhere (AVX2-only CPUs) --amp resolves to float32 and the
#   demo trains DEMO_FP32_STEPS of global batch 32 (lab/studies/recipe/results/runs/fp32_*: calibration). There it trains as
#   DEMO_PROCESSES=2 DDP processes of batch 16 (torchrun; cores/2 threads each), the same steps and sample stream:
#   on 2 idle cores 1.05x faster in the loop than one process with both threads
#   (lab/perf/results/cpu_processes_speed-20261203-1509.json; DEMO_PROCESSES=1 trains in one process).
# With several processes a --batch_size given to scripts/demo.sh is per process.
# DALLE_LAB_CPU_BF16=1 or 0 makes this script (and the package) treat the CPU as having native bf16 or not;
# DEMO_DRY_RUN=1 prints the two commands instead of running them (tests/test_cpu_kinds.py checks every recipe).
DEMO_FP32_STEPS=${DEMO_FP32_STEPS:-1000}
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # the cores this process may use (nproc alone obeys OMP_*)
launch=("$PY")
device=cpu
steps_flag=()

check_processes() {  # check_processes BATCH MOST: DEMO_PROCESSES is a whole number dividing BATCH, at most MOST
    if ! [[ $DEMO_PROCESSES =~ ^[1-9][0-9]*$ ]] || (( $1 % DEMO_PROCESSES )) || (( DEMO_PROCESSES > $2 )); then
        echo "[demo] DEMO_PROCESSES=$DEMO_PROCESSES must divide the batch of $1 and be at most $2" >&2
        exit 2
    fi
}

ddp_launch() {  # the launch command of DEMO_PROCESSES DDP processes, OMP_NUM_THREADS (else cores shared) each
    local threads=${OMP_NUM_THREADS:-$(( cores / DEMO_PROCESSES > 0 ? cores / DEMO_PROCESSES : 1 ))}
    launch=(env OMP_NUM_THREADS="$threads" "$PY" -m torch.distributed.run --standalone
            --nproc_per_node "$DEMO_PROCESSES")
}

gpus=${DEMO_GPUS:-$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")}
if ! [[ $gpus =~ ^[0-9]+$ ]]; then
    echo "[demo] DEMO_GPUS=$gpus: give the number of CUDA GPUs to train on (0: the CPU)" >&2
    exit 2
fi

if (( gpus > 0 )); then
    bf16=${DEMO_GPU_BF16:-$("$PY" -c "from dalle_lab.utils import cuda_has_native_bf16 as b; print(int(b()))")}
    if [[ $bf16 != [01] ]]; then
        echo "[demo] DEMO_GPU_BF16=$bf16: set 1 (the GPU computes bfloat16 natively) or 0, or unset it" >&2
        exit 2
    fi
    defaults=$("$PY" -c "from dalle_lab.training.config import TrainConfig as C; print(C().batch_size, C().max_steps)")
    read -r batch steps <<< "$defaults"
    most=1  # every GPU, or the most that split the batch evenly
    while (( most * 2 <= gpus && batch % (most * 2) == 0 )); do most=$(( most * 2 )); done
    DEMO_PROCESSES=${DEMO_PROCESSES:-$most}
    check_processes "$batch" "$gpus"
    if (( bf16 )); then
        dtype=bf16 how="bf16 autocast (the GPU computes bfloat16 natively)"
    else
        dtype=fp16 how="fp16 autocast with dynamic loss scaling (no native bfloat16 on this GPU)"
    fi
    echo "[demo] CUDA: training on $DEMO_PROCESSES of $gpus GPU(s), one process each, $steps steps of global batch" \
         "$batch under $how"
    device=cuda
    steps_flag=(--amp --amp_dtype "$dtype")
    if (( DEMO_PROCESSES > 1 )); then
        steps_flag+=(--batch_size $(( batch / DEMO_PROCESSES )))
        ddp_launch
    fi
elif ! "$PY" -c "import sys; from dalle_lab.utils import cpu_has_native_bf16; sys.exit(0 if cpu_has_native_bf16() else 1)"; then
    DEMO_PROCESSES=${DEMO_PROCESSES:-$(( cores >= 2 ? 2 : 1 ))}
    check_processes 32 32
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
    echo "[demo] CPU without native bfloat16: float32 training, $DEMO_FP32_STEPS steps of batch 32" \
         "in $DEMO_PROCESSES process(es) (python train_dalle.py alone trains 1800)"
    steps_flag=(--max_steps "$DEMO_FP32_STEPS" --batch_size $(( 32 / DEMO_PROCESSES )) --warmup_steps 50)
    if (( DEMO_PROCESSES > 1 )); then
        ddp_launch
    fi
else
    echo "[demo] CPU with native bfloat16: train_dalle.py's own recipe under bf16 autocast, in one process"
fi

run() {
    if [ -n "${DEMO_DRY_RUN:-}" ]; then
        echo "[demo] would run: $*"
    else
        "$@"
    fi
}
run "${launch[@]}" train_dalle.py --output_dir "$RUN_DIR" --device "$device" "${steps_flag[@]}" "$@"
run "$PY" generate.py --dalle_path "$RUN_DIR/dalle.pt" --device "$device" --outputs_dir "$OUT_DIR" --overwrite --num_images 8 \
    --text "a small green square on the left on a white background|a green square above a purple triangle on a gray background|a small blue circle at the bottom right on a black background"
if [ -n "${DEMO_DRY_RUN:-}" ]; then exit 0; fi
echo
echo "checkpoint: $RUN_DIR/dalle.pt   samples during training: $RUN_DIR/samples/"
echo "generated images: $OUT_DIR/<caption>/*.png (grid.png per caption), index: $OUT_DIR/manifest.jsonl"
echo "measure quality: $PY -m dalle_lab.quality --dalle_path $RUN_DIR/dalle.pt"
