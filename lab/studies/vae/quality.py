#!/usr/bin/env python
"""Quality of an image tokenizer on Shapes images: does encode -> decode keep what the captions say?

    python -m lab.studies.vae.quality                          # the default (shipped) Shapes tokenizer
    python -m lab.studies.vae.quality --ckpt runs/vae/vqgan.ckpt --yaml runs/vae/vqgan.yaml --n 1000

Prints, for the validation and held-out splits: the Shapes checker's attribute accuracy and exact match on the
reconstructions (and on the originals, the checker's own ceiling), codebook usage, tokens per image, MSE / PSNR.
Targets (issue 3): attribute accuracy >= 0.97, >= half of the codebook used, <= 256 tokens per image.
"""
import argparse
import math
import time

import torch


def measure(vae, split: str, n: int, seed: int, batch_size: int = 128) -> dict:
    from dalle_lab.data.checker import evaluate
    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.vae.codebook import usage_stats

    images, captions = ShapesDataset(split, length=n, image_size=vae.image_size, seed=seed).batch(range(n))
    recons, codes = [], []
    for chunk in images.split(batch_size):
        indices = vae.get_codebook_indices(chunk)
        codes.append(indices.flatten())
        recons.append(vae.decode(indices))
    recon = torch.cat(recons)
    mse = float(torch.mean((recon - images) ** 2))
    checked = evaluate(recon, captions)
    ceiling = evaluate(images, captions)
    usage = usage_stats(torch.bincount(torch.cat(codes), minlength=vae.num_tokens))
    return {
        "split": split, "n": n, "accuracy": checked["accuracy"], "exact": checked["exact_match"],
        "per_attribute": checked["per_attribute"],
        "originals_accuracy": ceiling["accuracy"], "originals_exact": ceiling["exact_match"],
        "mse": mse, "psnr": 10 * math.log10(1 / max(mse, 1e-12)), **usage,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", help="taming .ckpt (default: the shipped Shapes tokenizer)")
    parser.add_argument("--yaml", help="taming .yaml next to --ckpt")
    parser.add_argument("--n", type=int, default=1000, help="images per split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from dalle_lab.vae import VQGanVAE, default_vae

    vae = VQGanVAE(args.ckpt, args.yaml) if args.ckpt else default_vae()
    print(f"tokenizer: {vae.model_path} ({sum(p.numel() for p in vae.parameters()) / 1e6:.2f}M params, "
          f"{vae.num_tokens} codes, {vae.image_size}px -> {vae.fmap_size}x{vae.fmap_size} = "
          f"{vae.image_seq_len} tokens per image)")
    for split in ("val", "heldout"):
        started = time.time()
        r = measure(vae, split, args.n, args.seed)
        print(f"[{split}] n={r['n']}  checker accuracy {r['accuracy']:.4f}  exact {r['exact']:.4f}  "
              f"(originals: {r['originals_accuracy']:.4f} / {r['originals_exact']:.4f})  "
              f"mse {r['mse']:.5f}  psnr {r['psnr']:.2f} dB  codes used {r['codes_used']}/{vae.num_tokens} "
              f"({r['usage']:.1%})  perplexity {r['perplexity']:.1f}  [{time.time() - started:.1f}s]")
        print("    per attribute: " + ", ".join(f"{k} {v:.3f}" for k, v in r["per_attribute"].items()))
    print(f"tokens per image: {vae.image_seq_len}")


if __name__ == "__main__":
    main()
