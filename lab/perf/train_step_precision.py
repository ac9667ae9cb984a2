#!/usr/bin/env python
"""Training-step time of the default DALLE in float32 and under bf16 autocast, on this machine's CPU.

    python -m lab.perf.train_step_precision --out lab/perf/results/train_step_precision.json

Why: `--amp` (bf16 autocast) is ~40% cheaper than float32 on CPUs that compute bfloat16 natively and many times
dearer on AVX2-only CPUs, where torch emulates it; `--amp_dtype auto` and `make demo` choose by
`dalle_lab.utils.cpu_has_native_bf16()`. This measures what that choice is worth here: a synthetic batch (random
caption and image tokens) of the default DALLEConfig, AdamW, forward + backward + step, each setting in a fresh
process, the median of `--steps` steps after 2 warm-up steps. Run it on an idle machine (the file records the load).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from lab.common import ROOT, git_commit, write_results


def one_setting(dtype: str, batch: int, steps: int, threads: int) -> list[float]:
    import torch

    from dalle_lab.model import DALLE, DALLEConfig

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = DALLE(config=DALLEConfig())
    optimizer = torch.optim.AdamW(model.parameters(), 1e-3)
    cfg = model.config
    text = torch.randint(1, cfg.num_text_tokens, (batch, cfg.text_seq_len))
    image = torch.randint(0, cfg.num_image_tokens, (batch, cfg.image_seq_len))
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(text, image, return_loss=True)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return times[2:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="lab/perf/results/train_step_precision.json")
    p.add_argument("--batches", type=int, nargs="+", default=[32, 64])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", nargs=2, metavar=("DTYPE", "BATCH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(one_setting(args.worker[0], int(args.worker[1]), args.steps, args.threads)))
        return 0
    from dalle_lab.utils import cpu_has_native_bf16

    record = {"script": "lab/perf/train_step_precision.py", "argv": sys.argv[1:], "commit": git_commit(),
              "cpu_has_native_bf16": cpu_has_native_bf16(), "threads": args.threads, "steps": args.steps,
              "load_before": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "settings": []}
    for batch in args.batches:
        for dtype in ("fp32", "bf16"):
            command = [sys.executable, "-m", "lab.perf.train_step_precision", "--worker", dtype, str(batch), "--steps", str(args.steps),
                       "--threads", str(args.threads)]
            times = json.loads(subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
            median = sorted(times)[len(times) // 2]
            record["settings"].append({"dtype": dtype, "batch": batch, "step_s": times, "median_step_s": median})
            print(f"batch {batch} {dtype}: median {median:.3f} s per step", flush=True)
    record["load_after"] = os.getloadavg()
    write_results(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
