"""RL prompts where the model fails, and evaluation sets that RL never samples.

The Shapes checker scores any caption of the grammar, so RL can train on compositions that have no training image at
all: the held-out colour-shape pairs (data/shapes.py HELDOUT_PAIRS), which supervised training never saw. That is
where a model trained by maximum likelihood on the training split has room (on the demo model: held-out accuracy
about 0.80 against 0.97 on validation captions), and what verifiable-reward RL can teach that supervised training
cannot. Two protocols, each with its own evaluation set:

- taught compositions (`--prompts heldout`): RL on captions of the held-out pairs from the grammar; evaluated on
  other captions of the same pairs (the "heldout" set), which RL never samples;
- leave one pair out (`--prompts heldout --leave_out_pair "red triangle"`): RL on captions of the two other pairs
  (none mentions the left-out pair); evaluated on captions of the left-out pair (the "left_out" set), besides the
  taught pairs' own set.

Both also evaluate on validation captions (what the model already does well must not get worse). Evaluation
captions are distinct, drawn like the dataset's items (half one-object, half two-object scenes) from a fixed seed.

Screening (`screen_samples` K): keep the prompts whose exact-match rate over K samples lies in (0, 0.9); the others
give groups whose rewards mostly have no spread.
"""
from __future__ import annotations

from itertools import count
from typing import Callable, Sequence

import numpy as np
import torch

from dalle_lab.data.checker import check
from dalle_lab.data.shapes import HELDOUT_PAIRS, all_captions, describe, is_shapes_caption, parse, sample_scene

HELDOUT = "heldout"  # the --prompts value that selects the held-out-pair captions of the grammar
SCREEN_RANGE = (0.0, 0.9)  # screening keeps prompts whose exact-match rate lies strictly inside this range
_MAX_DRAWS = 200_000  # a bound on the item stream searched for distinct captions


def pair_names() -> list[str]:
    return sorted(f"{color} {shape}" for color, shape in HELDOUT_PAIRS)


def parse_pair(text: str) -> tuple[str, str]:
    """'red triangle' -> ('red', 'triangle'), one of the held-out pairs; a clear error otherwise."""
    words = tuple(text.lower().replace("_", " ").split())
    if words not in HELDOUT_PAIRS:
        raise ValueError(f"--leave_out_pair {text!r} is not a held-out colour-shape pair; choose one of "
                         f"{', '.join(repr(p) for p in pair_names())}")
    return words


def pairs_of(caption: str) -> set[tuple[str, str]]:
    """The held-out colour-shape pairs a caption mentions."""
    return {(obj.color, obj.shape) for obj in parse(caption).objects} & HELDOUT_PAIRS


def distinct_captions(split: str, n: int, keep: Callable[[str], bool] | None = None, seed: int = 0) -> list[str]:
    """The first n distinct captions of the split's item stream (ShapesDataset(split, seed=seed)) that `keep`
    accepts (fewer when the split has fewer)."""
    captions: dict[str, None] = {}
    for index in count():
        if len(captions) >= n or index >= _MAX_DRAWS:
            break
        caption = describe(sample_scene(split, index, seed))
        if keep is None or keep(caption):
            captions.setdefault(caption)
    return list(captions)


def default_eval_sets(config, rl_prompts: Sequence[str]) -> dict[str, list[str]]:
    """Without an eval prompt file: Shapes validation captions and held-out compositions when the RL prompts are
    Shapes captions (neither split is ever a training caption), less any RL prompt; otherwise no evaluation set."""
    if not rl_prompts or not all(is_shapes_caption(p) for p in rl_prompts):
        return {}
    sets = {"val": distinct_captions("val", config.eval_num_prompts)} if config.eval_num_prompts else {}
    if config.eval_num_heldout:
        sets["heldout"] = distinct_captions(HELDOUT, config.eval_num_heldout)
    # RL prompts the user chose from these splits stay RL prompts; the default sets leave them out instead
    chosen = set(rl_prompts)
    sets = {name: [p for p in prompts if p not in chosen] for name, prompts in sets.items()}
    return {name: prompts for name, prompts in sets.items() if prompts}


def heldout_protocol(config, leave_out: str | None = None) -> tuple[list[str], dict[str, list[str]]]:
    """(RL prompts, evaluation sets) of the taught-compositions protocol, or with `leave_out` ('red triangle') of
    leave-one-pair-out. The RL prompts are every held-out-pair caption of the grammar (1170) that is no evaluation
    caption, and with a left-out pair none that mentions it."""
    left_out = parse_pair(leave_out) if leave_out else None

    def taught(caption: str) -> bool:
        return left_out is None or left_out not in pairs_of(caption)

    sets = {"val": distinct_captions("val", config.eval_num_prompts)} if config.eval_num_prompts else {}
    sets["heldout"] = distinct_captions(HELDOUT, config.eval_num_heldout, taught)
    if left_out is not None:
        sets["left_out"] = distinct_captions(HELDOUT, config.eval_num_heldout, lambda c: not taught(c))
    held = {caption for captions in sets.values() for caption in captions}
    prompts = [c for c in all_captions(HELDOUT) if taught(c) and c not in held]
    return prompts, {name: captions for name, captions in sets.items() if captions}


def split_rl_prompts(rl_prompts: Sequence[str], eval_sets: dict[str, list[str]], log_fn=print) -> list[str]:
    """The RL prompt pool without any evaluation caption (so eval scores are on captions RL never sampled)."""
    held = {p for prompts in eval_sets.values() for p in prompts}
    pool = [p for p in rl_prompts if p not in held]
    dropped = len(rl_prompts) - len(pool)
    if dropped:
        log_fn(f"[align] {dropped} RL prompt(s) are evaluation captions too: left out of the RL prompts")
    if not pool:
        raise ValueError("every RL prompt is also an evaluation prompt; give --prompts and --eval_prompts that differ")
    return pool


@torch.no_grad()
def exact_match_rates(sample: Callable, prompts: Sequence[str], samples: int, batch_size: int) -> np.ndarray:
    """Per prompt, the checker's exact-match rate over `samples` images; `sample(prompts) -> images`."""
    repeated = [p for p in prompts for _ in range(samples)]
    exact = []
    for start in range(0, len(repeated), batch_size):
        batch = repeated[start:start + batch_size]
        exact += [float(check(image, caption).exact) for image, caption in zip(sample(batch), batch)]
    return np.asarray(exact).reshape(len(prompts), samples).mean(axis=1)


def screen_prompts(sample: Callable, prompts: Sequence[str], samples: int, batch_size: int,
                   log_fn=print) -> list[str]:
    """The prompts whose exact-match rate over `samples` images lies in SCREEN_RANGE (counts logged)."""
    if not all(is_shapes_caption(p) for p in prompts):
        raise ValueError("--screen_samples judges prompts by the Shapes checker's exact match: every RL prompt must "
                         "be a Shapes caption (or leave --screen_samples at 0)")
    pool = list(dict.fromkeys(prompts))
    rates = exact_match_rates(sample, pool, samples, batch_size)
    low, high = SCREEN_RANGE
    kept = [p for p, rate in zip(pool, rates) if low < rate < high]
    log_fn(f"[align] screening {len(pool)} prompts x {samples} samples: {int((rates <= low).sum())} never exact, "
           f"{int((rates >= high).sum())} exact in >= {high:.0%}, {len(kept)} kept")
    if not kept:
        raise ValueError(f"screening kept no prompt: none has an exact-match rate in ({low}, {high}) over {samples} "
                         f"samples; give other prompts or --screen_samples 0")
    return kept
