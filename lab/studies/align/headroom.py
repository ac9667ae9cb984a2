#!/usr/bin/env python
"""How much faithfulness a model's own samples already hold: the room a verifier-driven fine-tuning can work in.

    python -m lab.studies.align.headroom --dalle_path runs/dalle/dalle.pt

For `--captions` validation captions (never trained on), `--samples` images each under several sampling settings,
scored by the Shapes checker. Per setting it records:
- the mean attribute accuracy and exact match (what a user samples);
- best-of-n: the mean over captions of the best sample's accuracy (what the model can produce for that caption);
- per caption, whether the exact match rate is 0, in between, or 1; per (caption, attribute) pair, whether the
  attribute is always, sometimes or never right. "Sometimes" pairs are where reinforcement learning has a signal
  (a group of samples that differs); "never" pairs are what it cannot reach without exploring further.
Writes lab/studies/align/results/headroom.json (command, commit, model hash, threads, load, raw per-caption values).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

from lab.common import git_commit, write_results

# (name, top_k, temperature, cond_scale): generate.py's default first
SETTINGS = (("generate_default", 10, 0.7, 2.0), ("greedy_guided", 1, 1.0, 2.0), ("plain_t1", None, 1.0, 1.0),
            ("guided_t0.4", 10, 0.4, 2.0), ("guided_3", 10, 0.7, 3.0))


def attribute_outcomes(results, captions, samples) -> dict:
    """Per caption the exact-match rate and per (caption, attribute) the rate of being right, from checker results
    laid out caption-major (`samples` consecutive results per caption)."""
    import numpy as np

    per_caption, per_pair = [], []
    for c in range(len(captions)):
        mine = results[c * samples:(c + 1) * samples]
        per_caption.append(float(np.mean([r.exact for r in mine])))
        for name in mine[0].attributes:
            per_pair.append(float(np.mean([r.attributes[name] for r in mine])))
    return {"exact_rate_per_caption": per_caption, "attribute_rate_per_pair": per_pair}


def shares(rates) -> dict:
    """Fractions of rates equal to 0, strictly between, and equal to 1."""
    import numpy as np

    rates = np.asarray(rates)
    return {"never": float(np.mean(rates == 0)), "sometimes": float(np.mean((rates > 0) & (rates < 1))),
            "always": float(np.mean(rates == 1))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dalle_path", default="runs/dalle/dalle.pt")
    parser.add_argument("--captions", type=int, default=64)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="lab/studies/align/results/headroom.json")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from dalle_lab.data.checker import check
    from dalle_lab.data.shapes import validation_captions
    from dalle_lab.training.checkpoint import load_dalle

    torch.set_num_threads(args.threads)
    dalle, tokenizer, vae = load_dalle(args.dalle_path, "cpu")
    dalle.eval()
    captions = validation_captions(args.captions)
    repeated = [c for c in captions for _ in range(args.samples)]
    text = tokenizer.tokenize(repeated, dalle.config.text_seq_len)
    record = {"command": ["python", *sys.argv], "git": git_commit(), "dalle_path": args.dalle_path,
              "dalle_sha256": hashlib.sha256(Path(args.dalle_path).read_bytes()).hexdigest(),
              "captions": captions, "samples_per_caption": args.samples, "seed": args.seed, "threads": args.threads,
              "load_average_before": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "settings": {}}
    for name, top_k, temperature, cond_scale in SETTINGS:
        generator = torch.Generator().manual_seed(args.seed)
        results = []
        with torch.no_grad():
            for start in range(0, len(repeated), 256):
                tokens = dalle.generate_images(text[start:start + 256], top_k=top_k, temperature=temperature,
                                               cond_scale=cond_scale, return_tokens=True, generator=generator)
                images = vae.decode(tokens)
                results += [check(image, caption) for image, caption in zip(images, repeated[start:start + 256])]
        accuracy = np.array([r.accuracy for r in results]).reshape(len(captions), args.samples)
        outcomes = attribute_outcomes(results, captions, args.samples)
        row = {"sampling": {"top_k": top_k, "temperature": temperature, "cond_scale": cond_scale},
               "accuracy": float(accuracy.mean()), "exact_match": float(np.mean([r.exact for r in results])),
               "best_of_n_accuracy": float(accuracy.max(1).mean()),
               "captions_exact": shares(outcomes["exact_rate_per_caption"]),
               "attribute_pairs": shares(outcomes["attribute_rate_per_pair"]), **outcomes}
        record["settings"][name] = row
        print(f"{name}: accuracy {row['accuracy']:.3f}, exact {row['exact_match']:.3f}, best-of-{args.samples} "
              f"accuracy {row['best_of_n_accuracy']:.3f}; (caption, attribute) pairs always / sometimes / never "
              f"right: {row['attribute_pairs']['always']:.2f} / {row['attribute_pairs']['sometimes']:.2f} / "
              f"{row['attribute_pairs']['never']:.2f}", flush=True)
    record["load_average_after"] = os.getloadavg()
    write_results(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
