"""Reading a DALLE-pytorch checkpoint with its image and text tokenizers, and writing it as a dalle_lab checkpoint.

    python -m dalle_lab.convert dallepytorch dalle.pt dalle_lab.pt --bpe_path bpe_simple_vocab_16e6.txt

The transformer's weights come from the file (dallepytorch.py). The image tokenizer: a DiscreteVAE's weights are in
the file too (under `vae.`) and are written beside the output as DALLE-pytorch's VAE file (<out>.vae.pt), which the
checkpoint then records by path and hash, as it records every tokenizer; a VQGanVAE or OpenAIDiscreteVAE was loaded
from files DALLE-pytorch downloaded or was given, so their local paths must be given here. The text tokenizer is not
recorded by DALLE-pytorch at all: --bpe_path names the vocabulary it was trained with (CLIP's merges file for its
default SimpleTokenizer), and its size must equal the checkpoint's num_text_tokens.
"""
from __future__ import annotations

import os
import pickle
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from dalle_lab.model import DALLE, DALLEConfig
from dalle_lab.tokenizers.dallepytorch import SIMPLE_VOCAB_SIZE, dallepytorch_tokenizer
from dalle_lab.training.checkpoint import load_model_state, make_checkpoint, model_state_without_vae, save_checkpoint
from dalle_lab.training.errors import CheckpointError
from dalle_lab.utils import error_reason, file_sha256
from dalle_lab.vae import taming_format
from dalle_lab.vae.discrete import DiscreteVAE
from dalle_lab.vae.openai import OpenAIDiscreteVAE
from dalle_lab.vae.vqgan import VQGanVAE

from . import dallepytorch as dp
from .dallepytorch import ConversionError


@dataclass
class Sources:
    """Local files a DALLE-pytorch checkpoint needs beside it (it recorded none of them)."""

    bpe_path: str | None = None  # the text vocabulary (--bpe_path; CLIP's merges file for SimpleTokenizer)
    hug: bool = False  # --bpe_path is a HuggingFace tokenizers JSON (DALLE-pytorch's --hug)
    vqgan_model_path: str | None = None  # VQGanVAE: the taming checkpoint (.ckpt) ...
    vqgan_config_path: str | None = None  # ... and its config (.yaml)
    openai_encoder_path: str | None = None  # OpenAIDiscreteVAE: encoder.pkl ...
    openai_decoder_path: str | None = None  # ... and decoder.pkl
    trust_pickle: bool = False  # read a file that torch.load(weights_only=True) refuses (arbitrary code: trust it)


@dataclass
class Converted:
    model: object  # dalle_lab DALLE, eval mode, float32
    tokenizer: object
    vae: object
    source: dict  # what the file was: path, sha256, version, epoch
    notes: list  # one-line notes for the user (a version outside the known releases, a flag that did nothing)


def read_file(path: str | os.PathLike, trust_pickle: bool = False) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path} does not exist: pass the .pt file DALLE-pytorch's train_dalle.py wrote")
    if not _looks_like_torch_file(path):
        raise ConversionError(f"{path} is not a readable torch file: pass the .pt file DALLE-pytorch's "
                              "train_dalle.py wrote")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as err:
        reason = str(err).splitlines()[0][:120]
        raise ConversionError(f"{path} holds objects torch.load(weights_only=True) refuses ({reason}); if you "
                              "trust the file, pass --trust_pickle") from err
    except (RuntimeError, EOFError, OSError) as err:
        raise ConversionError(f"{path} is not a readable torch file ({type(err).__name__}); it may be truncated") from err
    if isinstance(ckpt, dict) and ckpt.get("format", "").startswith("dalle_lab"):
        raise ConversionError(f"{path} is already a dalle_lab checkpoint: use it directly")
    if dp.is_dallepytorch_vae_file(ckpt):
        raise ConversionError(f"{path} is a DALLE-pytorch VAE file (train_vae.py's DiscreteVAE), not a DALLE "
                              "checkpoint: convert the dalle.pt its train_dalle.py wrote (it holds this VAE too), or "
                              f"train a new DALLE on this VAE with train_dalle.py --vae_path {path}")
    if not dp.is_dallepytorch_checkpoint(ckpt):
        found = sorted(ckpt)[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ConversionError(f"{path} is neither a DALLE-pytorch train_dalle.py checkpoint (keys 'hparams', "
                              f"'vae_params', 'weights', ...) nor a dalle_lab one (found {found}); a DALLE-pytorch VAE "
                              "file (train_vae.py) is not a DALLE: pass it as the VAE, or the DALLE's own file")
    if not isinstance(ckpt["weights"], dict):
        raise ConversionError(f"{path}: field 'weights' holds no weights (a DeepSpeed auxiliary file): consolidate the "
                              "DeepSpeed checkpoint into one state dict first (DeepSpeed's zero_to_fp32.py), save it as "
                              "'weights' in this dict, and convert that")
    return ckpt


def _looks_like_torch_file(path: Path) -> bool:
    """torch.save writes a zip file, or (before torch 1.6) a pickle: anything else is junk, told apart before
    torch.load's own errors, which do not name the file."""
    with open(path, "rb") as handle:
        head = handle.read(1)
    return zipfile.is_zipfile(path) or head == b"\x80"


# What reading a user's VQGAN / OpenAI files can raise: missing files, yaml syntax, pickle and zip damage, and the
# readers' own ValueErrors; turned into one line naming the flag and file
_READ_ERRORS = (OSError, ValueError, RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError,
                yaml.YAMLError)


def load_dallepytorch(path: str | os.PathLike, sources: Sources | None = None) -> Converted:
    """The DALLE-pytorch checkpoint at `path` as a dalle_lab DALLE (with its tokenizers), computing the same function."""
    sources = sources or Sources()
    ckpt = read_file(path, sources.trust_pickle)
    h = dp.model_hparams(ckpt, path)
    notes = dp.notes(ckpt, path)
    weights = ckpt["weights"]
    tokenizer = text_tokenizer(h, sources, path)
    num_image_tokens, fmap = dp.image_grid(weights, h, path)
    vae = image_tokenizer(ckpt, sources, path)
    if (vae.num_tokens, vae.fmap_size) != (num_image_tokens, fmap):
        raise ConversionError(f"{path}: its weights predict {num_image_tokens} image tokens on a {fmap}x{fmap} grid but "
                              f"the image tokenizer given has {vae.num_tokens} on {vae.fmap_size}x{vae.fmap_size}: "
                              "pass the VAE it was trained with")
    try:
        config = DALLEConfig(**dp.config_fields(h, num_image_tokens, fmap), rotary_style=dp.rotary_style(weights, h))
    except ValueError as err:
        raise ConversionError(f"{path}: hparams have no dalle_lab equivalent: {err}") from err
    state, used = dp.convert_weights(weights, h, fmap, path)
    dp.check_all_used(weights, used, path)
    model = DALLE(vae=vae, config=config)
    try:
        load_model_state(model, state, path)
    except CheckpointError as err:  # a weight's shape does not follow from hparams: name it in DALLE-pytorch's terms
        detail = str(err).removeprefix(f"{path}: ").replace("config", "hparams")
        raise ConversionError(f"{path}: {detail}") from err
    if h["rotary_emb"]:
        dp.verify_rotary(weights, model, path)
    source = {"path": str(Path(path).resolve()), "sha256": file_sha256(path), "version": ckpt.get("version"),
              "epoch": ckpt.get("epoch"), "vae_class_name": ckpt.get("vae_class_name")}
    return Converted(model.eval(), tokenizer, vae, source, notes)


def image_tokenizer(ckpt: dict, sources: Sources, path):
    """The VAE a DALLE-pytorch checkpoint was trained with, from its weights (DiscreteVAE) or the paths given."""
    name, params, weights = ckpt.get("vae_class_name"), ckpt.get("vae_params"), ckpt["weights"]
    if name == "DiscreteVAE" or (name is None and params is not None):
        return _discrete_vae(params, weights, path)
    if name == "VQGanVAE" or (name is None and sources.vqgan_model_path):
        if not (sources.vqgan_model_path and sources.vqgan_config_path):
            raise ConversionError(f"{path}: vae_class_name VQGanVAE: pass the VQGAN it was trained with, "
                                  "--vqgan_model_path X.ckpt --vqgan_config_path X.yaml (DALLE-pytorch's default was "
                                  "the ImageNet f16 1024-code VQGAN it downloaded to ~/.cache/dalle)")
        vae = _vqgan(sources, path)
        for key in ("vae.model.quantize.embedding.weight", "vae.model.quantize.embed.weight"):
            if key in weights and not torch.equal(weights[key].float(), vae.codebook.float().cpu()):
                raise ConversionError(f"{path}: --vqgan_model_path {sources.vqgan_model_path} is not the VQGAN this "
                                      f"model was trained with (its codebook differs from the copy in {key}): pass "
                                      "the original .ckpt")
        return vae
    if name == "OpenAIDiscreteVAE" or name is None:
        if not (sources.openai_encoder_path and sources.openai_decoder_path):
            raise ConversionError(f"{path}: vae_class_name {name or 'unrecorded (OpenAIDiscreteVAE assumed)'}: pass "
                                  "OpenAI's DALL-E VAE files, --openai_encoder_path encoder.pkl --openai_decoder_path "
                                  "decoder.pkl (or --vqgan_model_path/--vqgan_config_path if it used a VQGAN)")
        return _openai_vae(sources, path)
    raise ConversionError(f"{path}: vae_class_name {name!r} is not one of DALLE-pytorch's (DiscreteVAE, VQGanVAE, "
                          "OpenAIDiscreteVAE)")


def _check_given(path, files: dict, what: str) -> None:
    """files: {flag: (file, whether it must be a torch file)}; each must exist (and be one), else one line naming it."""
    for flag, (file, torch_file) in files.items():
        if not Path(file).is_file():
            raise ConversionError(f"{path}: {flag} {file} does not exist: pass {what}")
        if torch_file and not _looks_like_torch_file(Path(file)):
            raise ConversionError(f"{path}: {flag} {file} is not a torch file (torch.save's zip or pickle): "
                                  f"pass {what}")


def _vqgan(sources: Sources, path) -> VQGanVAE:
    model_path, config_path = sources.vqgan_model_path, sources.vqgan_config_path
    what = "the taming VQGAN's .ckpt and .yaml the model was trained with"
    _check_given(path, {"--vqgan_model_path": (model_path, True), "--vqgan_config_path": (config_path, False)}, what)
    try:  # the .yaml first, so its errors name it rather than the pair
        taming_format.read_model_config(config_path)
    except _READ_ERRORS as err:
        raise ConversionError(f"{path}: --vqgan_config_path {config_path} is not a taming VQGAN config "
                              f"({error_reason(err)}): pass the .yaml published with the .ckpt") from err
    try:
        return VQGanVAE(model_path, config_path, trust_pickle=sources.trust_pickle)
    except _READ_ERRORS as err:
        raise ConversionError(f"{path}: --vqgan_model_path {model_path} does not load as the VQGAN {config_path} "
                              f"describes ({error_reason(err)}): pass {what} (--trust_pickle if it holds pickled "
                              "objects and you trust it)") from err


def _openai_vae(sources: Sources, path) -> OpenAIDiscreteVAE:
    encoder, decoder = sources.openai_encoder_path, sources.openai_decoder_path
    what = "local copies of OpenAI's DALL-E encoder.pkl and decoder.pkl"
    _check_given(path, {"--openai_encoder_path": (encoder, True), "--openai_decoder_path": (decoder, True)}, what)
    try:
        return OpenAIDiscreteVAE(encoder, decoder)
    except _READ_ERRORS as err:
        raise ConversionError(f"{path}: --openai_encoder_path {encoder} / --openai_decoder_path {decoder} do not "
                              f"load ({error_reason(err)}): pass {what}, with `pip install DALL-E` for their "
                              "classes") from err


def _discrete_vae(params, weights: dict, path):
    if not isinstance(params, dict):
        raise ConversionError(f"{path}: vae_class_name DiscreteVAE but field 'vae_params' is {params!r}: the file "
                              "lost the VAE's settings; it cannot be rebuilt")
    vae_state = {k[len("vae."):]: v.float() for k, v in weights.items() if k.startswith("vae.")}
    if not vae_state:
        raise ConversionError(f"{path}: a DiscreteVAE model whose weights have no 'vae.*' entries: the VAE's "
                              "weights are missing from the file; save the DALLE with its VAE attached")
    try:
        vae = DiscreteVAE(**params)
        vae.load_state_dict(vae_state)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ConversionError(f"{path}: vae_params {params} do not rebuild its VAE weights "
                              f"({str(err).splitlines()[0][:160]})") from err
    return vae.eval()


def text_tokenizer(h: dict, sources: Sources, path):
    n = h["num_text_tokens"]
    if sources.bpe_path is None:
        hint = (f"num_text_tokens {n} is DALLE-pytorch's default SimpleTokenizer: pass CLIP's merges file, --bpe_path "
                ".../dalle_pytorch/data/bpe_simple_vocab_16e6.txt (inside dalle-pytorch's wheel)"
                if n == SIMPLE_VOCAB_SIZE else
                f"pass the vocabulary it was trained with (num_text_tokens {n}): --bpe_path X.model (youtokentome) "
                "or --hug --bpe_path X.json")
        raise ConversionError(f"{path}: DALLE-pytorch checkpoints do not record their text tokenizer: {hint}")
    try:
        tokenizer = dallepytorch_tokenizer(sources.bpe_path, hug=sources.hug)
    except (FileNotFoundError, ValueError) as err:
        hint = ""
        if not sources.hug and Path(sources.bpe_path).suffix == ".json":  # DALLE-pytorch read these only with --hug
            hint = " (a .json vocabulary is a HuggingFace tokenizers file: add --hug)"
        raise ConversionError(f"{' '.join(str(err).split())}{hint}") from err
    if tokenizer.vocab_size != n:
        raise ConversionError(f"{path}: hparams num_text_tokens is {n} but --bpe_path {sources.bpe_path} has "
                              f"{tokenizer.vocab_size} tokens: pass the vocabulary the model was trained with")
    return tokenizer


def vae_file_for(out_path: str | os.PathLike) -> Path:
    out_path = Path(out_path)
    return out_path.with_name(out_path.stem + ".vae.pt")


def _same_file(a, b) -> bool:
    """Whether two spellings name one file: symlinks and `..` resolved, hard links compared by inode."""
    a, b = Path(a), Path(b)
    return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))


def _refuse_overwriting(in_path, target, what: str) -> None:
    if _same_file(in_path, target):
        raise ConversionError(f"{in_path}: {what} {target} is the input file itself, which converting would "
                              "overwrite: choose another output path")


def _write(save, target):
    """save(target), with an unwritable place (a missing permission, a read-only folder) as one line."""
    try:
        return save(target)
    except OSError as err:
        raise ConversionError(f"cannot write {target} ({error_reason(err)}): choose a writable output path") from err


def convert_file(in_path, out_path, sources: Sources | None = None, vae_out=None, note=None) -> Path:
    """Write the dalle_lab checkpoint of a DALLE-pytorch file (and its DiscreteVAE beside it); returns out_path.
    note: where the conversion's one-line notes go (default: stderr)."""
    _refuse_overwriting(in_path, out_path, "OUT")  # before the (slow) conversion, and before anything is written
    converted = load_dallepytorch(in_path, sources)
    for line in converted.notes:
        print(f"note: {line}", file=note or sys.stderr)
    if isinstance(converted.vae, DiscreteVAE):
        vae_path = vae_out or vae_file_for(out_path)
        _refuse_overwriting(in_path, vae_path, "the VAE file (--vae_out)")
        if _same_file(out_path, vae_path):
            raise ConversionError(f"--vae_out {vae_path} is OUT itself: the DALLE and its VAE need two files")
        _write(converted.vae.save, vae_path)
    ckpt = make_checkpoint(config=converted.model.config.to_dict(), tokenizer_identity=converted.tokenizer.identity,
                           vae_identity=converted.vae.identity, model=model_state_without_vae(converted.model),
                           converted_from={"format": "dalle-pytorch", **converted.source})
    return _write(lambda target: save_checkpoint(ckpt, target), out_path)
