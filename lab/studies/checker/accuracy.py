"""Accuracy of the Shapes checker on clean, degraded and caption-shuffled images.

    python -m lab.studies.checker.accuracy [--n 600] [--image_size 32] [--seed 0]
        [--vqgan_model_path M.ckpt --vqgan_config_path M.yaml]   # adds images reconstructed by that tokenizer

Targets (issue 2): clean >= 0.99, degraded >= 0.95, shuffled captions near chance (about 0.25, at most 0.35).
The degradations imitate a lossy image tokenizer: down- and up-sampling (2x at 32 px), Gaussian blur (0.6 px at
32 px; both scale with the side), pixel noise (8/255) and a global colour shift (up to 10/255), applied together.
With a VQGAN, the "reconstructed" row is the real thing: encode to tokens, decode, check (a low number there means
the tokenizer loses what the captions say).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from PIL import Image
from scipy.ndimage import gaussian_filter

from dalle_lab.data.checker import evaluate
from dalle_lab.data.shapes import ShapesDataset, describe, render, to_tensor


def degrade(image: np.ndarray, rng: np.random.Generator, factor: int = 2, blur: float = 0.6,
            noise: float = 8.0, shift: float = 10.0) -> np.ndarray:
    """Lossy-tokenizer-like damage to an (H, W, 3) uint8 image.

    factor and blur are for a 32-px image and scale with the side, so every size loses the same detail.
    """
    size = image.shape[0]
    factor = max(2, round(factor * size / 32))
    blur = blur * size / 32
    small = Image.fromarray(image).resize((size // factor, size // factor), Image.BILINEAR)
    out = np.asarray(small.resize((size, size), Image.BILINEAR), np.float32)
    out = gaussian_filter(out, sigma=(blur, blur, 0))
    out += rng.normal(0, noise, out.shape) + rng.uniform(-shift, shift, 3)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def reconstruct(images: list[np.ndarray], model_path: str, config_path: str, batch_size: int = 64) -> list:
    """Encode each image to a VQGAN's tokens and decode it back."""
    import torch

    from dalle_lab.vae import VQGanVAE

    vae = VQGanVAE(model_path, config_path)
    out = []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            batch = to_tensor(np.stack(images[start:start + batch_size]))
            out.extend(vae.decode(vae.get_codebook_indices(batch)).clamp(0, 1))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=600, help="images per condition")
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="val")
    parser.add_argument("--vqgan_model_path", help="a taming VQGAN checkpoint: also check its reconstructions")
    parser.add_argument("--vqgan_config_path", help="the checkpoint's yaml config")
    args = parser.parse_args(argv)

    dataset = ShapesDataset(args.split, args.n, image_size=args.image_size, seed=args.seed)
    scenes = [dataset.scene(i) for i in range(args.n)]
    captions = [describe(scene) for scene in scenes]
    clean = [render(scene, args.image_size) for scene in scenes]
    rng = np.random.default_rng(args.seed)
    degraded = [degrade(image, rng) for image in clean]
    shuffled = list(captions)
    rng.shuffle(shuffled)

    conditions = [("clean", clean, captions), ("degraded", degraded, captions), ("shuffled captions", clean, shuffled)]
    if args.vqgan_model_path:
        conditions.append(("reconstructed", reconstruct(clean, args.vqgan_model_path, args.vqgan_config_path), captions))

    print(f"Shapes checker, {args.n} {args.split} images of {args.image_size} px per condition")
    for name, images, texts in conditions:
        start = time.perf_counter()
        result = evaluate(images, texts)
        elapsed = time.perf_counter() - start
        per = ", ".join(f"{k} {v:.3f}" for k, v in sorted(result["per_attribute"].items()))
        print(f"{name:>18}: accuracy {result['accuracy']:.4f}  exact {result['exact_match']:.4f}  "
              f"({1000 * elapsed / args.n:.1f} ms/image)\n{'':>20}{per}")


if __name__ == "__main__":
    main()
