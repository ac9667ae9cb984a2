"""DALLE-pytorch 1.6.6 command lines on dalle_lab: the flags of its train_dalle.py and generate.py that have no
same-named setting here, and what each becomes.

A user's old command line should keep working: a flag either does what it did there, or its intent here (with a
printed note saying what happens instead), or fails with one line saying why it does not apply and what to use.
The table in docs/training.md lists every flag. Flags with a same-named TrainConfig/DALLEConfig field (--epochs,
--dim, --random_resize_crop_lower_ratio, --flops_profiler, ...) need nothing here: the parser is generated from the
configs (cli.py). The attention and embedding variants (--attn_types, --rotary_emb, --shift_tokens,
--shared_attn_ids, --shared_ff_ids, --share_input_output_emb) are DALLEConfig fields of their own (issue 16 part 2).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from .tokenizer_choice import taming_without_paths, user_data


class FlagError(ValueError):
    """A DALLE-pytorch flag that cannot apply here; the message is one line naming the fix."""


# ------------------------------------------------------------------------------------------------ train_dalle.py

BACKENDS = ("deepspeed", "horovod")  # DALLE-pytorch's --distributed_backend values (matched case-insensitively)

# the settings (dest names) each translated flag gives, so a `--resume` knows the command line set them
GIVES = {"fp16": ("amp", "amp_dtype"), "stable_softmax": ("stable",), "reversible": ("gradient_checkpointing",),
         "vae_path": ("vqgan_model_path", "vqgan_config_path", "discrete_vae_path"),
         "distributed_backend": ("deepspeed",)}

_TRAIN_FLAGS = ("fp16", "stable_softmax", "reversible", "taming", "hug", "chinese", "vae_path")


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("DALLE-pytorch flags (what each becomes: docs/training.md)")
    group.add_argument("--fp16", action="store_true", help="fp16 mixed precision (--amp --amp_dtype fp16; on the CPU --amp's choice)")
    group.add_argument("--stable_softmax", action="store_true", help="the same as --stable")
    group.add_argument("--reversible", action="store_true",
                       help="memory saving: --gradient_checkpointing (reversible layers are not implemented)")
    group.add_argument("--taming", action="store_true",
                       help="accepted: the VQGAN is the only image tokenizer here; nothing downloads, so your own data "
                            "needs --vqgan_model_path/--vqgan_config_path (python -m dalle_lab.vae.fetch gets one)")
    group.add_argument("--hug", action="store_true", help="--bpe_path is a HuggingFace tokenizers JSON (checked)")
    group.add_argument("--chinese", action="store_true", help="no Chinese vocabulary ships: train one, --bpe_path")
    group.add_argument("--vae_path", default=None,
                       help="a train_vae.py VQGAN (.ckpt beside its .yaml, or its folder), or DALLE-pytorch's "
                            "DiscreteVAE .pt")
    group.add_argument("--distributed_backend", "--distr_backend", default=None, metavar="{deepspeed}",
                       help="deepspeed: train with DeepSpeed (DALLE-pytorch's flag; horovod: use torchrun)")


def apply_train_flags(args: argparse.Namespace) -> list[str]:
    """Translate the DALLE-pytorch flags in `args` (in place) into dalle_lab settings and drop them. Returns notes
    to print; raises FlagError. A second call is a no-op, so config_from_args can call it for safety."""
    notes: list[str] = []
    values = {name: vars(args).pop(name) for name in _TRAIN_FLAGS if name in vars(args)}
    backend = vars(args).pop("distributed_backend", None)
    if backend is not None:
        if backend.lower() == "horovod":
            raise FlagError("--distributed_backend horovod is not supported: launch processes with torchrun "
                            "(torchrun --nproc_per_node N train_dalle.py ...) or use --distributed_backend deepspeed")
        if backend.lower() != "deepspeed":
            raise FlagError(f"--distributed_backend {backend!r}: choose deepspeed (or launch with torchrun for "
                            "plain PyTorch DDP)")
        args.deepspeed = True
    if getattr(args, "flops_profiler", False) and not args.deepspeed:
        raise FlagError("--flops_profiler is DeepSpeed's flops profiler: add --deepspeed (or --distributed_backend "
                        "deepspeed); it profiles the run's last step (--max_steps 201: DALLE-pytorch's step 200)")
    if not values:
        return notes
    if values.get("fp16"):
        notes.append(_fp16(args))
    if values.get("stable_softmax"):
        args.stable = True
    if values.get("reversible"):
        args.gradient_checkpointing = True
        notes.append("--reversible: reversible layers are not implemented; --gradient_checkpointing is used instead: "
                     "it also trades compute for activation memory (each block is recomputed in the backward), "
                     "with the same model and numbers")
    if values.get("vae_path"):
        _vae_path(args, values["vae_path"], notes)
    if values.get("taming"):
        _taming(args, notes)
    if values.get("hug"):
        check_hug(args.bpe_path, notes)
    if values.get("chinese"):
        check_chinese(args.bpe_path, notes)
    return [n for n in notes if n]


def _taming(args, notes: list[str]) -> None:
    """--taming asked DALLE-pytorch to download the ImageNet VQGAN when no paths were given. Nothing downloads
    here: with paths it is what they name; on the user's own data without them it is an error saying how to get
    one (tokenizer_choice.py); on a built-in dataset, a resume or token shards the usual VQGAN, with a note."""
    if args.vqgan_model_path:
        notes.append("--taming: the VQGAN is dalle_lab's only image tokenizer; using --vqgan_model_path/"
                     "--vqgan_config_path")
    elif user_data(args) and not args.resume and not args.dalle_path:
        raise FlagError(taming_without_paths(args.image_text_folder))
    else:
        notes.append("--taming: the VQGAN is dalle_lab's only image tokenizer; nothing is downloaded: the "
                     "checkpoint's, the token data's or the --dataset's default VQGAN is used")


def _fp16(args) -> str:
    from dalle_lab.utils import pick_device

    if args.amp is False or args.amp_dtype not in ("auto", "fp16"):
        raise FlagError(f"--fp16 asks for fp16 mixed precision but --no-amp or --amp_dtype {args.amp_dtype} was "
                        "given too: drop one")
    args.amp = True
    if pick_device(args.device).type == "cuda":
        args.amp_dtype = "fp16"
        return ""  # exactly what was asked: fp16 autocast with dynamic loss scaling (DeepSpeed: its fp16 mode)
    # CPU: torch's fp16 autocast ran ~100x slower than bf16 here and DeepSpeed refuses fp16 on the CPU, so the CPU's
    # own --amp choice is used, with a note rather than a refusal (the intent: cheaper mixed-precision training):
    # bf16 where the processor computes it natively, float32 where bf16 would be emulated (training/precision.py)
    args.amp_dtype = "auto"
    return ("--fp16: the CPU has no fast fp16 kernels (DeepSpeed refuses fp16 there), so this run uses --amp's CPU "
            "choice (bf16 where the processor has native bf16, else float32); on a GPU --fp16 means fp16 with loss "
            "scaling")


def _vae_path(args, vae_path: str, notes: list[str]) -> None:
    """train_vae.py here writes <out_dir>/vqgan.ckpt + vqgan.yaml: --vae_path naming either is a sensible mapping.
    A DALLE-pytorch DiscreteVAE file (its train_vae.py's {"hparams", "weights"}) is used as that DiscreteVAE."""
    path = Path(vae_path)
    if args.vqgan_model_path or args.vqgan_config_path:
        raise FlagError("--vae_path and --vqgan_model_path/--vqgan_config_path both name an image tokenizer: give "
                        "only --vqgan_model_path and --vqgan_config_path")
    if path.is_file() and path.suffix == ".pt":
        args.discrete_vae_path = str(path)
        notes.append(f"--vae_path: using DALLE-pytorch's DiscreteVAE {path}")
        return
    model, config = (path / "vqgan.ckpt", path / "vqgan.yaml") if path.is_dir() else (path, path.with_suffix(".yaml"))
    if model.suffix != ".ckpt" or not model.is_file() or not config.is_file():
        raise FlagError(f"--vae_path {vae_path}: not a VQGAN (.ckpt beside its .yaml, or train_vae.py's folder) nor a "
                        "DALLE-pytorch DiscreteVAE .pt: pass --vqgan_model_path X.ckpt --vqgan_config_path X.yaml, "
                        "or the DiscreteVAE's .pt file")
    args.vqgan_model_path, args.vqgan_config_path = str(model), str(config)
    notes.append(f"--vae_path: using the VQGAN {model} with its config {config}")


def check_hug(bpe_path, notes: list[str]) -> None:
    """--hug: DALLE-pytorch read --bpe_path with HuggingFace tokenizers. Here a .json (or any JSON file) already is;
    what is left to do is refusing a file that is not one."""
    if bpe_path is None:
        notes.append("--hug without --bpe_path reads nothing (as in DALLE-pytorch): the default vocabulary is used")
        return
    from dalle_lab.tokenizers.loading import backend_for

    if Path(bpe_path).is_file() and backend_for(bpe_path) != "hf":
        raise FlagError(f"--hug: --bpe_path {bpe_path} is not a HuggingFace tokenizers JSON file: drop --hug for a "
                        "youtokentome .model, or pass the .json")


def check_chinese(bpe_path, notes: list[str]) -> None:
    if bpe_path is not None:  # DALLE-pytorch: --bpe_path wins over --chinese
        notes.append("--chinese: --bpe_path gives the vocabulary (as in DALLE-pytorch)")
        return
    raise FlagError("--chinese: no Chinese vocabulary ships with dalle_lab: train one on your captions with "
                    "python -m dalle_lab.tokenizers.train --input CAPTIONS --vocab_size 8000 --output zh.json, "
                    "then pass --bpe_path zh.json")


# ------------------------------------------------------------------------------------------------ generate.py

def parse_top_k(text: str) -> tuple[int | None, float | None]:
    """generate.py --top_k: (count, None) for an integer (0: no top-k), or (None, threshold) for DALLE-pytorch's
    float filter threshold in (0, 1) (0.9 keeps the likeliest 10% of the image vocabulary, see resolve_top_k)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if value == 0:
        return None, None
    if value >= 1 and value == int(value):
        return int(value), None
    if 0 < value < 1:
        return None, value
    raise argparse.ArgumentTypeError(
        f"{text!r}: give a count (an integer >= 1, 0 for none) or DALLE-pytorch's filter threshold in (0, 1) "
        "(0.9 keeps the likeliest 10% of image tokens)")


def add_generate_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("DALLE-pytorch flags (what each becomes: docs/training.md)")
    group.add_argument("--hug", action="store_true", help="--bpe_path is a HuggingFace tokenizers JSON (checked)")
    group.add_argument("--chinese", action="store_true", help="accepted: the checkpoint records its vocabulary")
    group.add_argument("--taming", action="store_true", help="accepted: the VQGAN is the only image tokenizer here")


def apply_generate_flags(args: argparse.Namespace) -> list[str]:
    notes: list[str] = []
    if args.hug:
        check_hug(args.bpe_path, notes)
    if args.chinese and args.bpe_path is None:
        notes.append("--chinese: the checkpoint's recorded vocabulary is used (it names the one it was trained with)")
    if args.taming:
        notes.append("--taming: the VQGAN is dalle_lab's only image tokenizer; the checkpoint's (or "
                     "--vqgan_model_path/--vqgan_config_path) is used")
    if (args.vqgan_model_path is None) != (args.vqgan_config_path is None):
        raise FlagError("give both --vqgan_model_path (.ckpt) and --vqgan_config_path (.yaml), or neither for the "
                        "image tokenizer the checkpoint recorded")
    return notes
