#!/usr/bin/env python
"""Memory and time of one training step of a real-scale DALLE on the CPU, with and without gradient checkpointing
and --stable (issue 16's dry run).

    python -m lab.perf.real_scale_dry_run --out lab/perf/results/real_scale/dry_run.json

The model: dim 512, depth 16, heads 16, dim_head 64, text_seq_len 256, a 32x32 grid (1024 image tokens) of an
8192-code VQGAN, 10000 text tokens, batch 2, float32, AdamW. Random caption and image tokens stand in for data
(the VQGAN is not part of the step: issue 16's token shards remove it). Each setting runs in a fresh process,
so its peak resident memory (ru_maxrss) is its own; a process that only builds the model and the optimizer gives the
baseline the step's activations add to. Time: median of --steps steps after one warm-up step.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from lab.common import ROOT, git_commit, write_results
MODEL = dict(dim=512, depth=16, heads=16, dim_head=64, text_seq_len=256, image_fmap_size=32, num_image_tokens=8192,
             num_text_tokens=10000)
SETTINGS = {"plain": dict(), "checkpointing": dict(checkpointing=True), "stable": dict(stable=True),
            "stable+checkpointing": dict(stable=True, checkpointing=True), "build_only": dict(build_only=True)}


def one_setting(name: str, batch: int, steps: int, threads: int) -> dict:
    import torch

    from dalle_lab.model import DALLE

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    options = SETTINGS[name]
    model = DALLE(**MODEL, stable=options.get("stable", False)).train()
    model.transformer.gradient_checkpointing = options.get("checkpointing", False)
    optimizer = torch.optim.AdamW(model.parameters(), 1e-4)
    cfg = model.config
    text = torch.randint(1, cfg.num_text_tokens, (batch, cfg.text_seq_len))
    image = torch.randint(0, cfg.num_image_tokens, (batch, cfg.image_seq_len))
    times, losses = [], []
    for _ in range(0 if options.get("build_only") else steps + 1):
        start = time.perf_counter()
        loss = model(text, image, return_loss=True)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"setting": name, "parameters": sum(p.numel() for p in model.parameters()), "step_s": times[1:],
            "median_step_s": sorted(times[1:])[len(times[1:]) // 2] if times[1:] else None, "losses": losses,
            "peak_rss_mib": peak_mib}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="lab/perf/results/real_scale/dry_run.json")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(one_setting(args.worker, args.batch, args.steps, args.threads)))
        return 0
    record = {"script": "lab/perf/real_scale_dry_run.py", "argv": sys.argv[1:], "commit": git_commit(), "model": MODEL,
              "batch": args.batch, "threads": args.threads, "load_before": os.getloadavg(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "results": []}
    for name in args.settings:
        command = [sys.executable, "-m", "lab.perf.real_scale_dry_run", "--worker", name, "--batch", str(args.batch), "--steps", str(args.steps),
                   "--threads", str(args.threads)]
        result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
        record["results"].append(result)
        print(f"{name:22s} peak RSS {result['peak_rss_mib']:8.0f} MiB  step {result['median_step_s'] or 0:6.2f} s",
              flush=True)
    record["load_after"] = os.getloadavg()
    write_results(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
