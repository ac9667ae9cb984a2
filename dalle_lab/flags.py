"""One flag vocabulary for every command line (train_dalle, generate, train_vae, align, parity, the BPE trainer,
quality): one name per idea, the older names kept as aliases of the same setting, and help that shows each default.

Each tuple below lists a concept's names, the canonical one first: DALLE-pytorch's where it has one (--learning_rate,
--ga_steps, --clip_grad_norm; generate.py's --outputs_dir), otherwise the name train_dalle.py already used. A command
line passes all of a concept's names to one add_argument, so every name lands in the same setting (the same dest):
`--lr 1e-4` is `--learning_rate 1e-4`. docs/interfaces.md has the table. A leaf: argparse only.
"""
from __future__ import annotations

import argparse

OUTPUT_DIR = ("--output_dir", "--outputs_dir", "--out_dir", "--out")  # the folder a run or a report writes into
LEARNING_RATE = ("--learning_rate", "--lr")
MAX_STEPS = ("--max_steps", "--steps")
CLIP_GRAD_NORM = ("--clip_grad_norm", "--max_grad_norm")
GA_STEPS = ("--ga_steps", "--gradient_accumulation_steps")
ZERO_STAGE = ("--zero_stage", "--deepspeed_zero_stage")
# a time limit: --max_minutes, or --time_budget_s in seconds (two flags, one setting: see time_limit_flags)
MAX_MINUTES, TIME_BUDGET_S = "--max_minutes", "--time_budget_s"
# precision: DALLE-pytorch's --amp/--no-amp, and --precision auto|fp32|bf16|fp16 saying the same in one word
AMP, PRECISION = "--amp", "--precision"
# what a trainer does when its output folder holds a run: continue it (--resume), or replace it (--overwrite)
RESUME = "--resume"
OVERWRITE = ("--overwrite", "--no_resume", "--no-resume")

CONCEPTS = {"output folder": OUTPUT_DIR, "learning rate": LEARNING_RATE, "steps": MAX_STEPS,
            "gradient clipping": CLIP_GRAD_NORM, "gradient accumulation": GA_STEPS, "ZeRO stage": ZERO_STAGE,
            "start afresh": OVERWRITE}


def names(concept: tuple[str, ...], first: str | None = None) -> list[str]:
    """A concept's flag names with `first` (one of them) leading: generate.py leads with DALLE-pytorch's
    --outputs_dir, the trainers with --output_dir."""
    first = first or concept[0]
    assert first in concept, first
    return [first, *(name for name in concept if name != first)]


def shown_default(value, nargs=None) -> str:
    """A default as a user types it: none, on/off, a list as its flag takes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return (" " if nargs in ("+", "*") else ",").join(map(str, value)) or "none"
    if value == "":
        return '""'
    return str(value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default, booleans included ('(default: on)'); a required flag says so. Help
    that already names its default ('(default: the tokenizer's vocab_size)') is left as written. The description
    keeps its line breaks (the examples)."""

    def _get_help_string(self, action):
        text = (action.help or "").replace(" (default: %(default)s)", "")  # 3.11's BooleanOptionalAction adds one
        if action.required:
            return text if "required" in text else f"{text} (required)"
        if "default:" in text or "(default" in text or action.default is argparse.SUPPRESS:
            return text
        shown = shown_default(action.default, action.nargs).replace("%", "%%")  # argparse %-formats the help
        return f"{text} (default: {shown})"

    def _format_action_invocation(self, action):
        if isinstance(action, BooleanFlag):  # --x, --no-x (--no_x works too, and is not shown)
            return ", ".join(action.shown)
        if action.option_strings and action.nargs != 0:  # the aliases, then the value once: --lr, --learning_rate LR
            value = self._format_args(action, self._get_default_metavar_for_optional(action))
            return f"{', '.join(action.option_strings)} {value}"
        return super()._format_action_invocation(action)


class BooleanFlag(argparse.Action):
    """--x turns a setting on; --no-x turns it off, and so does --no_x (the vocabulary's names use underscores, and
    argparse's own --no-x form is what DALLE-pytorch users know); help and usage show --x and --no-x."""

    def __init__(self, option_strings, dest, default=None, required=False, help=None):
        self.negatives, self.shown, strings = set(), [], []
        for name in option_strings:
            strings.append(name)
            self.shown.append(name)
            if name.startswith("--"):
                negatives = [f"--no-{name[2:]}", f"--no_{name[2:]}"]
                strings += negatives
                self.shown.append(negatives[0])
                self.negatives.update(negatives)
        super().__init__(strings, dest, nargs=0, default=default, required=required, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string not in self.negatives)

    def format_usage(self) -> str:
        return " | ".join(self.shown)


def _minutes_as_seconds(text: str) -> float:
    return 60 * _positive(text)


def _seconds_as_minutes(text: str) -> float:
    return _positive(text) / 60


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


_minutes_as_seconds.__name__ = _seconds_as_minutes.__name__ = "a positive number"


def time_limit_flags(group, dest: str, unit: str, default=None, help: str = "") -> None:
    """--max_minutes M and --time_budget_s S, both setting `dest` in `unit` ("minutes" or "seconds"), so each
    command line takes the limit in either unit."""
    if unit not in ("minutes", "seconds"):
        raise ValueError(f"unit must be minutes or seconds, not {unit!r}")
    group.add_argument(MAX_MINUTES, dest=dest, default=default, metavar="MINUTES",
                       type=_minutes_as_seconds if unit == "seconds" else _positive, help=help)
    group.add_argument(TIME_BUDGET_S, dest=dest, default=default, metavar="SECONDS",
                       type=_seconds_as_minutes if unit == "minutes" else _positive,
                       help=f"the same limit in seconds ({MAX_MINUTES} x 60)")


def resume_flags(group, resume_help: str, overwrite_help: str, resume_dest="resume", overwrite_dest="overwrite",
                 **resume_kwargs) -> None:
    """--resume and --overwrite (aliases --no_resume, --no-resume): the trainers' one resume rule (docs/training.md,
    'One resume rule')."""
    if "nargs" not in resume_kwargs:
        resume_kwargs.setdefault("action", "store_true")
    group.add_argument(RESUME, dest=resume_dest, help=resume_help, **resume_kwargs)
    group.add_argument(*OVERWRITE, dest=overwrite_dest, action="store_true", help=overwrite_help)
