"""The argument parser of train_dalle.py, generated from DALLEConfig and TrainConfig so a flag's default can never
disagree with the class default (DALLE-pytorch's could). train_dalle.py parses argv; this module only builds the
parser and turns parsed arguments into (TrainConfig, model overrides).
"""
from __future__ import annotations

import argparse
import dataclasses
import typing

from dalle_lab.flags import (CLIP_GRAD_NORM, GA_STEPS, LEARNING_RATE, MAX_STEPS, OUTPUT_DIR, PRECISION, ZERO_STAGE,
                             BooleanFlag, HelpFormatter, resume_flags, time_limit_flags)

from .config import TrainConfig
from .dallepytorch_flags import GIVES, add_train_flags, apply_train_flags
from .schedule import DECAYS

# model fields the data decides (the tokenizer's vocab, the VAE's codebook and grid): not flags with a default
DERIVED_MODEL_FIELDS = {"num_image_tokens", "image_fmap_size"}
# the older names of a field's flag, the canonical name first (dalle_lab/flags.py: one vocabulary for every CLI)
FLAG_NAMES = {"output_dir": OUTPUT_DIR, "learning_rate": LEARNING_RATE, "max_steps": MAX_STEPS,
              "clip_grad_norm": CLIP_GRAD_NORM, "ga_steps": GA_STEPS, "zero_stage": ZERO_STAGE}
# --precision WORD: the (amp, amp_dtype) it stands for
PRECISIONS = {"auto": (True, "auto"), "bf16": (True, "bf16"), "fp16": (True, "fp16"), "fp32": (False, "auto")}
# fields whose flag also takes "auto" (measured from the data before step 1, see training/sources.py)
AUTO_FIELDS = {"text_seq_len"}

HELP = {
    "dim": "model width", "depth": "transformer blocks", "heads": "attention heads", "dim_head": "width per head",
    "num_text_tokens": "text vocabulary rows (default: the tokenizer's vocab_size)",
    "text_seq_len": "text tokens per caption (default: 12, the longest Shapes caption; 24 with --dataset emoji); "
                    "auto: measured on the data's captions before step 1 (the longest, rounded up to a multiple of 8; "
                    "with --truncate_captions or --skip_long_captions the 99th percentile)",
    "loss_img_weight": "loss = (text + w * image) / (w + 1); 1 as CogView",
    "stable": "CogView PB-relax against low-precision overflow", "sandwich_norm": "LayerNorm after every branch",
    "attn_dropout": "attention dropout", "ff_dropout": "feed-forward dropout", "ff_mult": "feed-forward width factor",
    "null_cond_prob": "caption dropout probability (classifier-free guidance)",
    "attn_types": "attention type of each layer, cycled: comma-separated full|axial_row|axial_col|conv_like",
    "conv_kernel_size": "conv_like attention: window side in grid cells", "conv_dilation": "conv_like: dilation",
    "rotary_emb": "rotary position embedding on queries and keys (1-D text, 2-D image)",
    "shift_tokens": "token shift: features from the previous token and, for image tokens, the one above",
    "shared_attn_ids": "comma-separated ids cycled over the layers; equal ids share one attention module",
    "shared_ff_ids": "comma-separated ids cycled over the layers; equal ids share one feed-forward module",
    "share_input_output_emb": "tie the token embeddings with the output heads (text and image)",
    "layer_scale": "LayerScale: a learned per-feature scale on every branch output (DALLE-pytorch's, always on there)",
    "rotary_style": "dalle_lab|dallepytorch: DALLE-pytorch 1.6.6's rotary (no learned positions, values rotated too)",
    "stable_style": "dalle_lab|dallepytorch: --stable's final rescale as DALLE-pytorch's DivideMax",
    "dataset": "built-in data when no --image_text_folder: shapes|emoji (each brings its vocabulary and tokenizer)",
    "image_text_folder": "folder of images + .txt captions (or shard urls with --wds); none: built-in --dataset",
    "wds": "WebDataset image and caption keys, e.g. jpg,txt (shards given by --image_text_folder)",
    "truncate_captions": "cut captions longer than text_seq_len instead of failing before step 1",
    "skip_long_captions": "leave captions longer than text_seq_len out (reported like corrupt images)",
    "num_workers": "data loader workers (folders)",
    "caption_noise": "built-in shapes: probability that a sample's caption has one attribute changed (the image "
                     "stays true)",
    "bpe_path": "text vocabulary (.model youtokentome / .json HF tokenizers); auto: train one on the folder's "
                "captions, saved beside the checkpoint; none: the built-in --dataset's shipped one (your own data "
                "needs one)",
    "vqgan_model_path": "taming VQGAN .ckpt (with --vqgan_config_path); none: the built-in --dataset's default "
                        "tokenizer (your own data needs one: train_vae.py or python -m dalle_lab.vae.fetch)",
    "vqgan_config_path": "taming VQGAN .yaml",
    "discrete_vae_path": "a DALLE-pytorch DiscreteVAE file (its train_vae.py's .pt; --vae_path gives it too)",
    "epochs": "epochs over a folder/shards/emoji (not for the endless Shapes stream)",
    "max_steps": "stop after this many optimizer steps (also the LR decay horizon)",
    "max_minutes": "stop after this many minutes of training",
    "batch_size": "samples per process per micro-batch", "ga_steps": "gradient accumulation micro-batches per step",
    "learning_rate": "peak learning rate", "weight_decay": "AdamW weight decay",
    "clip_grad_norm": "clip the gradient norm to this (0: off)",
    "warmup_steps": "linear warm-up from 0 over this many steps",
    "lr_decay": f"after warm-up: {'|'.join(DECAYS)} (a bare --lr_decay means plateau, as DALLE-pytorch)",
    "min_lr_ratio": "cosine/linear decay ends at learning_rate * this",
    "plateau_patience": "plateau: steps without improvement before cutting the rate",
    "plateau_factor": "plateau: multiply the rate by this",
    "max_nonfinite": "stop after this many non-finite losses in a row",
    "amp": "mixed precision: bf16 on CPU, bf16 or fp16+loss scaling on CUDA", "amp_dtype": "auto|bf16|fp16",
    "device": "auto|cpu|cuda", "seed": "random seed",
    "deepspeed": "train with DeepSpeed (same as --distributed_backend deepspeed)",
    "deepspeed_config": "DeepSpeed JSON config; its settings win, flags only fill what it leaves out",
    "zero_stage": "DeepSpeed ZeRO stage (default: the config's, else 0)",
    "output_dir": "where checkpoints and sample grids go",
    "dalle_output_file_name": "checkpoint name: <output_dir>/<name>.pt (+ <name>-stepN.pt)",
    "dalle_path": "start from this checkpoint's weights (a training checkpoint is resumed exactly)",
    "resume": "continue a run exactly from this checkpoint (bare --resume: <output_dir>/<name>.pt, which is also "
              "continued without --resume when it exists)",
    "overwrite": "start a new run even though <output_dir>/<name>.pt holds one: that run's checkpoints and metrics "
                 "are deleted first",
    "save_every_n_steps": "checkpoint interval", "keep_n_checkpoints": "step checkpoints kept (0: all)",
    "sample_every_n_steps": "sample grid interval (0: never)",
    "sample_captions": "captions for the sample grids, separated by |",
    "log_every_n_steps": "console/wandb logging interval",
    "wandb_name": "log to wandb under this run name (WANDB_MODE=offline|disabled honoured)",
    "wandb_entity": "wandb entity", "wandb_project": "wandb project", "progress": "show the progress bar",
    "random_resize_crop_lower_ratio": "folders: random square crops of at least this fraction of the largest square "
                                      "(DALLE-pytorch's default was 0.75; 1: centre crop)",
    "gradient_checkpointing": "recompute each block in the backward: less memory, ~1/3 more compute, same numbers",
    "flops_profiler": "DeepSpeed's flops profiler on the run's last step (needs --deepspeed)",
}


def _base_type(annotation):
    """bool / int / float / str / list / a comma-list parser from a dataclass type hint such as `int | None`."""
    if annotation in (bool, int, float, str):
        return annotation
    if typing.get_origin(annotation) is list:
        return list
    if typing.get_origin(annotation) is tuple:  # tuple[str, ...]: DALLE-pytorch's "--attn_types full,axial_row"
        return _comma_list(typing.get_args(annotation)[0])
    for arg in typing.get_args(annotation):
        if arg is not type(None):
            return _base_type(arg)
    return str


def _int_or_auto(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {text!r}")


_int_or_auto.__name__ = "a number or auto"


def _comma_list(kind):
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(v.strip()) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}, got {text!r}")
    parse.__name__ = f"comma-separated {kind.__name__}s"
    return parse


def _add_fields(group, cls, defaults, skip=(), none_default=()):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind = _int_or_auto if f.name in AUTO_FIELDS else _base_type(hints[f.name])
        default = None if f.name in none_default else getattr(defaults, f.name)
        flags = FLAG_NAMES.get(f.name, (f"--{f.name}",))
        help_text = HELP.get(f.name, f.name.replace("_", " "))
        if kind is bool:
            group.add_argument(*flags, dest=f.name, action=BooleanFlag, default=default, help=help_text)
        else:
            group.add_argument(*flags, dest=f.name, type=kind, default=default, help=help_text)


class _Precision(argparse.Action):
    """--precision auto|fp32|bf16|fp16: --amp / --no-amp and --amp_dtype in one word (train_vae.py's flag)."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.amp, namespace.amp_dtype = PRECISIONS[values]


def build_train_parser() -> argparse.ArgumentParser:
    from dalle_lab.model import DALLEConfig

    parser = argparse.ArgumentParser(
        description="Train a DALLE text-to-image transformer. With no data flags: the built-in Shapes data, its "
                    "default image tokenizer and its shipped BPE vocabulary (--dataset emoji: the same for emoji).",
        formatter_class=HelpFormatter,
    )
    model = parser.add_argument_group("model (defaults: DALLEConfig)")
    _add_fields(model, DALLEConfig, DALLEConfig(), skip=DERIVED_MODEL_FIELDS,
                none_default={"num_text_tokens", "text_seq_len"})
    training = parser.add_argument_group("training (defaults: TrainConfig)")
    special = {"resume", "lr_decay", "sample_captions", "deepspeed", "max_minutes"}
    _add_fields(training, TrainConfig, TrainConfig(), skip=special)
    defaults = TrainConfig()
    time_limit_flags(training, "max_minutes", "minutes", defaults.max_minutes, HELP["max_minutes"])
    training.add_argument(PRECISION, choices=PRECISIONS, action=_Precision, dest="amp_dtype", default=argparse.SUPPRESS,
                          help="the same as --amp/--no-amp with --amp_dtype in one word: fp32 is --no-amp, auto|bf16|"
                               "fp16 are --amp with that --amp_dtype (default: auto, as --amp --amp_dtype auto)")
    resume_flags(training, HELP["resume"], HELP["overwrite"], nargs="?", const="latest", default=defaults.resume,
                 metavar="CHECKPOINT")
    training.add_argument("--lr_decay", nargs="?", const="plateau", choices=DECAYS, default=defaults.lr_decay,
                          help=HELP["lr_decay"])
    training.add_argument("--sample_captions", type=str, default=None,
                          help=HELP["sample_captions"] + " (default: a few validation captions of the data)")
    training.add_argument("--deepspeed", action="store_true", default=defaults.deepspeed, help=HELP["deepspeed"])
    # the deepspeed launcher passes --local_rank to every process; LOCAL_RANK in the environment says the same
    training.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    add_train_flags(parser)  # DALLE-pytorch's flags without a config field of their own
    return parser


# counts a value below which is a mistake, not a setting: (dest, smallest value, what to do instead). 0 means "off"
# only where the help says so (save/sample intervals, keep_n_checkpoints, clip_grad_norm); a zero batch would
# divide by zero in the batches, and a zero budget would write an untrained checkpoint as if it had trained.
AT_LEAST = (
    ("batch_size", 1, ""), ("ga_steps", 1, ""),
    ("epochs", 1, " (leave --epochs out to train for --max_steps)"),
    ("max_steps", 1, " (leave --max_steps out to train for --epochs or --max_minutes)"),
    ("log_every_n_steps", 1, ""), ("num_workers", 0, ""), ("warmup_steps", 0, ""),
    ("save_every_n_steps", 0, " (0: only at the end)"), ("sample_every_n_steps", 0, " (0: never)"),
    ("keep_n_checkpoints", 0, " (0: keep all)"), ("max_nonfinite", 1, ""),
    ("dim", 1, ""), ("depth", 1, ""), ("heads", 1, ""), ("dim_head", 1, ""),
    ("text_seq_len", 1, " (or auto, which measures your captions)"),
)


def check_counts(args) -> None:
    """A ValueError naming the first count flag out of range and its smallest value (a namespace or a config:
    anything with the attributes; None and "auto" are left to the data)."""
    for name, least, hint in AT_LEAST:
        value = getattr(args, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value < least:
            flag = FLAG_NAMES.get(name, (f"--{name}",))[0]
            raise ValueError(f"{flag} must be at least {least}, got {value}{hint}")


def given_flags(argv) -> set[str]:
    """The settings (dest names) a command line gives explicitly, as opposed to taking their defaults."""
    parser = build_train_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    given = set(vars(parser.parse_args(argv)))
    for flag, settings in GIVES.items():
        if flag in given:
            given.update(settings)
    return given


def epochs_end_the_run(cfg: TrainConfig, given: set[str]) -> TrainConfig:
    """--epochs without --max_steps: the epochs decide the length (as in DALLE-pytorch), not the default step budget.
    A resume takes both from its checkpoint instead (resume.settings_from_checkpoint)."""
    if "epochs" in given and "max_steps" not in given and not cfg.resume:
        return dataclasses.replace(cfg, max_steps=None)
    return cfg


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, dict]:
    """(TrainConfig, DALLEConfig overrides) from parsed arguments."""
    from dalle_lab.model import DALLEConfig

    apply_train_flags(args)  # a no-op when train_dalle.py has already done it (and printed its notes)
    values = vars(args).copy()
    model_names = {f.name for f in dataclasses.fields(DALLEConfig)} - DERIVED_MODEL_FIELDS
    overrides = {name: values.pop(name) for name in model_names if name in values}
    for name in ("num_text_tokens", "text_seq_len"):  # left out: the tokenizer's / the dataset's choice
        if overrides.get(name) is None:
            overrides.pop(name, None)
    values.pop("local_rank", None)
    values.pop("overwrite", None)  # a decision of the command line (cli/train_dalle.py), not a setting of the run
    values["deepspeed"] = bool(values.get("deepspeed"))
    captions = values.pop("sample_captions", None)
    values["sample_captions"] = [c.strip() for c in captions.split("|") if c.strip()] if captions else []
    return TrainConfig(**values), overrides
