"""Attention heatmaps: where the image tokens look in the caption.

For every text token, the attention each image-grid cell pays to it is drawn over the image grid (over the decoded
image when the model has a vae). Row j of the map is the query that *predicts* image token j, i.e. where the model
looked when it chose that cell (see DALLE.attention_maps). Files written:

    attention_mean.png          averaged over all layers and heads: one panel per text token; a row of raw weights
                                and a row of each cell's share of its caption attention
    attention_layer<L>.png      one row per head plus a head-average row, one column per text token

Colour scales are shared across the panels of a row, so tokens can be compared with each other; the colour bar of
each row gives the attention weight (a row of each map sums to at most 1 over BOS + the text tokens + the image).
matplotlib is imported here, not at package import.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from dalle_lab.extras import needs_extra
from dalle_lab.vae.images import decode_images

PAD_LABEL = "<pad>"


def attention_to_text(dalle, text_tokens: torch.Tensor, image_tokens: torch.Tensor) -> torch.Tensor:
    """(depth, heads, fmap, fmap, text_seq_len): attention of each image cell to each text position (BOS dropped)."""
    maps = dalle.attention_maps(text_tokens, image_tokens)  # (depth, 1, heads, N, 1 + T)
    fmap = dalle.config.image_fmap_size
    depth, _, heads, _, _ = maps.shape
    return maps[:, 0, :, :, 1:].reshape(depth, heads, fmap, fmap, -1).float().cpu()


def save_attention_maps(dalle, text_tokens: torch.Tensor, image_tokens: torch.Tensor, token_labels, out_dir,
                        include_pads: bool = False, relative: bool = False) -> list[Path]:
    """Write the heatmap PNGs for one caption and its image; return their paths.

    text_tokens (1, text_seq_len) ids (0 = pad), image_tokens (1, image_seq_len) ids (e.g. from
    generate_images(..., return_tokens=True)); token_labels: one string per non-pad text token, in order (e.g.
    `[tokenizer.decode([i]) for i in ids]`), or None for "t0", "t1", ...; out_dir is created if needed.
    Pad positions are left out unless include_pads. relative=True divides each cell's attention to the shown
    tokens by its total over them (so each cell's values sum to 1): this removes the overall fall-off with position
    (later cells spread attention over more image tokens) and shows only which word each cell attends to most.
    """
    with needs_extra("viz", "drawing attention maps"):
        from matplotlib.figure import Figure

    if text_tokens.dim() != 2 or text_tokens.shape[0] != 1 or image_tokens.dim() != 2 or image_tokens.shape[0] != 1:
        raise ValueError(f"save_attention_maps draws one caption: text_tokens (1, T) and image_tokens (1, N), got "
                         f"{tuple(text_tokens.shape)} and {tuple(image_tokens.shape)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    maps = attention_to_text(dalle, text_tokens, image_tokens)  # (depth, heads, f, f, T)
    real = (text_tokens[0] != 0).cpu()
    columns = list(range(maps.shape[-1])) if include_pads else real.nonzero().flatten().tolist()
    if not columns:
        raise ValueError("the caption has no non-pad tokens to show attention for")
    raw_mean = maps.mean(dim=(0, 1))[..., columns]  # (f, f, C)
    share_mean = raw_mean / raw_mean.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    if relative:
        shown = maps[..., columns]
        maps = maps / shown.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    n_real = int(real.sum())
    if token_labels is None:
        token_labels = [f"t{i}" for i in range(n_real)]
    if len(token_labels) != n_real:
        raise ValueError(f"token_labels has {len(token_labels)} entries but the caption has {n_real} non-pad tokens")
    label_of = dict(zip(real.nonzero().flatten().tolist(), token_labels))
    labels = [label_of.get(c, PAD_LABEL) for c in columns]
    background = _decoded_image(dalle, image_tokens)

    paths = []
    # The mean figure shows both views: the raw weights (which also fall off with position, because later cells
    # spread attention over more image tokens) and each cell's share of its caption attention (which word it
    # looked at most).
    fig = Figure(figsize=(2.0 * (len(columns) + 1), 4.8), dpi=110)
    _draw_row(fig, [raw_mean, share_mean], labels, background, row_titles=["attention weight", "share of caption"])
    fig.suptitle("image-token attention to each caption token (mean over layers and heads)")
    paths.append(_save(fig, out_dir / "attention_mean.png"))
    kind = "share of caption attention" if relative else "attention"

    for layer in range(maps.shape[0]):
        rows = [maps[layer, h][..., columns] for h in range(maps.shape[1])] + [maps[layer].mean(0)[..., columns]]
        titles = [f"head {h}" for h in range(maps.shape[1])] + ["head mean"]
        fig = Figure(figsize=(2.0 * (len(columns) + 1), 2.1 * len(rows) + 0.5), dpi=90)
        _draw_row(fig, rows, labels, background, row_titles=titles)
        fig.suptitle(f"layer {layer}: image-token {kind} to each caption token")
        paths.append(_save(fig, out_dir / f"attention_layer{layer}.png"))
    return paths


def _decoded_image(dalle, image_tokens):
    """The image as (H, W, 3) numpy in [0, 1] when the model has a vae, else None (heatmaps drawn alone)."""
    if getattr(dalle, "vae", None) is None:
        return None
    with torch.no_grad():
        image = decode_images(dalle.vae, image_tokens)[0]
    return image.clamp(0, 1).permute(1, 2, 0).float().cpu().numpy()


def _draw_row(fig, rows, labels, background, row_titles):
    """One figure row per map in rows: the image (if any), one heatmap per token, and the row's colour bar.

    Heatmaps sit over a grey version of the image, so the colour only ever means attention.
    """
    n_tokens = len(labels)
    axes = fig.subplots(len(rows), n_tokens + 2, squeeze=False,
                        gridspec_kw=dict(width_ratios=[1.0] * (n_tokens + 1) + [0.06], wspace=0.08, hspace=0.15))
    grey = None if background is None else background.mean(axis=-1)
    for r, (grid, title) in enumerate(zip(rows, row_titles)):
        vmax = float(grid.max()) or 1.0
        ax = axes[r][0]
        if background is not None:
            ax.imshow(background)
        else:
            ax.set_frame_on(False)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(title, fontsize=9)
        if r == 0:
            ax.set_title("image" if background is not None else "", fontsize=9)
        image = None
        for c, label in enumerate(labels):
            ax = axes[r][c + 1]
            heat = grid[..., c].numpy()
            if grey is not None:
                h, w = grey.shape
                ax.imshow(grey, cmap="gray", vmin=0, vmax=1, extent=(0, w, h, 0))
                image = ax.imshow(heat, cmap="inferno", alpha=0.7, vmin=0, vmax=vmax, extent=(0, w, h, 0),
                                  interpolation="nearest")
            else:
                image = ax.imshow(heat, cmap="inferno", vmin=0, vmax=vmax, interpolation="nearest")
            if r == 0:
                ax.set_title(label.strip() or repr(label), fontsize=10)
            ax.axis("off")
        colorbar = fig.colorbar(image, cax=axes[r][-1])
        colorbar.ax.tick_params(labelsize=7)


def _save(fig, path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, bbox_inches="tight")
    os.replace(tmp, path)
    return path


def caption_attention_maps(dalle, tokenizer, caption: str, out_dir, image_tokens: torch.Tensor | None = None,
                           relative: bool = False, truncate_text: bool = False, **generate_kwargs) -> list[Path]:
    """Convenience for command lines: tokenize `caption`, generate one image for it (unless image_tokens (1, N) is
    given; generate_kwargs go to generate_images, e.g. top_k, temperature, cond_scale, generator), label each
    token with tokenizer.decode, and write the heatmaps into out_dir. Returns the PNG paths."""
    device = next(dalle.parameters()).device
    text = tokenizer.tokenize([caption], dalle.config.text_seq_len, truncate_text=truncate_text).to(device)
    if image_tokens is None:
        image_tokens = dalle.generate_images(text, return_tokens=True, **generate_kwargs)
    labels = [tokenizer.decode([int(i)]) for i in text[0] if int(i) != 0]
    return save_attention_maps(dalle, text, image_tokens.to(device), labels, out_dir, relative=relative)
