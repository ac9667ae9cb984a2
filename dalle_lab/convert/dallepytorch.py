"""DALLE-pytorch 1.x checkpoints -> a DALLEConfig and a dalle_lab state dict that compute the same function.

A checkpoint written by DALLE-pytorch's train_dalle.py is a dict: `hparams` (its DALLE's keywords; the missing ones
take 1.6.6's class defaults), `vae_params` (a DiscreteVAE's keywords, or None), `weights` (DALLE.state_dict(), the
VAE's under `vae.`), `vae_class_name`, `version`, `epoch`, and `opt_state` / `scheduler_state` (ignored here).

What each part of 1.6.6's model becomes (docs/migrating.md has the table):
- text_emb, image_emb, text_pos_emb -> the same; image_pos_emb (axial, weights_0 rows / weights_1 columns) ->
  image_row_emb / image_col_emb; with rotary_emb there are no learned positions and its rotary tables are
  recomputed (rotary_style="dallepytorch", checked against the `transformer.pos_emb` the file holds);
- each layer `transformer.layers.layers.{i}.{0 attention, 1 feed-forward}`: LayerScale(PreNorm(branch)) ->
  attn_norm / ff_norm, the branch's weights (under one `fn.` per wrapper: PreNorm, token shift's two, the cache
  wrapper), norm_out (sandwich_norm) -> attn_out_norm / ff_out_norm, scale -> attn_scale / ff_scale (layer_scale);
- to_logits = LayerNorm + one Linear over text + image ids -> final_norm + the two heads (its rows split);
- share_input_output_emb: the embeddings were slices of that Linear, so they are its rows too.
Every key of the file must be used and every weight of the model filled: anything else is an error naming the keys.
"""
from __future__ import annotations

import re

import torch

from dalle_lab.model.positional import rotary_angles

SUPPORTED_MAJOR = "1."
# The releases this layout is known from: 1.0.0 ... 1.6.6, the last DALLE-pytorch (its 1.x keeps the checkpoint
# fields, and the weights are checked key by key against 1.6.6's layout anyway)
LAST_RELEASE = (1, 6, 6)
# DALLE-pytorch 1.6.6's DALLE keywords and their class defaults (dim, depth, vae are required there)
CLASS_DEFAULTS = dict(num_text_tokens=10000, text_seq_len=256, heads=8, dim_head=64, reversible=False,
                      attn_dropout=0.0, ff_dropout=0.0, sparse_attn=False, attn_types=None, loss_img_weight=7,
                      stable=False, sandwich_norm=False, shift_tokens=True, rotary_emb=True, shared_attn_ids=None,
                      shared_ff_ids=None, share_input_output_emb=False, optimize_for_inference=False)
_REQUIRED = ("dim", "depth")
# Keywords of DALLE-pytorch's DiscreteVAE that its DALLE does not take: hparams holding these (and no `dim`) are a
# VAE file of its train_vae.py, which has the same two keys, hparams and weights, as a DALLE checkpoint
_VAE_ONLY = ("image_size", "num_tokens", "codebook_dim", "num_layers", "num_resnet_blocks", "hidden_dim")
_SUPPORTED_TYPES = ("full", "axial_row", "axial_col", "conv_like")


class ConversionError(ValueError):
    """A DALLE-pytorch file this converter cannot turn into the same model; the message names file, field, fix."""


def is_dallepytorch_checkpoint(obj) -> bool:
    return isinstance(obj, dict) and "hparams" in obj and "weights" in obj and "format" not in obj


def is_dallepytorch_vae_file(obj) -> bool:
    hparams = obj.get("hparams") if isinstance(obj, dict) else None
    return (isinstance(hparams, dict) and "vae_params" not in obj and "dim" not in hparams
            and any(name in hparams for name in _VAE_ONLY))


def notes(ckpt: dict, path) -> list[str]:
    """One-line notes on what converts but deserves a word: a version outside the known releases, a flag that did
    nothing in 1.6.6."""
    found = []
    version = ckpt.get("version")
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version) if isinstance(version, str) else None
    if version is not None and not (match and (1, 0, 0) <= tuple(map(int, match.groups())) <= LAST_RELEASE):
        found.append(f"{path}: the file says version {version!r}, not a DALLE-pytorch release (1.0.0 to 1.6.6): "
                     "converted as 1.6.6's format (its weights fit that layout)")
    hparams = ckpt["hparams"]
    if hparams.get("sparse_attn"):  # 1.6.6's Transformer zips it per layer but never reads it
        found.append(f"{path}: hparams sparse_attn={hparams['sparse_attn']!r} had no effect in DALLE-pytorch 1.6.6 "
                     "(only attn_types 'sparse' chose sparse attention): ignored")
    return found


def model_hparams(ckpt: dict, path) -> dict:
    """hparams with 1.6.6's class defaults filled in, refusing what has no same-function equivalent here."""
    version = ckpt.get("version")
    if version is not None and not str(version).startswith(SUPPORTED_MAJOR):
        raise ConversionError(f"{path}: version {version!r}: only DALLE-pytorch 1.x checkpoints (1.6.6's layout) "
                              "convert; load it in that version and save it again with its train_dalle.py")
    hparams = ckpt["hparams"]
    if not isinstance(hparams, dict):
        raise ConversionError(f"{path}: field 'hparams' is a {type(hparams).__name__}, not DALLE-pytorch's dict of "
                              "DALLE keywords: the file is damaged or not a train_dalle.py checkpoint")
    unknown = sorted(set(hparams) - set(CLASS_DEFAULTS) - set(_REQUIRED))
    if unknown:
        raise ConversionError(f"{path}: hparams {unknown} are not DALLE-pytorch 1.6.6 options (a later version?); "
                              f"known: {sorted(CLASS_DEFAULTS) + list(_REQUIRED)}")
    missing = [name for name in _REQUIRED if name not in hparams]
    if missing:
        raise ConversionError(f"{path}: hparams lacks {missing}, which DALLE-pytorch requires: the file is damaged")
    h = {**CLASS_DEFAULTS, **hparams}
    if h["reversible"]:
        raise ConversionError(f"{path}: hparams.reversible=True: reversible layers keep two residual streams (the "
                              "attention reads one, the feed-forward the other, averaged at the end), which no "
                              "dalle_lab model computes; retrain without it (--gradient_checkpointing saves memory)")
    types = (h["attn_types"],) if isinstance(h["attn_types"], str) else tuple(h["attn_types"] or ("full",))
    if "sparse" in types:  # sparse_attn alone did nothing there (notes)
        raise ConversionError(f"{path}: hparams.attn_types use 'sparse' (DeepSpeed's block-sparse "
                              "attention with random blocks), which has no mask equivalent here; retrain with full, "
                              "axial_row, axial_col or conv_like")
    bad = [t for t in types if t not in _SUPPORTED_TYPES]
    if bad:
        raise ConversionError(f"{path}: hparams.attn_types {bad} are not DALLE-pytorch 1.6.6 types "
                              f"({', '.join(_SUPPORTED_TYPES)})")
    h["attn_types"] = types
    return h


def _ids(value):
    """DALLE-pytorch's shared ids are any hashable values (train_dalle.py passes strings): renumber by first use."""
    if value is None:
        return None
    order: dict = {}
    return tuple(order.setdefault(v, len(order)) for v in value)


def config_fields(h: dict, num_image_tokens: int, image_fmap_size: int) -> dict:
    """DALLEConfig fields of the model that computes what DALLE-pytorch's DALLE(**h) computed."""
    return dict(
        dim=h["dim"], depth=h["depth"], heads=h["heads"], dim_head=h["dim_head"],
        num_text_tokens=h["num_text_tokens"], text_seq_len=h["text_seq_len"],
        num_image_tokens=num_image_tokens, image_fmap_size=image_fmap_size,
        loss_img_weight=float(h["loss_img_weight"]), stable=bool(h["stable"]), sandwich_norm=bool(h["sandwich_norm"]),
        attn_dropout=float(h["attn_dropout"]), ff_dropout=float(h["ff_dropout"]),
        ff_mult=4,  # fixed there
        null_cond_prob=0.0,  # its train_dalle.py never dropped captions
        attn_types=h["attn_types"], conv_kernel_size=5, conv_dilation=1,  # its conv_like was always 5 x 5, dilation 1
        rotary_emb=bool(h["rotary_emb"]), shift_tokens=bool(h["shift_tokens"]),
        shared_attn_ids=_ids(h["shared_attn_ids"]), shared_ff_ids=_ids(h["shared_ff_ids"]),
        share_input_output_emb=bool(h["share_input_output_emb"]),
        layer_scale=True, stable_style="dallepytorch", attention_math="dallepytorch",
    )


def rotary_style(weights: dict, h: dict) -> str:
    """DALLE-pytorch's rotary as the file stores its table of angles: a --fp16 (or bf16) run saved it rounded to
    that dtype, and DALLE-pytorch computes with the rounded angles when it loads the file (model/config.py)."""
    table = weights.get("transformer.pos_emb") if h["rotary_emb"] else None
    dtype = getattr(table, "dtype", torch.float32)
    return {torch.float16: "dallepytorch_fp16", torch.bfloat16: "dallepytorch_bf16"}.get(dtype, "dallepytorch")


def image_grid(weights: dict, h: dict, path) -> tuple[int, int]:
    """(num_image_tokens, image_fmap_size) read from the weights themselves (the head's rows; the position tables)."""
    rows = _tensor(weights, "to_logits.1.weight", path).shape[0]
    num_image_tokens = rows - h["num_text_tokens"] - h["text_seq_len"]
    if h["rotary_emb"]:
        positions = _tensor(weights, "transformer.pos_emb", path).shape[-2]
        cells = positions - h["text_seq_len"] - 1  # its rows: <bos> + the text, then the image grid
        side = round(max(cells, 0) ** 0.5)
        if cells < 1 or side * side != cells:
            raise ConversionError(f"{path}: transformer.pos_emb has {positions} positions, leaving {cells} for the "
                                  f"image after hparams text_seq_len {h['text_seq_len']} + 1, not a square grid: "
                                  "hparams text_seq_len does not match the weights; set it back to the value the "
                                  "model was trained with")
    else:
        side = _tensor(weights, "image_pos_emb.weights_0", path).shape[1]
    if num_image_tokens < 1:
        raise ConversionError(f"{path}: to_logits.1 has {rows} rows, no more than hparams num_text_tokens + "
                              f"text_seq_len ({h['num_text_tokens']} + {h['text_seq_len']}): hparams do not match")
    return num_image_tokens, side


def _tensor(weights: dict, key: str, path) -> torch.Tensor:
    if key not in weights:
        raise ConversionError(f"{path}: weights lack {key!r}, which DALLE-pytorch 1.6.6 writes for these hparams: "
                              "the file is from another version or was edited")
    return weights[key]


def _branch_keys(h: dict, i: int) -> dict[str, str]:
    """dalle_lab key -> DALLE-pytorch key for layer i's two branches (the wrappers add one `fn.` each)."""
    root = f"transformer.layers.layers.{i}"
    shift = "fn.fn." if h["shift_tokens"] else ""  # CachedAs(PreShiftToken(...))
    attn = f"{root}.0.fn.{shift}fn.fn."  # PreNorm -> [shift] -> CachedAs / NonCached -> attention
    ff = f"{root}.1.fn.{shift}fn."  # PreNorm -> [shift] -> FeedForward
    ours = f"transformer.layers.{i}"
    keys = {f"{ours}.attn.to_qkv.weight": f"{attn}to_qkv.weight",
            f"{ours}.attn.to_out.weight": f"{attn}to_out.0.weight", f"{ours}.attn.to_out.bias": f"{attn}to_out.0.bias",
            f"{ours}.ff.proj_in.weight": f"{ff}net.0.weight", f"{ours}.ff.proj_in.bias": f"{ff}net.0.bias",
            f"{ours}.ff.proj_out.weight": f"{ff}net.3.weight", f"{ours}.ff.proj_out.bias": f"{ff}net.3.bias"}
    for branch, name in ((0, "attn"), (1, "ff")):
        for p in ("weight", "bias"):
            keys[f"{ours}.{name}_norm.{p}"] = f"{root}.{branch}.fn.norm.{p}"
            if h["sandwich_norm"]:
                keys[f"{ours}.{name}_out_norm.{p}"] = f"{root}.{branch}.fn.norm_out.{p}"
        keys[f"{ours}.{name}_scale"] = f"{root}.{branch}.scale"
    return keys


def convert_weights(weights: dict, h: dict, fmap: int, path) -> tuple[dict, set]:
    """(dalle_lab state dict, the DALLE-pytorch keys used). Tensors become float32 copies."""
    dim, text_rows = h["dim"], h["num_text_tokens"] + h["text_seq_len"]
    get = lambda key: _tensor(weights, key, path).detach().to(torch.float32)  # noqa: E731
    used = set()
    state = {}
    head_w, head_b = get("to_logits.1.weight"), get("to_logits.1.bias")
    state["to_text_logits.weight"], state["to_image_logits.weight"] = head_w[:text_rows], head_w[text_rows:]
    state["to_text_logits.bias"], state["to_image_logits.bias"] = head_b[:text_rows], head_b[text_rows:]
    state["final_norm.weight"], state["final_norm.bias"] = get("to_logits.0.weight"), get("to_logits.0.bias")
    used |= {"to_logits.1.weight", "to_logits.1.bias", "to_logits.0.weight", "to_logits.0.bias"}
    if h["share_input_output_emb"]:  # SharedEmbedding: slices of to_logits.1, saved again under each embedding
        state["text_emb.weight"], state["image_emb.weight"] = state["to_text_logits.weight"], state["to_image_logits.weight"]
        for name in ("text_emb", "image_emb"):
            for p in ("weight", "bias"):
                _same(weights, f"{name}.linear.{p}", f"to_logits.1.{p}", path)
                used.add(f"{name}.linear.{p}")
    else:
        state["text_emb.weight"], state["image_emb.weight"] = get("text_emb.weight"), get("image_emb.weight")
        used |= {"text_emb.weight", "image_emb.weight"}
    if h["rotary_emb"]:
        used.add("transformer.pos_emb")  # recomputed by the model; checked against it in verify_rotary
    else:
        state["text_pos_emb.weight"] = get("text_pos_emb.weight")
        state["image_row_emb.weight"] = get("image_pos_emb.weights_0").reshape(fmap, dim)
        state["image_col_emb.weight"] = get("image_pos_emb.weights_1").reshape(fmap, dim)
        used |= {"text_pos_emb.weight", "image_pos_emb.weights_0", "image_pos_emb.weights_1"}
    for i in range(h["depth"]):
        for ours, theirs in _branch_keys(h, i).items():
            value = get(theirs)
            state[ours] = value.reshape(dim) if ours.endswith("_scale") else value
            used.add(theirs)
    return state, used


def _same(weights: dict, key: str, original: str, path) -> None:
    if not torch.equal(_tensor(weights, key, path), _tensor(weights, original, path)):
        raise ConversionError(f"{path}: {key} should hold {original} (share_input_output_emb) but differs: edited file?")


def check_all_used(weights: dict, used: set, path) -> None:
    left = sorted(k for k in weights if k not in used and not k.startswith("vae."))
    if left:
        raise ConversionError(f"{path}: weights {left[:6]}{' ...' if len(left) > 6 else ''} have no place in the "
                              "DALLE-pytorch 1.6.6 model its hparams describe: another version, or hparams edited")


def verify_rotary(weights: dict, model, path) -> None:
    """The rotary table the converted model computes must be the one the file holds (same positions, angles)."""
    saved = weights["transformer.pos_emb"].to(torch.float32)[0]  # (positions, rotated features), angles per feature
    cfg = model.config
    positions = torch.arange(saved.shape[0])
    cos, _ = rotary_angles(positions, cfg.text_seq_len + 1, cfg.image_fmap_size, cfg.dim_head, cfg.rotary_style)
    ours = cos[0, 0]  # (positions, pairs): each angle covers two features there
    if ours.shape[-1] * 2 != saved.shape[-1] or not torch.allclose(ours, saved[:, ::2].cos(), atol=1e-5):
        raise ConversionError(f"{path}: transformer.pos_emb is not DALLE-pytorch 1.6.6's rotary table for these "
                              "hparams (dim_head, text_seq_len, image grid): another version's rotary embedding")
