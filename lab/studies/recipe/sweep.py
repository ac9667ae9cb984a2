#!/usr/bin/env python
"""Calibration runs of the main job's training recipe: train with some flags, then measure what the model learned.

    python -m lab.studies.recipe.sweep --name baseline --seed 0                     # train_dalle.py's defaults
    python -m lab.studies.recipe.sweep --name lr2e-3 --seed 0 -- --learning_rate 2e-3 --text_seq_len 12
    python -m lab.studies.recipe.sweep --name ddp2 --threads 1 --processes 2 -- --batch_size 16   # global batch 32

Everything after `--` is passed to train_dalle.py unchanged. Each run writes <out>/<name>-seed<k>.json (a finished
run is skipped; --eval_only measures its checkpoint again and replaces only the "eval" part) holding the command,
the flags, the git commit (and whether the tree was dirty), the seeds, the thread count, the load average before and after, the training wall time, the last logged
losses, the held-out image loss on real validation images, and the Shapes checker's scores on generated images for
unseen captions (validation and held-out compositions) under several sampling settings. docs/training.md's
calibration table is made from these files.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lab.common import ROOT, git_state
# (name, top_k, temperature, cond_scale): generate.py's defaults first, then the alternatives being calibrated
SAMPLINGS = (("default", "default", "default", "default"), ("t1", None, 1.0, 1.0), ("t0.7_k10", 10, 0.7, 1.0),
             ("t0.7_k10_cfg2", 10, 0.7, 2.0), ("t0.7_k10_cfg3", 10, 0.7, 3.0), ("t1_k10_cfg2", 10, 1.0, 2.0))


def evaluate(checkpoint: Path, n_val: int, n_heldout: int, samplings, threads: int) -> dict:
    import torch

    from dalle_lab.data.checker import evaluate as checker_scores
    from dalle_lab.data.shapes import heldout_captions, validation_captions
    from dalle_lab.evaluate.shapes import heldout_losses
    from dalle_lab.training.checkpoint import load_dalle
    from dalle_lab.generate import GenerationConfig
    from dalle_lab.generate.folders import sample_images

    torch.set_num_threads(threads)
    dalle, tokenizer, vae = load_dalle(str(checkpoint), "cpu")
    dalle.eval()
    result = {"losses": {split: heldout_losses(dalle, vae, tokenizer, split, 512) for split in ("val", "heldout")}}
    defaults = GenerationConfig()
    for name, top_k, temperature, cond_scale in samplings:
        settings = defaults if name == "default" else GenerationConfig(top_k, None, None, temperature, cond_scale)
        scores = {"settings": vars(settings).copy()}
        for split, captions in (("val", validation_captions(n_val)), ("heldout", heldout_captions(n_heldout))):
            images = sample_images(dalle, vae, tokenizer, captions, settings, seed=0, batch_size=50)
            s = checker_scores(images, captions)
            scores[split] = {"n": len(captions), "accuracy": s["accuracy"], "exact_match": s["exact_match"],
                             "per_attribute": s["per_attribute"]}
        result[name] = scores
        print(f"  {name:14s} val acc {scores['val']['accuracy']:.3f} exact {scores['val']['exact_match']:.3f} | "
              f"heldout acc {scores['heldout']['accuracy']:.3f} exact {scores['heldout']['exact_match']:.3f}",
              flush=True)
    return result


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_flags = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="lab/studies/recipe/results/runs")
    p.add_argument("--runs_dir", default="runs/recipe")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP threads of each training process (default: the cores divided among the processes)")
    p.add_argument("--processes", type=int, default=1,
                   help="train with this many DDP processes (torchrun --standalone; pass the per-process "
                        "--batch_size after --)")
    p.add_argument("--n_val", type=int, default=300)
    p.add_argument("--n_heldout", type=int, default=200)
    p.add_argument("--eval_only", action="store_true", help="evaluate an existing run's checkpoint again")
    p.add_argument("--samplings", default=",".join(s[0] for s in SAMPLINGS),
                   help="comma-separated names of the sampling settings to score (default: all)")
    args = p.parse_args(own)
    if args.threads is None:
        args.threads = max(1, len(os.sched_getaffinity(0)) // args.processes)
    wanted = args.samplings.split(",")
    unknown = sorted(set(wanted) - {s[0] for s in SAMPLINGS})
    if unknown:
        p.error(f"unknown --samplings {unknown}: choose from {[s[0] for s in SAMPLINGS]}")
    samplings = [s for s in SAMPLINGS if s[0] in wanted]

    out = ROOT / args.out / f"{args.name}-seed{args.seed}.json"
    if out.exists() and not args.eval_only:
        print(f"{out} exists: skipped")
        return 0
    run_dir = ROOT / args.runs_dir / f"{args.name}-seed{args.seed}"
    launcher = ([sys.executable] if args.processes == 1 else
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.processes)])
    command = [*launcher, str(ROOT / "train_dalle.py"), "--output_dir", str(run_dir), "--seed", str(args.seed),
               "--no-progress", "--sample_every_n_steps", "0", *train_flags]
    record = {"script": "lab/studies/recipe/sweep.py", "argv": argv, "train_command": command[1:],
              "train_flags": train_flags, "seed": args.seed, "threads": args.threads,
              "processes": args.processes, **git_state(),
              "load_before": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if args.eval_only and out.exists():
        previous = json.loads(out.read_text())
        record = {**previous, "eval_argv": argv, "eval_commit": git_state(), "eval_load_before": os.getloadavg()}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OMP_WAIT_POLICY": "PASSIVE"}
    if not args.eval_only:
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, env=env, check=True)
        record["train_wall_s"] = time.perf_counter() - start
        record["load_after_train"] = os.getloadavg()
    metrics = [json.loads(line) for line in (run_dir / "dalle-metrics.jsonl").read_text().splitlines() if line]
    record["last_logged"] = metrics[-1]
    record["loss_curve"] = [{k: m[k] for k in ("step", "loss", "loss_text", "loss_img", "lr") if k in m}
                            for m in metrics]
    print(f"[{args.name} seed {args.seed}] trained: {record.get('train_wall_s', float('nan')):.0f} s", flush=True)
    record["eval"] = evaluate(run_dir / "dalle.pt", args.n_val, args.n_heldout, samplings,
                              args.threads * args.processes)
    record["load_after_eval"] = os.getloadavg()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
