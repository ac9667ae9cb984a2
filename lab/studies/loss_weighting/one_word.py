""""With loss_img_weight 1, generations match maybe just one word of the caption": the answer from the powered
two-object evaluation (two_objects.py), w=low minus w=high, two ways.

- Paired by training seed: each seed's share of an outcome (over all its images) for w=low minus the same seed's for
  w=high, with a t-interval across seeds. This is the answer about the recipe: it includes how much training runs
  differ, but with 3 seeds its t has 2 degrees of freedom (4.30 for 95 %), so it sees only large effects.
- Paired by caption: for each caption, its images' outcome under w=low minus under w=high, averaged over the seeds
  and samples, with a t-interval across captions. This holds the trained models fixed (it measures the evaluation's
  noise, not the training's), so it is narrower; it answers "do these six models differ?".

Both come with the smallest effect the design could detect (80 % power, two-sided 5 %: dalle_lab.stats
.detectable_effect).
"""
from __future__ import annotations

import math

from dalle_lab.stats import detectable_effect, mean_ci

from .config import Setting, base_config
from .two_objects import CATEGORIES, SPLITS, indicator, shares, two_object_captions


def _runs(results: list[dict], setting) -> dict[int, dict]:
    return {r["seed"]: r["eval"]["two_objects"] for r in results
            if r["setting"] == setting.name and "two_objects" in r["eval"]}


def _interval(values: list[float]) -> dict | None:
    if not values:
        return None
    interval = mean_ci(values)
    return interval.to_dict() | {"detectable": detectable_effect(interval.std, interval.n)}


def seed_paired(low: dict, high: dict, sampling: str, split: str, category: str) -> dict | None:
    """w=low minus w=high of the category's share, per training seed both ran; t-interval across seeds."""
    diffs = [shares(low[s][sampling][split]["outcomes"])[category]
             - shares(high[s][sampling][split]["outcomes"])[category] for s in sorted(set(low) & set(high))]
    out = _interval(diffs)
    return None if out is None else out | {"values": diffs}


def caption_paired(low: dict, high: dict, sampling: str, split: str, category: str, seed: int) -> dict | None:
    """Per caption (items of the same caption text grouped), the mean over seeds and samples of the category's
    indicator under w=low minus under w=high; t-interval across captions."""
    seeds = sorted(set(low) & set(high))
    if not seeds:
        return None
    n_items = low[seeds[0]][sampling][split]["n_items"]
    captions = two_object_captions(split, n_items, seed)
    by_caption: dict[str, list[float]] = {}
    for item, caption in enumerate(captions):
        diffs = [indicator(run_low[item], category) - indicator(run_high[item], category)
                 for s in seeds
                 for run_low, run_high in zip(low[s][sampling][split]["outcomes"],
                                              high[s][sampling][split]["outcomes"])]
        by_caption.setdefault(caption, []).extend(diffs)
    out = _interval([sum(v) / len(v) for v in by_caption.values()])
    return None if out is None else out | {"n_items": n_items, "n_captions": len(by_caption)}


def setting_shares(runs: dict, sampling: str, split: str) -> dict:
    """Mean and interval across seeds of each category's share for one setting."""
    per_seed = [shares(runs[s][sampling][split]["outcomes"]) for s in sorted(runs)]
    return {category: mean_ci([p[category] for p in per_seed]).to_dict() for category in CATEGORIES} if per_seed \
        else {}


def powered_one_word(config, results: list[dict]) -> dict | None:
    """The claim's answer at every sampling and split of the two-object evaluation; None when it did not run."""
    if config.objects is None:
        return None
    t = config.text_seq_lens[0]
    low, high = Setting(min(config.loss_img_weights), t), Setting(max(config.loss_img_weights), t)
    runs_low, runs_high = _runs(results, low), _runs(results, high)
    out = {"a": low.label, "b": high.label, "seeds": sorted(set(runs_low) & set(runs_high)),
           "evaluation": config.objects.to_dict(), "by_sampling": {}}
    if not out["seeds"]:
        return out
    for sampling in config.objects.samplings:
        out["by_sampling"][sampling] = {split: {
            "shares": {low.label: setting_shares(runs_low, sampling, split),
                       high.label: setting_shares(runs_high, sampling, split)},
            "seed_paired": {c: seed_paired(runs_low, runs_high, sampling, split, c) for c in CATEGORIES},
            "caption_paired": {c: caption_paired(runs_low, runs_high, sampling, split, c, config.objects.seed)
                               for c in CATEGORIES}} for split in SPLITS}
    return out


# ------------------------------------------------------------------------------------------------ words

def _ci(entry: dict | None) -> str:
    if entry is None:
        return "-"
    mean, half = entry["mean"], entry["half_width"]
    if half is None or not math.isfinite(half):
        return f"{mean:+.3f}"
    return f"{mean:+.3f} ({mean - half:+.3f} to {mean + half:+.3f})"


def _mde(entry: dict | None) -> str:
    return "-" if entry is None or not math.isfinite(entry.get("detectable") or math.nan) else \
        f"{entry['detectable']:.3f}"


def excludes_zero(entry: dict | None) -> bool:
    return entry is not None and math.isfinite(entry["half_width"] or math.nan) and \
        (entry["mean"] - entry["half_width"] > 0 or entry["mean"] + entry["half_width"] < 0)


def table_lines(answer: dict, sampling: str) -> list[str]:
    """One row per split and outcome: each weight's share, then the two paired differences with their smallest
    detectable effects."""
    a, b = answer["a"], answer["b"]
    lines = [f"| split | outcome | {a} | {b} | {a} minus {b}, paired by seed (95 % CI) | detectable | paired by "
             "caption (95 % CI) | detectable |", "|---|---|---|---|---|---|---|---|"]
    for split in SPLITS:
        entry = answer["by_sampling"][sampling][split]
        for category in CATEGORIES:
            share_a = entry["shares"][a].get(category, {}).get("mean")
            share_b = entry["shares"][b].get(category, {}).get("mean")
            seed, caption = entry["seed_paired"][category], entry["caption_paired"][category]
            lines.append(f"| {'validation' if split == 'val' else 'held-out'} | {category.replace('_', ' ')} | "
                         f"{share_a:.3f} | {share_b:.3f} | {_ci(seed)} | {_mde(seed)} | {_ci(caption)} | "
                         f"{_mde(caption)} |")
    return lines


def earlier_answer(path: str | None) -> dict | None:
    """The one-word differences of an earlier study's results.json (the 600-step report), or None."""
    import json
    from pathlib import Path

    if not path or not Path(path).is_file():
        return None
    document = json.loads(Path(path).read_text())
    one = (document.get("claims") or {}).get("one_word") or {}
    study = document.get("study", {})
    return {"path": path, "a": one.get("a"), "b": one.get("b"), "differences": one.get("differences", {}),
            "steps": study.get("steps"), "batch_size": study.get("batch_size")}


def _verdict(seed: dict | None, caption: dict | None) -> str:
    if seed is None:
        return "not measured yet"
    if excludes_zero(seed):
        return f"a difference beyond the run-to-run spread: {_ci(seed)}"
    if caption is not None and excludes_zero(caption):
        return (f"these six models differ ({_ci(caption)} paired by caption), but by less than training runs differ "
                f"from each other (paired by seed {_ci(seed)}: only an effect larger than about "
                f"{_mde(seed)} would show across seeds)")
    return (f"no detectable difference: across training seeds an effect larger than about {_mde(seed)} would have "
            f"shown (80 % power), between these trained models one larger than about {_mde(caption)}")


def _is_the_recipe(config) -> bool:
    """Whether the schedule and model are the named recipe's, unchanged by flags."""
    if not config.recipe:
        return False
    base = base_config(recipe="demo")
    return all(getattr(config, k) == getattr(base, k) for k in ("steps", "batch_size", "warmup_steps", "amp",
                                                                 "learning_rate", "dim", "depth", "heads", "dim_head"))


def lead_lines(config, answer: dict | None, earlier: dict | None) -> list[str]:
    """The report's first section: the claim, the answer at this recipe in numbers, and the earlier answer beside."""
    if not answer or not answer.get("by_sampling"):
        return ["## The answer at this recipe", "", "Not measured yet: no seed has finished both weights.", ""]
    e = answer["evaluation"]
    first = next(iter(answer["by_sampling"]))
    val = answer["by_sampling"][first]["val"]
    held = answer["by_sampling"][first]["heldout"]
    n_captions = val["caption_paired"]["only_one"]["n_captions"] if val["caption_paired"]["only_one"] else "?"
    amp = "bf16-autocast" if config.amp else "float32"
    schedule = f"{config.steps} {amp} steps of batch {config.batch_size}"
    recipe = (f"At the make-demo recipe of this machine ({schedule}: what `python train_dalle.py` trains here)"
              if _is_the_recipe(config) else f"At {schedule} (flags changed the `{config.recipe}` recipe)")
    out = ["## The answer at this recipe", "",
           f"**\"With `loss_img_weight` 1 generations match maybe just one word of the caption.\"** {recipe}, "
           f"{answer['a']} minus {answer['b']}, {len(answer['seeds'])} training seeds, "
           f"{e['samples']} images for each of {e['n_val']} two-object validation items ({n_captions} distinct "
           f"captions) and {e['n_heldout']} two-object held-out items, sampled as generate.py does ({first}):", "",
           f"- only one of the two objects right: validation {_ci(val['seed_paired']['only_one'])} paired by seed "
           f"(smallest detectable effect {_mde(val['seed_paired']['only_one'])}), "
           f"{_ci(val['caption_paired']['only_one'])} paired by caption (detectable "
           f"{_mde(val['caption_paired']['only_one'])}); held-out {_ci(held['seed_paired']['only_one'])} by seed, "
           f"{_ci(held['caption_paired']['only_one'])} by caption.",
           f"- both objects right: validation {_ci(val['seed_paired']['both'])} by seed, "
           f"{_ci(val['caption_paired']['both'])} by caption; held-out {_ci(held['seed_paired']['both'])} by seed, "
           f"{_ci(held['caption_paired']['both'])} by caption.",
           "- Verdict on \"only one right\" (validation): "
           + _verdict(val["seed_paired"]["only_one"], val["caption_paired"]["only_one"]) + ".", ""]
    if earlier:
        d = earlier["differences"]
        out += [f"Beside it, the same claim at {earlier['steps']} steps of batch {earlier['batch_size']} "
                f"([the 600-step report](../results/README.md), one image per caption, 3 seeds, "
                f"{earlier['a']} minus {earlier['b']}): only one right {_ci(d.get('val_only_one'))}, both right "
                f"{_ci(d.get('val_both'))} on validation; held-out {_ci(d.get('heldout_only_one'))} / "
                f"{_ci(d.get('heldout_both'))}.", ""]
    out += ["Intervals are 95 % t-intervals; \"paired by seed\" is across training seeds (the recipe's answer, t with "
            f"{len(answer['seeds']) - 1} degrees of freedom), \"paired by caption\" across captions with the trained "
            "models fixed (the evaluation's noise only). \"Detectable\" is the smallest true difference the design "
            "finds with 80 % power at the 5 % level.", ""]
    for sampling in answer["by_sampling"]:
        settings = e["sampling_settings"][sampling]
        out += [f"Sampling `{sampling}` (top-k {settings[0]}, top-p {settings[1]}, temperature {settings[2]:g}, "
                f"guidance {settings[3]:g}): share of the two-object images by which objects are right (an object is "
                "right when its colour and shape are), mean over seeds:", "", *table_lines(answer, sampling), ""]
    return out
