#!/usr/bin/env python
"""Quality of a DALLE trained on the built-in emoji data (`train_dalle.py --dataset emoji`), on names it never saw.

    python -m lab.studies.emoji.quality --dalle_path runs/emoji/dalle.pt

Two measurements on the validation split (407 names never trained on, words and all, e.g. "woman firefighter
medium skin tone" when other firefighters and other medium-skin-tone people were seen):

1. Image-token loss (nats per token) given the true name, the empty caption and a shuffled name. "true < empty"
   means the model reads the words of names it never saw; the train-split loss shows how much it memorised.
2. Skin tone: for every validation name that states one skin tone (about 160), generate images and read the tone
   off the pixels with `dalle_lab.data.emoji.classify_skin_tone` (99.6% right on the real drawings). Chance: the
   same images scored against shuffled names. Ceiling: the real drawings through the image tokenizer.

Add --json FILE to keep the numbers, --grid FILE for a picture: one row per unseen name (--grid_names), the real
drawing first, then generated samples.
"""
import argparse
import json
import random
import sys
import time


def image_loss(dalle, tokenizer, image_tokens, captions, batch_size=64) -> float:
    """Mean cross-entropy (nats) of `image_tokens` (B, image_seq_len) given `captions` (None: the empty caption)."""
    import torch.nn.functional as F

    from dalle_lab.generate.folders import tokenize_captions

    cfg, total, count = dalle.config, 0.0, 0
    for start in range(0, len(image_tokens), batch_size):
        tokens = image_tokens[start:start + batch_size]
        if captions is None:
            text = tokenize_captions(tokenizer, [""] * len(tokens), cfg.text_seq_len, cfg.num_text_tokens)
        else:
            text = tokenize_captions(tokenizer, captions[start:start + batch_size], cfg.text_seq_len,
                                     cfg.num_text_tokens, truncate=True)
        logits = dalle.logits(text, tokens)
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten(), reduction="sum"))
        count += tokens.numel()
    return total / count


# validation names (never trained on) whose words all occur in training names: unseen combinations
GRID_NAMES = ("woman firefighter medium skin tone", "man raising hand medium-dark skin tone", "red apple",
              "smiling cat with heart-eyes", "thumbs down light skin tone", "pear", "cold face",
              "person facepalming dark skin tone")


def save_sample_grid(dalle, vae, tokenizer, names, path, samples, settings, seed):
    import torch

    from dalle_lab.data.emoji import EmojiDataset
    from dalle_lab.generate.folders import sample_images
    from dalle_lab.image_grid import make_labeled_rows

    everything = EmojiDataset("all", image_size=vae.image_size)
    index = {name: i for i, name in enumerate(everything.names)}
    rows = []
    for name in names:
        generated = sample_images(dalle, vae, tokenizer, [name] * samples, settings, seed=seed)
        real = everything[index[name]][0][None] if name in index else torch.ones(1, 3, *generated.shape[-2:])
        rows.append((name, torch.cat([real, generated])))
    make_labeled_rows(rows).save(path)
    print(f"wrote {path}: per name, the real drawing, then {samples} samples")


def derangement(items, seed):
    """The items in a shuffled order with no item left in place (a caption never scores its own image)."""
    order = list(range(len(items)))
    rng = random.Random(seed)
    while any(i == j for i, j in enumerate(order)):
        rng.shuffle(order)
    return [items[j] for j in order]


def main(argv=None) -> int:
    from dalle_lab.generate import GenerationConfig

    defaults = GenerationConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dalle_path", default="runs/emoji/dalle.pt")
    p.add_argument("--images_per_name", type=int, default=2, help="generated images per skin-tone name")
    p.add_argument("--top_k", type=int, default=defaults.top_k)
    p.add_argument("--temperature", type=float, default=defaults.temperature)
    p.add_argument("--cond_scale", type=float, default=defaults.cond_scale)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--grid", default=None, help="write a PNG: per unseen name, the real drawing then samples")
    p.add_argument("--grid_names", default="|".join(GRID_NAMES), help="validation names for --grid, '|'-separated")
    p.add_argument("--grid_samples", type=int, default=7)
    args = p.parse_args(argv)

    import torch

    from dalle_lab.data.emoji import SKIN_TONES, EmojiDataset, classify_skin_tone, skin_tone_of
    from dalle_lab.training.checkpoint import load_dalle
    from dalle_lab.generate.folders import sample_images

    if args.threads:
        torch.set_num_threads(args.threads)
    dalle, tokenizer, vae = load_dalle(args.dalle_path, "cpu")
    report = {"checkpoint": args.dalle_path, "settings": vars(args)}

    with torch.no_grad():
        val = EmojiDataset("val", image_size=vae.image_size)
        val_images = torch.stack([val[i][0] for i in range(len(val))])
        names = val.names
        train = EmojiDataset("train", image_size=vae.image_size)
        train_pick = list(range(0, len(train), max(1, len(train) // len(val))))[:len(val)]
        train_images = torch.stack([train[i][0] for i in train_pick])
        val_tokens = vae.get_codebook_indices(val_images)  # encoded once: every loss and the ceiling reuse them
        losses = {
            "val_true_caption": image_loss(dalle, tokenizer, val_tokens, names),
            "val_empty_caption": image_loss(dalle, tokenizer, val_tokens, None),
            "val_shuffled_caption": image_loss(dalle, tokenizer, val_tokens, derangement(names, args.seed)),
            "train_true_caption": image_loss(dalle, tokenizer, vae.get_codebook_indices(train_images),
                                             [train.names[i] for i in train_pick]),
        }
        report["image_loss_nats_per_token"] = losses
        print(f"image-token loss, nats per token, on {len(names)} validation names never trained on:")
        print(f"  true name {losses['val_true_caption']:.3f} | empty caption {losses['val_empty_caption']:.3f} | "
              f"shuffled name {losses['val_shuffled_caption']:.3f} | (training names: "
              f"{losses['train_true_caption']:.3f})")

        toned = [(i, name) for i, name in enumerate(names) if skin_tone_of(name) is not None]
        captions = [name for _, name in toned for _ in range(args.images_per_name)]
        truth = torch.tensor([skin_tone_of(name) for name in captions])
        settings = GenerationConfig(top_k=args.top_k or None, temperature=args.temperature,
                                    cond_scale=args.cond_scale)
        start = time.perf_counter()
        generated = sample_images(dalle, vae, tokenizer, captions, settings, seed=args.seed)
        seconds = time.perf_counter() - start
        predicted = classify_skin_tone(generated)
        shuffled_truth = torch.tensor([skin_tone_of(n) for n in derangement(captions, args.seed + 1)])
        ceiling = classify_skin_tone(vae.decode(val_tokens[[i for i, _ in toned]]).float())
    tone = {
        "names": len(toned), "images": len(captions),
        "accuracy": float((predicted == truth).float().mean()),
        "shuffled_chance": float((predicted == shuffled_truth).float().mean()),
        "no_skin_found": float((predicted < 0).float().mean()),
        "tokenizer_ceiling": float((ceiling == torch.tensor([skin_tone_of(n) for _, n in toned])).float().mean()),
        "seconds": seconds,
        "per_tone": {SKIN_TONES[t]: float((predicted[truth == t] == t).float().mean()) for t in range(len(SKIN_TONES))
                     if (truth == t).any()},
    }
    report["skin_tone"] = tone
    print(f"skin tone of generated images for {tone['names']} unseen names ({tone['images']} images, "
          f"{seconds:.0f} s): accuracy {tone['accuracy']:.3f} | shuffled-name chance {tone['shuffled_chance']:.3f} | "
          f"no skin found {tone['no_skin_found']:.3f} | tokenizer ceiling {tone['tokenizer_ceiling']:.3f}")
    print("  per tone: " + ", ".join(f"{name.replace(' skin tone', '')} {acc:.2f}"
                                      for name, acc in tone["per_tone"].items()))
    if args.grid:
        with torch.no_grad():
            save_sample_grid(dalle, vae, tokenizer, [n for n in args.grid_names.split("|") if n], args.grid,
                             args.grid_samples, settings, args.seed)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
