"""Where the sampled entropy of a model's images sits: background cells or content cells (dalle_lab/align/credit.py).

    python -m lab.studies.align.token_credit --dalle_path runs/dalle/dalle.pt

Samples `--group` images for each of `--captions` Shapes validation captions with an alignment preset's sampling
(default: the faithfulness preset's), splits the tokens into content and background cells as `--credit content`
does, and writes to lab/studies/align/results/token_credit_entropy.json the share of tokens that are background, the mean
per-token entropy of the sampling distribution on each kind, and the background's share of all sampled entropy.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

from lab.common import git_commit, write_results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dalle_path", default="runs/dalle/dalle.pt")
    parser.add_argument("--preset", default="faithfulness")
    parser.add_argument("--captions", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="lab/studies/align/results/token_credit_entropy.json")
    args = parser.parse_args(argv)

    import torch

    from dalle_lab.align.config import preset, to_dict
    from dalle_lab.align.credit import CONTENT_THRESHOLD, content_cells
    from dalle_lab.align.logprobs import policy_logprobs, sample_with_support
    from dalle_lab.align.logprobs import token_entropy
    from dalle_lab.data.shapes import validation_captions
    from dalle_lab.training.checkpoint import load_dalle

    torch.set_num_threads(args.threads)
    dalle, tokenizer, _ = load_dalle(args.dalle_path, torch.device("cpu"))
    dalle.eval()
    config = preset(args.preset)
    captions = [c for c in validation_captions(args.captions) for _ in range(args.group)]
    text = tokenizer.tokenize(captions, dalle.config.text_seq_len)
    with torch.no_grad():
        tokens, _, support = sample_with_support(dalle, text, config, torch.Generator().manual_seed(args.seed))
        processed = policy_logprobs(dalle, text, tokens, config, support)[1]
        entropy = token_entropy(processed)
        grid = int(round(tokens.shape[1] ** 0.5))
        background = ~content_cells(dalle.vae.decode(tokens), grid)
    record = {
        "command": ["python", *sys.argv], "git": git_commit(), "dalle_path": args.dalle_path,
        "dalle_sha256": hashlib.sha256(Path(args.dalle_path).read_bytes()).hexdigest(),
        "preset": args.preset, "sampling": {k: to_dict(config)[k] for k in ("temperature", "top_k", "top_p",
                                                                              "cond_scale")},
        "captions": args.captions, "group": args.group, "seed": args.seed, "threads": args.threads,
        "content_threshold": CONTENT_THRESHOLD, "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "tokens": int(entropy.numel()),
        "background_share_of_tokens": background.float().mean().item(),
        "entropy_per_token_background": entropy[background].mean().item(),
        "entropy_per_token_content": entropy[~background].mean().item(),
        "background_share_of_entropy": (entropy * background).sum().item() / entropy.sum().item(),
    }
    for key in ("background_share_of_tokens", "entropy_per_token_background", "entropy_per_token_content",
                "background_share_of_entropy"):
        print(f"{key}: {record[key]:.3f}")
    write_results(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
