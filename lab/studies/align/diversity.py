"""What the pixel-diversity fall after RL is made of: samples that stopped being wrong, or faithful samples that
became alike? (issue 34 bounds the fall of pixel diversity at 20 % of the start)

    python -m lab.studies.align.diversity --name documented --samples 8 \\
        --start /work/runs/align_study/demo.pt --runs /work/runs/align_study/documented

Every caption of a compositions results file's evaluation sets (`--compositions NAME`, default `--name`) is sampled
`--samples` times by the starting model and by each seed's aligned model (RUNS/seed*/dalle_aligned.pt), with the
evaluation's sampling and the same seeds for every model, and each image is checked. Per caption:

- `pixel_all`: mean pairwise pixel distance among all its samples (the in-run evaluation's `diversity_pixel`, with
  more samples);
- `pixel_faithful`: the same among its exact-match samples only (captions with at least two);
- `layout_faithful`: mean pairwise distance of the judged objects' centres and sides (fractions of the image side,
  L1 over x, y and side, summed over the caption's objects) among its exact-match samples: how varied the free
  attributes (where, how large within a size class) of correct images are;
- `extra_objects`: objects found beyond the caption's count (a wrong second shape, a stray bar), per image;
- `distinct`: the fraction of distinct token sequences.

Faithful measures compare start and aligned model on the captions where both have two exact samples or more. The
results file (results/diversity_<name>.json) holds every caption's values per model, the means with standard errors
over captions, and per measure each seed's relative change from the start with the 95 % t-interval across seeds.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dalle_lab.data.checker import check, matched_objects
from dalle_lab.data.shapes_grammar import parse
from dalle_lab.generate import GenerationConfig, generate
from dalle_lab.stats import mean_ci, mean_se
from dalle_lab.vae.images import decode_images
from lab.common import ROOT, git_state, write_results
from lab.studies.align.compositions import RESULTS

SEED = 9876  # sampling seed of every model (apart from the in-run evaluations' 4321)
MEASURES = ("pixel_all", "pixel_faithful", "layout_faithful", "extra_objects", "distinct", "exact")


def mean_pairwise(rows: np.ndarray) -> float | None:
    """Mean over unordered pairs of rows of their mean absolute difference (None with fewer than two rows)."""
    if len(rows) < 2:
        return None
    return float(np.mean([np.abs(a - b).mean() for a, b in itertools.combinations(rows, 2)]))


def caption_measures(caption: str, images: torch.Tensor, tokens: torch.Tensor) -> dict:
    """The module docstring's per-caption measures of one caption's samples."""
    spec = parse(caption)
    checks = [check(image, caption) for image in images]
    pixels = images.float().flatten(1).numpy()
    exact = [i for i, c in enumerate(checks) if c.exact]
    layouts = np.array([[v for obj in matched_objects(checks[i].analysis, spec) for v in (obj.x, obj.y, obj.side)]
                        for i in exact]).reshape(len(exact), 3 * len(spec.objects))
    return {
        "pixel_all": mean_pairwise(pixels),
        "pixel_faithful": mean_pairwise(pixels[exact]),
        # a mean over pairs of the L1 distance summed over coordinates (mean_pairwise averages them: times the count)
        "layout_faithful": None if len(exact) < 2 else mean_pairwise(layouts) * layouts.shape[1],
        "extra_objects": float(np.mean([max(0, len(c.analysis.objects) - len(spec.objects)) for c in checks])),
        "distinct": len({tuple(row.tolist()) for row in tokens}) / len(tokens),
        "exact": len(exact) / len(checks),
    }


@torch.no_grad()
def sample_captions(path: str, captions: list[str], samples: int, sampling: GenerationConfig, batch: int) -> list[dict]:
    from dalle_lab import load_dalle  # noqa: PLC0415 (heavy; only when measuring)
    dalle, tokenizer, vae = load_dalle(path)
    prompts = [caption for caption in captions for _ in range(samples)]
    generator = torch.Generator().manual_seed(SEED)
    tokens = []
    for start in range(0, len(prompts), batch):
        text = tokenizer.tokenize(prompts[start:start + batch], dalle.config.text_seq_len)
        tokens.append(generate(dalle, text, sampling, generator=generator)[0])
    tokens = torch.cat(tokens)
    images = decode_images(vae, tokens).float().cpu()
    return [caption_measures(c, images[i * samples:(i + 1) * samples], tokens[i * samples:(i + 1) * samples])
            for i, c in enumerate(captions)]


def summarise(start: list[dict], seeds: dict[str, list[dict]]) -> dict:
    """Per measure: the start's and each seed's mean (+- SE) over the captions both have it for, the relative change
    per seed, and its mean with the 95 % t-interval across seeds."""
    summary = {}
    for key in MEASURES:
        per_seed, changes = {}, []
        for name, rows in seeds.items():
            both = [(a[key], b[key]) for a, b in zip(start, rows) if a[key] is not None and b[key] is not None]
            before, after = mean_se([a for a, _ in both]), mean_se([b for _, b in both])
            change = after[0] / before[0] - 1 if before[0] else None
            per_seed[name] = {"captions": len(both), "start": before, "aligned": after, "relative_change": change}
            if change is not None:
                changes.append(change)
        interval = mean_ci(changes)
        summary[key] = {"per_seed": per_seed, "relative_change": {"mean": interval.mean, "ci95_half": interval.half_width,
                                                                  "n": interval.n}}
    return summary


def report(summary: dict, set_name: str) -> str:
    lines = [f"{set_name}:"]
    for key, entry in summary.items():
        seeds = ", ".join(f"{v['start'][0]:.4f} -> {v['aligned'][0]:.4f} ({v['captions']} captions)"
                          for v in entry["per_seed"].values())
        change = entry["relative_change"]
        half = "" if change["ci95_half"] is None else f" +- {change['ci95_half']:.1%}"
        lines.append(f"  {key}: {change['mean']:+.1%}{half}  [{seeds}]")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="results/diversity_<name>.json")
    parser.add_argument("--compositions", help="the compositions results file whose evaluation captions and sampling "
                        "are used (default: --name)")
    parser.add_argument("--start", required=True, help="the starting model")
    parser.add_argument("--runs", required=True, help="the directory of the seeds' runs (seed*/dalle_aligned.pt)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--sets", nargs="+", default=["heldout", "val"])
    parser.add_argument("--captions", type=int, help="only the first N captions of each set (a quick check)")
    args = parser.parse_args(argv)
    source = json.loads((RESULTS / f"{args.compositions or args.name}.json").read_text())
    s = source["eval_sampling"]
    sampling = GenerationConfig(top_k=s["top_k"], top_p=s["top_p"], temperature=s["temperature"],
                                cond_scale=s["cond_scale"])
    models = {"start": args.start} | {p.parent.name: str(p) for p in sorted(Path(args.runs).glob("seed*/dalle_aligned.pt"))}
    record = {"name": args.name, "script_argv": sys.argv, "git": git_state(ROOT), "samples": args.samples,
              "sampling_seed": SEED, "sampling": s, "models": models, "compositions": source["name"],
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "captions": {}, "per_caption": {}, "summary": {}}
    for set_name in args.sets:
        captions = source["eval_captions"][set_name][:args.captions]
        rows = {m: sample_captions(path, captions, args.samples, sampling, args.batch) for m, path in models.items()}
        start = rows.pop("start")
        record["captions"][set_name] = captions
        record["per_caption"][set_name] = {"start": start, **rows}
        record["summary"][set_name] = summarise(start, rows)
        print(report(record["summary"][set_name], set_name), flush=True)
    record["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    write_results(record, RESULTS / f"diversity_{args.name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
