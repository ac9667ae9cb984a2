"""How much does summation order matter under tpu_default? The same bf16 operand rounding, summed in float32 (the
emulation, the CPU's order) and in float64 (dalle_lab.numerics.reference), on the random CLIP of the fine-tuning
experiment (lab/studies/parity/finetune_gap.py: width 256, 6 layers, patch 4, initializer_factor 32) and Shapes
validation images; beside it, the effect being measured (tpu_default against plain float32).

    python -m lab.studies.parity.sum_order            # -> lab/studies/parity/results/sum_order.{json,md}

A TPU sums in yet another order (XLA's tiling), so the float32-vs-float64 gap is the size of the disagreement to
expect between the emulation and a TPU: rounding is discontinuous, and a last-bit difference in one product can move
the next product's operand by a whole bfloat16 step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from lab.common import ROOT, git_state


def cosine_stats(a, b) -> dict:
    import torch.nn.functional as F

    cos = F.cosine_similarity(a.double(), b.double(), dim=-1)
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
            "max_abs_diff": float((a.double() - b.double()).abs().max())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n_images", type=int, default=64)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--clip_width", type=int, default=256)
    parser.add_argument("--clip_layers", type=int, default=6)
    parser.add_argument("--clip_patch", type=int, default=4)
    parser.add_argument("--init_factors", type=float, nargs="+", default=[1.0, 32.0])
    parser.add_argument("--clip_seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "lab" / "studies" / "parity" / "results" / "sum_order"))
    args = parser.parse_args(argv)

    import torch

    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.numerics import precision_mode
    from dalle_lab.numerics.reference import clip_vision_reference
    from dalle_lab.rewards.aesthetic import random_clip_vision, vit_l14_vision_config
    from dalle_lab.rewards.preprocess import clip_preprocess

    torch.set_num_threads(args.threads)
    record = {"command": " ".join(["python", "lab/studies/parity/sum_order.py", *(argv or sys.argv[1:])]),
              "args": vars(args), "git": git_state(), "torch": torch.__version__, "load_before": os.getloadavg(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": []}
    dataset = ShapesDataset("val", length=args.n_images, image_size=args.image_size, seed=0)
    images = torch.stack([dataset[i][0] for i in range(len(dataset))])
    for factor in args.init_factors:
        config = vit_l14_vision_config(hidden_size=args.clip_width, intermediate_size=4 * args.clip_width,
                                       num_hidden_layers=args.clip_layers, num_attention_heads=args.clip_width // 64,
                                       image_size=args.image_size, patch_size=args.clip_patch,
                                       initializer_factor=factor)
        vision = random_clip_vision(config, seed=args.clip_seed)
        pixels = clip_preprocess(images, args.image_size)  # the aesthetic scorer's preprocessing, in float32
        with torch.no_grad():
            fp32 = vision(pixel_values=pixels).image_embeds
            with precision_mode(vision, "tpu_default", unknown_ops="raise"):
                tpu_fp32_sums = vision(pixel_values=pixels).image_embeds
        tpu_fp64_sums = clip_vision_reference(vision, pixels)
        row = {"init_factor": factor,
               "tpu_fp32_sums_vs_tpu_fp64_sums": cosine_stats(tpu_fp32_sums, tpu_fp64_sums),
               "tpu_fp64_sums_vs_fp32": cosine_stats(tpu_fp64_sums, fp32),
               "tpu_fp32_sums_vs_fp32": cosine_stats(tpu_fp32_sums, fp32)}
        record["rows"].append(row)
        print(json.dumps(row), flush=True)
    record["load_after"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [f"# tpu_default: float32 vs float64 sums ({args.n_images} Shapes images, random CLIP width "
             f"{args.clip_width}, {args.clip_layers} layers, patch {args.clip_patch})", "",
             f"`{record['command']}` at {record['git']['commit'][:10]}, load {record['load_before']}", "",
             "| init factor | tpu (fp32 sums) vs tpu (fp64 sums): cosine mean / min | tpu (fp64 sums) vs fp32: cosine "
             "mean / min | tpu (fp32 sums) vs fp32: cosine mean / min |", "|---|---|---|---|"]
    for row in record["rows"]:
        cells = [f"{row[k]['cosine_mean']:.5f} / {row[k]['cosine_min']:.5f}" for k in
                 ("tpu_fp32_sums_vs_tpu_fp64_sums", "tpu_fp64_sums_vs_fp32", "tpu_fp32_sums_vs_fp32")]
        lines.append(f"| {row['init_factor']:g} | " + " | ".join(cells) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
