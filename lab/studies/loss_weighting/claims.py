"""The loss-weighting study's answers to the claims of the discussion it was built for (shared seeds: "CogView Think
Image and Text Should be weighted the same"), each as a difference between settings with a 95 % interval.

Differences are paired by seed: a seed fixes the initial weights and the training sample stream, the same for every
setting, so the per-seed difference removes what the seeds share and its t-interval across seeds is the run-to-run
spread of the difference itself. Every claim is answered from the runs' result files alone (report time).
"""
from __future__ import annotations

import math

from dalle_lab.stats import mean_ci

from .config import Setting
from .one_word import powered_one_word

CONVERGENCE_FRACTIONS = (0.25, 0.5)  # where along training the image-loss curves are compared
CURVE_WINDOW = 0.05  # +- this share of the steps is averaged around each point (one batch's loss is noisy)


def _result(results: list[dict], setting, seed: int) -> dict | None:
    for r in results:
        if r["setting"] == setting.name and r["seed"] == seed:
            return r
    return None


def paired_difference(results: list[dict], a, b, value) -> dict | None:
    """mean and 95 % t-interval over seeds of value(run of a) - value(run of b), for the seeds both settings ran;
    value(run) may return None (then that seed is left out). None when no seed has both."""
    seeds = sorted({r["seed"] for r in results})
    diffs = []
    for seed in seeds:
        ra, rb = _result(results, a, seed), _result(results, b, seed)
        if ra is None or rb is None:
            continue
        va, vb = value(ra), value(rb)
        if va is not None and vb is not None:
            diffs.append(va - vb)
    if not diffs:
        return None
    return mean_ci(diffs).to_dict() | {"values": diffs}


def curve_point(result: dict, fraction: float, key: str = "loss_img") -> float | None:
    """The training curve's `key` averaged over the logged steps within CURVE_WINDOW of `fraction` of training."""
    steps, values = result["curves"]["step"], result["curves"].get(key, [])
    if not steps:
        return None
    last = steps[-1]
    window = [v for s, v in zip(steps, values) if abs(s / last - fraction) <= CURVE_WINDOW]
    return sum(window) / len(window) if window else None


def _eval(split: str, key: str):
    return lambda r: r["eval"].get(split, {}).get(key)


def _objects(split: str, share: str):
    """A two-object caption outcome's share (both / first_only / second_only / neither) from object_breakdown."""
    def get(r):
        breakdown = r["eval"].get(split, {}).get("objects")  # object_breakdown.object_breakdown's dict
        return None if not breakdown else breakdown["objects"]["shares"].get(share)
    return get


def claim_one_word(config, results) -> dict:
    """"With loss_img_weight 1, generations match maybe just one word of the caption": on two-object validation
    captions, the share of images with only one of the two objects right, and with both, w=1 minus w=7."""
    t = config.text_seq_lens[0]
    low, high = Setting(min(config.loss_img_weights), t), Setting(max(config.loss_img_weights), t)
    out = {"a": low.label, "b": high.label, "differences": {}}
    for split in ("val", "heldout"):
        for share in ("both", "first_only", "second_only", "neither"):
            out["differences"][f"{split}_{share}"] = paired_difference(results, low, high, _objects(split, share))

        def only_one(r, split=split):
            first, second = _objects(split, "first_only")(r), _objects(split, "second_only")(r)
            return None if first is None or second is None else first + second
        out["differences"][f"{split}_only_one"] = paired_difference(results, low, high, only_one)
    return out


def claim_text_seq_len(config, results) -> dict:
    """"Increasing text_seq_len makes the loss converge higher": T=long minus T=short per weight, on the total
    training loss a user sees, the caption-token text loss and the image loss on validation images."""
    short, long = min(config.text_seq_lens), max(config.text_seq_lens)
    out = {}
    if short == long:  # one text context in this grid: nothing to compare
        return out
    for w in config.loss_img_weights:
        a, b = Setting(float(w), long), Setting(float(w), short)
        out[f"w{w:g}"] = {"a": a.label, "b": b.label, "differences": {
            "train_loss": paired_difference(results, a, b, lambda r: r["train"]["final"]["loss"]),
            "val_loss_text_caption": paired_difference(results, a, b, _eval("val", "loss_text_caption")),
            "val_loss_img": paired_difference(results, a, b, _eval("val", "loss_img")),
            "val_accuracy": paired_difference(results, a, b, _eval("val", "accuracy"))}}
    return out


def claim_convergence(config, results) -> dict:
    """"Lowering the image weight converges faster": the training image loss part-way through training and the
    final validation image loss, w=low minus w=high (negative = the lower weight is ahead)."""
    t = config.text_seq_lens[0]
    low, high = Setting(min(config.loss_img_weights), t), Setting(max(config.loss_img_weights), t)
    diffs = {f"train_loss_img_at_{f:.0%}": paired_difference(results, low, high,
                                                             lambda r, f=f: curve_point(r, f))
             for f in CONVERGENCE_FRACTIONS}
    diffs["val_loss_img_final"] = paired_difference(results, low, high, _eval("val", "loss_img"))
    return {"a": low.label, "b": high.label, "differences": diffs}


def claim_noise(config, results) -> dict | None:
    """"The weighting may interact with how noisy the captions are": (w=low - w=high) on noisy captions minus the
    same on clean ones, per seed (an interaction), and each weight's loss from the noise."""
    if not config.caption_noise:
        return None
    t, noise = config.noise_text_seq_len, config.caption_noise
    w_low, w_high = float(min(config.loss_img_weights)), float(max(config.loss_img_weights))
    clean_low, clean_high = Setting(w_low, t), Setting(w_high, t)
    noisy_low, noisy_high = Setting(w_low, t, noise), Setting(w_high, t, noise)
    out = {"noise": noise, "text_seq_len": t, "interaction": {}, "noise_effect": {}}
    for split in ("val", "heldout"):
        for key in ("accuracy", "exact_match"):
            get = _eval(split, key)

            def gap(r_low, r_high):
                values = [None if r is None else get(r) for r in (r_low, r_high)]
                return None if None in values else values[0] - values[1]
            values = []
            for seed in sorted({r["seed"] for r in results}):
                noisy = gap(_result(results, noisy_low, seed), _result(results, noisy_high, seed))
                clean = gap(_result(results, clean_low, seed), _result(results, clean_high, seed))
                if noisy is not None and clean is not None:
                    values.append(noisy - clean)
            out["interaction"][f"{split}_{key}"] = (mean_ci(values).to_dict() | {"values": values}) if values else None
            for noisy_s, clean_s in ((noisy_low, clean_low), (noisy_high, clean_high)):
                out["noise_effect"][f"{split}_{key} {noisy_s.label}"] = paired_difference(results, noisy_s,
                                                                                         clean_s, get)
    return out


def caption_attention_measures(attention: dict) -> dict:
    """From one run's caption_word_attention: the share of the image queries' attention that reaches the caption's
    words at all, and how evenly it spreads over the caption's roles (entropy in nats of the word roles' shares,
    normalised to sum to 1; higher = spread, lower = concentrated on few words). Both are averaged over layers and
    over one- and two-object captions, weighted by caption count."""
    from dalle_lab.viz.attention_words import WORD_ROLES

    total, text_share, entropy = 0, 0.0, 0.0
    for kind in attention["by_kind"].values():
        for layer in kind["layers"]:
            words = [layer[name] for name in WORD_ROLES if name in layer]
            mass = sum(words)
            text_share += kind["n_captions"] * mass
            entropy -= kind["n_captions"] * sum(w / mass * math.log(w / mass) for w in words if w > 0) if mass else 0
            total += kind["n_captions"]
    return {"caption_share": text_share / total, "role_entropy": entropy / total} if total else {}


def claim_attention(config, results) -> dict:
    """"Fascinating to visualize with a heatmap of the attention heads": does w=low spread or concentrate the image
    tokens' attention over the caption's words, against w=high? Per seed, paired."""
    t = config.text_seq_lens[0]
    low, high = Setting(min(config.loss_img_weights), t), Setting(max(config.loss_img_weights), t)

    def measure(key):
        def get(r):
            attention = r["eval"].get("attention_words")
            return caption_attention_measures(attention).get(key) if attention else None
        return get
    return {"a": low.label, "b": high.label,
            "differences": {key: paired_difference(results, low, high, measure(key))
                            for key in ("caption_share", "role_entropy")}}


def mean_attention(results: list[dict], setting) -> dict | None:
    """A setting's caption_word_attention averaged over its seeds (the same captions in every run), for the
    heatmap."""
    runs = [r["eval"]["attention_words"] for r in results
            if r["setting"] == setting.name and "attention_words" in r["eval"]]
    if not runs:
        return None
    layers = [{name: sum(run["layers"][i][name] for run in runs) / len(runs) for name in runs[0]["layers"][i]}
              for i in range(len(runs[0]["layers"]))]
    return {"layers": layers, "n_captions": runs[0]["n_captions"], "seeds": len(runs)}


def all_claims(config, results: list[dict]) -> dict:
    return {"one_word": claim_one_word(config, results), "text_seq_len": claim_text_seq_len(config, results),
            "convergence": claim_convergence(config, results), "noise": claim_noise(config, results),
            "attention": claim_attention(config, results), "one_word_powered": powered_one_word(config, results)}


# ------------------------------------------------------------------------------------------------ words

def interval_text(entry: dict | None, digits: int = 3) -> str:
    """"+0.012 (95 % CI -0.004 to +0.028, 3 seeds)"."""
    if entry is None:
        return "not measured"
    mean, half = entry["mean"], entry["half_width"]
    if entry["n"] < 2 or half is None or not math.isfinite(half):
        return f"{mean:+.{digits}f} ({entry['n']} seed)"
    return f"{mean:+.{digits}f} (95 % CI {mean - half:+.{digits}f} to {mean + half:+.{digits}f}, {entry['n']} seeds)"


def verdict(entry: dict | None) -> str:
    """Whether the interval excludes 0."""
    if entry is None or entry["n"] < 2 or entry["half_width"] is None or not math.isfinite(entry["half_width"]):
        return "untested"
    if entry["std"] == 0:
        return "untested (the seeds agree exactly, so there is no spread to judge a difference by)"
    if entry["mean"] - entry["half_width"] > 0 or entry["mean"] + entry["half_width"] < 0:
        return "a detectable difference"
    return f"no detectable difference (an effect larger than about {entry['half_width']:.3f} would have shown)"


def claim_lines(claims: dict) -> list[str]:
    """The report's lead section: each claim of the discussion, then what the runs say, in numbers."""
    out = ["## Answers to the discussion's claims", "",
           "Each line is a difference between two settings, paired by seed (the same initial weights and training "
           "samples), with its 95 % t-interval across seeds.", ""]
    one = claims["one_word"]
    d = one["differences"]
    if claims.get("one_word_powered"):
        out += ["1. **\"With `loss_img_weight` 1 generations match maybe just one word of the caption.\"** Answered "
                "by the powered two-object evaluation in the first section.", ""]
    else:
        out += [f"1. **\"With `loss_img_weight` 1 generations match maybe just one word of the caption.\"** "
                f"Two-object validation captions, {one['a']} minus {one['b']}: share of images with only one of the "
                f"two objects right {interval_text(d.get('val_only_one'))}, both right "
                f"{interval_text(d.get('val_both'))} (held-out compositions: "
                f"{interval_text(d.get('heldout_only_one'))} / {interval_text(d.get('heldout_both'))}). Verdict on "
                f"\"only one right\": {verdict(d.get('val_only_one'))}.", ""]
    lengths = claims["text_seq_len"]
    parts = []
    for w, entry in lengths.items():
        e = entry["differences"]
        parts.append(f"{entry['a']} minus {entry['b']}: total training loss {interval_text(e['train_loss'])}, "
                     f"caption-token text loss {interval_text(e['val_loss_text_caption'])}, validation image loss "
                     f"{interval_text(e['val_loss_img'])}, checker accuracy {interval_text(e['val_accuracy'])}")
    if parts:
        out += ["2. **\"Increasing `text_seq_len` makes the loss converge higher.\"** " + "; ".join(parts) + ". (The "
                "total loss averages over pad positions too, which a longer context fills with trivially "
                "predictable pads: see \"How to read the losses\".)", ""]
    else:
        out += ["2. **\"Increasing `text_seq_len` makes the loss converge higher.\"** Not measured in this report: "
                "its grid has one text_seq_len (run the study with two or more `--text_seq_lens`).", ""]
    conv = claims["convergence"]
    e = conv["differences"]
    out += [f"3. **\"Lowering the image weight converges faster.\"** {conv['a']} minus {conv['b']}, training image "
            "loss " + ", ".join(f"at {k.rsplit('_', 1)[1]} of training {interval_text(v)}"
                                for k, v in e.items() if k.startswith("train_loss_img_at_"))
            + f"; final validation image loss {interval_text(e['val_loss_img_final'])} (negative = the lower weight "
            f"is ahead). Verdict at the end: {verdict(e['val_loss_img_final'])}.", ""]
    noise = claims.get("noise")
    if noise:
        i = noise["interaction"]
        out += [f"4. **\"The weighting may interact with how noisy the captions are.\"** With {noise['noise']:.0%} "
                f"of training captions wrong in one attribute (T={noise['text_seq_len']}), the low-minus-high weight "
                f"difference in validation accuracy moves by {interval_text(i.get('val_accuracy'))} against clean "
                f"captions (exact match {interval_text(i.get('val_exact_match'))}; held-out accuracy "
                f"{interval_text(i.get('heldout_accuracy'))}). Verdict: {verdict(i.get('val_accuracy'))}. What the "
                "noise itself costs each weight: " + "; ".join(f"{k} {interval_text(v)}"
                                                              for k, v in noise["noise_effect"].items()
                                                              if k.startswith("val_accuracy")) + ".", ""]
    attention = claims.get("attention")
    if attention:
        e = attention["differences"]
        out += [f"5. **\"A heatmap of the attention heads.\"** {attention['a']} minus {attention['b']}: share of the "
                f"image tokens' attention that reaches the caption's words {interval_text(e['caption_share'])}; "
                f"entropy of that attention over the caption's roles (nats; higher = spread over more words) "
                f"{interval_text(e['role_entropy'])}. Verdict on spread: {verdict(e['role_entropy'])}. The heatmap "
                "(attention_words.png) shows each role's share per layer, averaged over seeds and validation "
                "captions.", ""]
    return out


def object_table(settings, results: list[dict]) -> list[str]:
    """Per setting: how the two-object captions' images split into both / first only / second only / neither
    right (mean over seeds; validation / held-out)."""
    from dalle_lab.evaluate.objects import OBJECT_OUTCOMES

    lines = ["Two-object captions: which objects the images get right (an object is right when its colour and "
             "shape are; mean over seeds; validation / held-out):", "",
             "| setting | " + " | ".join(o.replace("_", " ") for o in OBJECT_OUTCOMES) + " |",
             "|---|" + "---|" * len(OBJECT_OUTCOMES)]
    for setting in settings:
        mine = [r for r in results if r["setting"] == setting.name]
        if not mine or not all("objects" in r["eval"].get("val", {}) for r in mine):
            continue
        cells = []
        for outcome in OBJECT_OUTCOMES:
            parts = []
            for split in ("val", "heldout"):
                values = [v for v in (_objects(split, outcome)(r) for r in mine) if v is not None]
                parts.append(f"{sum(values) / len(values):.2f}" if values else "-")
            cells.append(" / ".join(parts))
        lines.append(f"| {setting.label} | " + " | ".join(cells) + " |")
    return lines + [""]
