#!/usr/bin/env python
"""What the AdamW kernel costs in a training step of the reference model, and what the fused kernel saves.

    .venv/bin/python -m lab.perf.optimizer_step [--threads 1] [--rounds 5]

For each kernel of torch.optim.AdamW (the default per-parameter loop, `foreach`, `fused`), alternated round by
round in one process: CPU milliseconds of the optimizer step alone (gradients fixed), and of a whole training step
(forward, backward, step) at batch 8. Medians over rounds. dalle_lab's training loop and alignment trainer use the
fused kernel where every parameter allows it (dalle_lab.training.engine.adamw). Writes
lab/perf/results/optimizer-step-<time>.json (command, commit, threads, load average, raw per-round values).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from lab.common import git_commit, write_results
from lab.perf.backends import REFERENCE

KERNELS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def cpu_ms(fn, repeats: int) -> float:
    start = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - start) / repeats * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch

    from dalle_lab.model import DALLE

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = DALLE(**REFERENCE).train()
    params = [p for p in model.parameters() if p.requires_grad]
    text = torch.randint(1, REFERENCE["num_text_tokens"], (args.batch, REFERENCE["text_seq_len"]))
    image = torch.randint(0, REFERENCE["num_image_tokens"], (args.batch, REFERENCE["image_fmap_size"] ** 2))
    load_before = os.getloadavg()

    raw = {name: {"optimizer_step_ms": [], "train_step_ms": []} for name in KERNELS}
    for _ in range(args.rounds):
        for name, kernel in KERNELS.items():
            optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.96), **kernel)
            for p in params:
                p.grad = torch.full_like(p, 1e-3)
            optimizer.step()  # allocate the moments outside the timing
            raw[name]["optimizer_step_ms"].append(cpu_ms(optimizer.step, 20))

            def train_step():
                loss = model(text, image, return_loss=True)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            train_step()
            raw[name]["train_step_ms"].append(cpu_ms(train_step, 3))

    medians = {name: {k: statistics.median(v) for k, v in values.items()} for name, values in raw.items()}
    for name, m in medians.items():
        print(f"{name:8s} optimizer step {m['optimizer_step_ms']:7.2f} ms   training step {m['train_step_ms']:8.1f} ms")
    saved = medians["loop"]["train_step_ms"] / medians["fused"]["train_step_ms"]
    print(f"fused against loop: training step {saved:.3f}x faster")
    record = {"command": [sys.executable, *sys.argv], "git": git_commit(), "threads": args.threads,
              "batch": args.batch, "config": REFERENCE, "parameters": sum(p.numel() for p in params),
              "parameter_tensors": len(params), "torch": torch.__version__, "rounds": args.rounds,
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "median_ms": medians,
              "fused_vs_loop_train_step": saved, "raw_ms": raw}
    out = args.out or f"lab/perf/results/optimizer-step-{time.strftime('%Y%m%d-%H%M', time.gmtime())}.json"
    write_results(record, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
