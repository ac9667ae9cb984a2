"""How much of the image tokens' attention does each caption word get, per layer? (loss-weighting study, question (b))

The CogView discussion asks for a "heatmap of the attention heads" to see whether a model trained with
loss_img_weight 1 reads its caption differently from one trained with 7. `DALLE.attention_maps` gives, per layer and
head, each image query's attention to BOS and to each text position; a row of the full attention matrix sums to 1
over BOS + text + the image positions before it, so the part not on BOS or text is the image's share.

`caption_word_attention` feeds real Shapes images (teacher-forced) and, per caption and layer, averages that
attention over heads and image queries, then sums the text columns by the ROLE of the word their token belongs to in
the Shapes grammar (size, color, shape, place, ...; multi-word places like "at the top left" and relations like
"left of" are one role; articles, "on a" and the word "background" are function words). Every column lands in
exactly one of the roles, "bos", "pad" (text positions after the caption) or, implicitly, "image", so a caption's
shares sum to 1 in every layer. Role names follow the checker's attribute names (dalle_lab/data/checker.py).

A role's share is a sum over its tokens, so a place phrase (two to four words) can collect more than a one-word
colour simply by having more tokens: `tokens_per_role` is returned to read the shares with that in mind.
torch, the data module and matplotlib are imported inside the functions, so importing this module stays light.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from dalle_lab.extras import needs_extra

FUNCTION_WORDS = "function_words"
WORD_ROLES: tuple[str, ...] = ("size", "color", "shape", "place", "color1", "shape1", "relation", "color2", "shape2",
                               "background", FUNCTION_WORDS)
OTHER_COLUMNS: tuple[str, ...] = ("bos", "pad", "image")
ROWS: tuple[str, ...] = WORD_ROLES + OTHER_COLUMNS  # the fixed row order of results and plots
_ROW_INDEX = {name: i for i, name in enumerate(ROWS)}


def caption_word_roles(caption: str) -> list[tuple[str, str]]:
    """(word, role) for every word of a Shapes caption's canonical form (`describe(parse(caption))`), in order."""
    from dalle_lab.data.shapes import describe, parse

    def article(word: str) -> str:  # the grammar's "a"/"an"; the describe() check below catches any drift
        return "an" if word[0] in "aeiou" else "a"

    spec = parse(caption)
    if len(spec.objects) == 1:
        obj = spec.objects[0]
        phrases = [("a", FUNCTION_WORDS), (spec.size, "size"), (obj.color, "color"), (obj.shape, "shape"),
                   (spec.place, "place")]
    else:
        first, second = spec.objects
        phrases = [(article(first.color), FUNCTION_WORDS), (first.color, "color1"), (first.shape, "shape1"),
                   (spec.relation, "relation"), (article(second.color), FUNCTION_WORDS), (second.color, "color2"),
                   (second.shape, "shape2")]
    phrases += [("on a", FUNCTION_WORDS), (spec.background, "background"), ("background", FUNCTION_WORDS)]
    words = [(word, role) for phrase, role in phrases for word in phrase.split()]
    # built from the spec, so check it really spells the caption (guards against a grammar change in shapes.py)
    if " ".join(word for word, _ in words) != describe(spec):
        raise RuntimeError(f"caption_word_roles is out of date with the Shapes grammar for {describe(spec)!r}")
    return words


def token_word_index(tokenizer, words: list[str]) -> list[int]:
    """For each token of `tokenizer.encode(" ".join(words))`, the index of the word it belongs to.

    First by encoding each word prefix: with a whitespace-splitting BPE (yttm, HF) the prefix's tokens are a prefix of
    the caption's, and the new tokens belong to the new word. If a tokenizer merges across words so that does not
    hold, each token is given to the word the decoded text reaches when that token is added.
    """
    ids = tokenizer.encode(" ".join(words))
    owner: list[int] = []
    for k in range(1, len(words) + 1):
        prefix = tokenizer.encode(" ".join(words[:k]))
        if len(prefix) < len(owner) or prefix != ids[: len(prefix)]:
            break
        owner += [k - 1] * (len(prefix) - len(owner))
    else:
        if len(owner) == len(ids):
            return owner
    # fallback: decode growing token prefixes; a token joins the word the decoded text is in after it
    owner = [max(0, len(tokenizer.decode(ids[: j + 1]).split()) - 1) for j in range(len(ids))]
    if not owner or owner[-1] != len(words) - 1:
        raise ValueError(f"could not map the tokens of {' '.join(words)!r} to its words ({ids})")
    return owner


class CaptionColumns(NamedTuple):
    rows: list[int]  # the ROWS index of each of the 1 + text_seq_len attention columns
    canonical: str  # the caption as describe() writes it: what gets tokenized
    ids: list[int]  # its token ids
    kind: str  # "one_object" or "two_objects"


def column_rows(tokenizer, caption: str, text_seq_len: int) -> CaptionColumns:
    """Which row (role, bos or pad) each attention column of a caption adds to.

    Column 0 is BOS, column 1 + t text position t: a caption token gets its word's role, the positions after the
    caption are pads. Raises ValueError if the caption does not fit text_seq_len (no silent truncation).
    """
    words = caption_word_roles(caption)
    canonical = " ".join(word for word, _ in words)
    owner = token_word_index(tokenizer, [word for word, _ in words])
    if len(owner) > text_seq_len:
        raise ValueError(f"caption {canonical!r} has {len(owner)} tokens but text_seq_len is {text_seq_len}")
    rows = [_ROW_INDEX["bos"]] + [_ROW_INDEX[words[w][1]] for w in owner]
    rows += [_ROW_INDEX["pad"]] * (text_seq_len - len(owner))
    kind = "two_objects" if any(role == "color1" for _, role in words) else "one_object"
    return CaptionColumns(rows, canonical, tokenizer.encode(canonical), kind)


def _batch_shares(model, vae, tokenizer, images, mapped: list[CaptionColumns]):
    """For a batch: ((B, depth, rows) attention shares, (B, rows) token counts), every attention column added to
    exactly one row and "image" set to what BOS and text leave of each softmax row."""
    import torch

    device = next(model.parameters()).device
    text = tokenizer.tokenize([m.canonical for m in mapped], model.config.text_seq_len)
    for row, m in zip(text.tolist(), mapped):
        if row[: len(m.ids)] != m.ids or any(row[len(m.ids):]):  # the columns must be the tokens we mapped
            raise ValueError(f"tokenize and encode disagree on {m.canonical!r}")
    image_tokens = vae.get_codebook_indices(images.to(device))
    maps = model.attention_maps(text.to(device), image_tokens)  # (depth, B, heads, N, 1 + T)
    per_column = maps.double().mean(dim=(2, 3)).cpu().transpose(0, 1)  # (B, depth, 1 + T): mean over heads, queries
    one_hot = torch.zeros(len(mapped), per_column.shape[-1], len(ROWS), dtype=torch.float64)  # (B, 1 + T, rows)
    for b, m in enumerate(mapped):
        one_hot[b, torch.arange(len(m.rows)), torch.tensor(m.rows)] = 1.0
    shares = per_column @ one_hot  # (B, depth, rows)
    shares[..., _ROW_INDEX["image"]] = 1.0 - per_column.sum(-1)
    return shares, one_hot[:, 1:].sum(1)


def caption_word_attention(model, vae, tokenizer, split: str = "val", n: int = 200, seed: int = 0,
                           batch_size: int = 32) -> dict:
    """Share of the image queries' attention on each caption role, per layer, over the first n Shapes items of
    `split` (real images encoded by `vae.get_codebook_indices`, teacher-forced, eval mode). Returns:

        {"split", "seed", "n_captions": n, "n_layers": depth, "rows": list(ROWS),
         "layers": [{row: mean share over the captions that have this row} for each layer],
         "by_kind": {"one_object" | "two_objects": {"n_captions": int,
                       "layers": [{row: mean share} for each layer],      # rows of this kind only; sums to 1
                       "tokens_per_role": {role: mean number of tokens}}}}

    "layers" mixes both kinds, so it does not sum to 1 (color1 is averaged over two-object captions, color over
    one-object ones); the per-kind lists do. A kind with no captions is left out of "by_kind".
    """
    import torch

    from dalle_lab.data.shapes import ShapesDataset

    cfg = model.config
    dataset = ShapesDataset(split=split, length=n, image_size=vae.image_size, seed=seed)
    sums: dict = {}  # kind -> (depth, rows) tensor of summed shares
    token_sums: dict = {}  # kind -> (rows,) tensor of summed token counts per row
    counts: dict[str, int] = {}
    mapping_cache: dict[str, CaptionColumns] = {}
    was_training = model.training
    model.eval()  # no dropout, no caption dropout: the attention the trained model actually uses
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                images, captions = dataset.batch(range(start, min(n, start + batch_size)))
                mapped = [mapping_cache.setdefault(c, column_rows(tokenizer, c, cfg.text_seq_len)) for c in captions]
                for m, shares, tokens in zip(mapped, *_batch_shares(model, vae, tokenizer, images, mapped)):
                    sums[m.kind] = sums.get(m.kind, 0) + shares
                    token_sums[m.kind] = token_sums.get(m.kind, 0) + tokens
                    counts[m.kind] = counts.get(m.kind, 0) + 1
    finally:
        model.train(was_training)

    by_kind = {}
    for kind in ("one_object", "two_objects"):
        if kind not in counts:
            continue
        # the rows of this kind: a role no caption of the kind has (color1 for one object) is left out, not 0
        present = [name for name in ROWS if name in OTHER_COLUMNS or token_sums[kind][_ROW_INDEX[name]] > 0]
        mean = sums[kind] / counts[kind]
        by_kind[kind] = {
            "n_captions": counts[kind],
            "layers": [{name: float(row[_ROW_INDEX[name]]) for name in present} for row in mean],
            "tokens_per_role": {name: float(token_sums[kind][_ROW_INDEX[name]] / counts[kind])
                                for name in present if name in WORD_ROLES},
        }
    layers = []
    for layer in range(cfg.depth):
        combined = {}
        for name in ROWS:  # weighted by each kind's caption count: a plain mean over the captions with this row
            having = [(by_kind[k]["layers"][layer][name], by_kind[k]["n_captions"]) for k in by_kind
                      if name in by_kind[k]["layers"][layer]]
            if having:
                combined[name] = sum(v * c for v, c in having) / sum(c for _, c in having)
        layers.append(combined)
    return {"split": split, "seed": seed, "n_captions": n, "n_layers": cfg.depth, "rows": list(ROWS),
            "layers": layers, "by_kind": by_kind}


def plot_word_attention(results_by_setting: dict[str, dict], path) -> Path:
    """One heatmap panel per setting (e.g. {"w=1": result, "w=7": result} from caption_word_attention): rows = the
    roles in ROWS order (rows no setting has are left out), columns = layers, the share written in each cell.

    One colour scale for all panels so settings compare by colour; it is a square-root scale because the image row
    (most of the attention) would otherwise leave every word row the same dark colour.
    """
    import numpy as np

    with needs_extra("viz", "the attention-per-word figure"):
        from matplotlib.colors import PowerNorm
        from matplotlib.figure import Figure  # no pyplot: renders with Agg, never touches the global backend

    if not results_by_setting:
        raise ValueError("plot_word_attention needs at least one setting's results")
    rows = [name for name in ROWS if any(name in layer for r in results_by_setting.values() for layer in r["layers"])]
    grids = {label: np.array([[layer.get(name, np.nan) for layer in r["layers"]] for name in rows], dtype=float)
             for label, r in results_by_setting.items()}
    vmax = max(float(np.nan_to_num(g).max()) for g in grids.values()) or 1.0
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)
    n_layers = max(g.shape[1] for g in grids.values())
    fig = Figure(figsize=(1.6 + 0.75 * n_layers * len(grids) + 0.8, 0.8 + 0.38 * len(rows)), dpi=110)
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    image = None
    for ax, (label, grid) in zip(axes, grids.items()):
        image = ax.imshow(grid, cmap="viridis", norm=norm, aspect="auto")
        for i in range(len(rows)):
            for j in range(grid.shape[1]):
                value = float(grid[i, j])
                if value == value:  # not nan: this setting has the row
                    dark = norm(value) < 0.6  # viridis is dark at the low end: white text there
                    ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
        words = sum(name in WORD_ROLES for name in rows)
        ax.axhline(words - 0.5, color="white", linewidth=1.5)  # caption words above, bos / pad / image below
        ax.set_title(f"{label} (n={results_by_setting[label].get('n_captions', '?')})", fontsize=10)
        ax.set_xticks(range(grid.shape[1]), [str(layer) for layer in range(grid.shape[1])], fontsize=8)
        ax.set_xlabel("layer", fontsize=9)
        ax.set_yticks(range(len(rows)), rows if ax is axes[0] else [""] * len(rows), fontsize=8)
    colorbar = fig.colorbar(image, ax=list(axes), fraction=0.04, pad=0.02)
    colorbar.set_label("share of image-token attention (sqrt scale)", fontsize=8)
    fig.suptitle("image-token attention per caption role (mean over heads, image positions, captions)", fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")  # atomic: a reader never sees half a PNG
    fig.savefig(tmp, bbox_inches="tight")
    os.replace(tmp, path)
    return path


__all__ = ["CaptionColumns", "FUNCTION_WORDS", "OTHER_COLUMNS", "ROWS", "WORD_ROLES", "caption_word_attention",
           "caption_word_roles", "column_rows", "plot_word_attention", "token_word_index"]
