"""The loss-weighting study's report: per-setting means with t-based 95 % CIs across seeds, Welch t-tests between
settings, plots, and one JSON with every number. Written from the runs' results alone, so it can be rebuilt at any
time (`--report_only`) and is rewritten after each finished run.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from dalle_lab.stats import holm_adjust, mean_ci, welch_test

from .claims import all_claims, claim_lines, mean_attention, object_table
from .config import Setting, StudyConfig, base_config
from .one_word import earlier_answer, lead_lines
from .plots import plot_accuracy, plot_curves, plot_samples

# (key, label, where in a run's result): the numbers aggregated per setting
METRICS = [
    ("train_loss_text", "train loss_text", ("train", "final", "loss_text")),
    ("train_loss_img", "train loss_img", ("train", "final", "loss_img")),
    ("train_loss", "train total", ("train", "final", "loss")),
    ("val_loss_text", "val loss_text (all positions)", ("eval", "val", "loss_text")),
    ("val_loss_text_caption", "val loss_text (caption tokens)", ("eval", "val", "loss_text_caption")),
    ("val_loss_img", "val loss_img", ("eval", "val", "loss_img")),
    ("heldout_loss_text_caption", "held-out loss_text (caption tokens)", ("eval", "heldout", "loss_text_caption")),
    ("heldout_loss_img", "held-out loss_img", ("eval", "heldout", "loss_img")),
    ("val_accuracy", "val attribute accuracy", ("eval", "val", "accuracy")),
    ("val_exact_match", "val exact match", ("eval", "val", "exact_match")),
    ("heldout_accuracy", "held-out attribute accuracy", ("eval", "heldout", "accuracy")),
    ("heldout_exact_match", "held-out exact match", ("eval", "heldout", "exact_match")),
]
LABELS = {key: label for key, label, _ in METRICS}
# compared between settings (the total loss is not: its formula changes with the weight)
COMPARED = ["val_accuracy", "heldout_accuracy", "val_exact_match", "heldout_exact_match", "val_loss_img",
            "val_loss_text_caption"]
ALPHA = 0.05


def _get(result: dict, path: tuple[str, ...]):
    value = result
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _values(results: list[dict], setting: str, path) -> list[float]:
    values = [_get(r, path) for r in results if r["setting"] == setting]
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def summarise(settings, results: list[dict]) -> dict:
    """{setting name: {metric: Interval dict, "seeds": [...]}} for the settings that have results."""
    summary = {}
    for setting in settings:
        mine = [r for r in results if r["setting"] == setting.name]
        if not mine:
            continue
        entry = {"label": setting.label, "seeds": sorted(r["seed"] for r in mine)}
        for key, _, path in METRICS:
            values = _values(results, setting.name, path)
            if values:
                entry[key] = mean_ci(values).to_dict() | {"values": values}
        summary[setting.name] = entry
    return summary


def comparisons(config, results: list[dict]) -> list[dict]:
    """Welch t-tests of each factor at each level of the other: weight vs weight at a fixed text_seq_len, and
    text_seq_len vs text_seq_len at a fixed weight, for the COMPARED metrics. Holm-adjusted over the whole family."""
    pairs = []
    weights, lengths = list(config.loss_img_weights), list(config.text_seq_lens)
    for t in lengths:
        for i, wa in enumerate(weights):
            for wb in weights[i + 1:]:
                pairs.append(("loss_img_weight", Setting(float(wa), int(t)), Setting(float(wb), int(t))))
    for w in weights:
        for i, ta in enumerate(lengths):
            for tb in lengths[i + 1:]:
                pairs.append(("text_seq_len", Setting(float(w), int(tb)), Setting(float(w), int(ta))))
    if config.caption_noise:  # the caption-noise arm: weight vs weight on noisy captions, noisy vs clean per weight
        t, noise = int(config.noise_text_seq_len), float(config.caption_noise)
        for i, wa in enumerate(weights):
            for wb in weights[i + 1:]:
                pairs.append(("loss_img_weight", Setting(float(wa), t, noise), Setting(float(wb), t, noise)))
        for w in weights:
            pairs.append(("caption_noise", Setting(float(w), t, noise), Setting(float(w), t)))
    rows = []
    paths = {key: path for key, _, path in METRICS}
    for factor, a, b in pairs:
        for metric in COMPARED:
            va, vb = _values(results, a.name, paths[metric]), _values(results, b.name, paths[metric])
            if not va or not vb:
                continue
            test = welch_test(va, vb)
            rows.append({"factor": factor, "a": a.label, "b": b.label, "metric": metric, "mean_a": sum(va) / len(va),
                         "mean_b": sum(vb) / len(vb), **test.to_dict()})
    for row, adjusted in zip(rows, holm_adjust([r["p_value"] for r in rows])):
        row["p_holm"] = adjusted
    return rows


# ------------------------------------------------------------------------------------------------ markdown

def _cell(entry: dict, key: str, digits: int = 3) -> str:
    if key not in entry:
        return "n/a"
    interval = entry[key]
    if interval["n"] < 2 or not math.isfinite(interval["half_width"]):
        return f"{interval['mean']:.{digits}f}"
    return f"{interval['mean']:.{digits}f} ± {interval['half_width']:.{digits}f}"


def _table(settings, summary: dict, keys: list[str]) -> list[str]:
    lines = ["| setting | seeds | " + " | ".join(LABELS[k] for k in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for setting in settings:
        entry = summary.get(setting.name)
        if entry is None:
            lines.append(f"| {setting.label} | 0 | " + " | ".join("not run" for _ in keys) + " |")
            continue
        lines.append(f"| {setting.label} | {len(entry['seeds'])} | "
                     + " | ".join(_cell(entry, k) for k in keys) + " |")
    return lines


ATTRIBUTES = ["background", "color", "shape", "size", "place", "color1", "shape1", "color2", "shape2", "relation"]


def attribute_table(settings, results: list[dict]) -> list[str]:
    """Per-attribute checker accuracy (mean over seeds) for both caption sets: which parts of a caption the
    images get right. One-object captions have colour/shape/size/place, two-object ones colour1..relation."""
    lines = ["Per attribute (mean over seeds; validation / held-out):", "",
             "| setting | " + " | ".join(ATTRIBUTES) + " |", "|---|" + "---|" * len(ATTRIBUTES)]
    for setting in settings:
        mine = [r for r in results if r["setting"] == setting.name]
        if not mine:
            continue
        cells = []
        for name in ATTRIBUTES:
            parts = []
            for split in ("val", "heldout"):
                values = [r["eval"][split]["per_attribute"][name] for r in mine
                          if name in r["eval"][split].get("per_attribute", {})]
                parts.append(f"{sum(values) / len(values):.2f}" if values else "-")
            cells.append(" / ".join(parts))
        lines.append(f"| {setting.label} | " + " | ".join(cells) + " |")
    return lines + [""]


def _p(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def _short(row: dict) -> str:
    return (f"{LABELS[row['metric']]} ({row['a']} {row['mean_a']:.3f} vs {row['b']} {row['mean_b']:.3f}, "
            f"p = {_p(row['p_value'])})")


def finding_lines(rows: list[dict]) -> list[str]:
    """The verdicts for one factor's comparisons, in plain words: what survives Holm's correction, what is only
    nominal, and how many show no significant difference."""
    robust = [r for r in rows if math.isfinite(r["p_holm"]) and r["p_holm"] < ALPHA]
    nominal = [r for r in rows if r["p_value"] < ALPHA and r not in robust]
    untestable = [r for r in rows if not math.isfinite(r["p_value"])]
    rest = len(rows) - len(robust) - len(nominal) - len(untestable)
    lines = []
    if robust:
        lines.append("- Significant after Holm's correction: " + "; ".join(_short(r) for r in robust) + ".")
    if nominal:
        lines.append("- Nominally significant (p < 0.05) but not after correcting for the number of tests: "
                     + "; ".join(_short(r) for r in nominal) + ".")
    if rest:
        lines.append(f"- {'The other' if robust or nominal else 'All'} {rest} comparisons: no significant "
                     "difference.")
    if untestable:
        lines.append(f"- {len(untestable)} comparisons could not be tested (fewer than 2 seeds on a side, or no "
                     "spread across seeds on either side).")
    return lines


def comparison_table(rows: list[dict]) -> list[str]:
    lines = ["| comparison | metric | a − b (95 % CI) | Welch p | Holm p |", "|---|---|---|---|---|"]
    for r in rows:
        diff = f"{r['difference']:+.3f}"
        if math.isfinite(r["half_width"]):
            diff += f" ({r['difference'] - r['half_width']:+.3f} to {r['difference'] + r['half_width']:+.3f})"
        lines.append(f"| {r['a']} vs {r['b']} | {LABELS[r['metric']]} | {diff} | {_p(r['p_value'])} | "
                     f"{_p(r['p_holm'])} |")
    return lines


def markdown(config, summary: dict, rows: list[dict], results: list[dict], expected: int, failures: list[dict],
             plots: dict, claims: dict) -> str:
    from dalle_lab.model import DALLEConfig

    settings = config.settings()
    done = len(results)
    complete = done == expected and not failures
    e = config.eval
    mean_train_s = {}
    for setting in settings:
        seconds = [r["train"]["seconds_this_session"] for r in results
                   if r["setting"] == setting.name and not r["train"].get("resumed")]
        if seconds:
            mean_train_s[setting.label] = sum(seconds) / len(seconds)
    powered = claims.get("one_word_powered")
    out = ["# The CogView loss-weighting study" + (f" at the `{config.recipe}` recipe" if config.recipe else ""), ""]
    if not complete:
        out += [f"**PARTIAL REPORT: {done} of {expected} runs finished"
                + (f", {len(failures)} failed" if failures else "")
                + ". Numbers below cover only the finished runs.**", ""]
    if config.note:
        out += [f"> {config.note}", ""]
    out += [
        "Does weighting the text loss like the image loss (`loss_img_weight` 1, as CogView) rather than 7 (DALL-E) "
        "change what a small text-to-image transformer learns on the built-in Shapes data, and does a longer text "
        "context (`text_seq_len`) matter? Each setting was trained with the same model, steps, batch, schedule and, "
        "per seed, the identical stream of training samples (equal compute; the longer text context additionally "
        "processes pad positions, which costs time but carries no information).",
        "",
        *(lead_lines(config, powered, earlier_answer(config.compare_to)) if powered is not None else []),
        *claim_lines(claims),
        "## Set-up",
        "",
        f"- Model: dim {config.dim}, depth {config.depth}, heads {config.heads}, dim_head {config.dim_head}; "
        f"{config.steps} steps of batch {config.batch_size} ({config.steps * config.batch_size} samples), "
        f"learning rate {config.learning_rate:g} with {config.warmup_steps} warm-up steps then cosine decay, "
        f"amp {'on' if config.amp else 'off'}, device {config.device}; every other DALLEConfig field at its default "
        f"(e.g. {DALLEConfig().null_cond_prob:.0%} caption dropout for guidance).",
        f"- Grid: loss_img_weight {', '.join(f'{w:g}' for w in config.loss_img_weights)} x text_seq_len "
        f"{', '.join(str(t) for t in config.text_seq_lens)}, seeds 0..{config.seeds - 1} "
        f"(a seed fixes the initial weights and the training sample stream, the same for every setting)"
        + (f"; and every weight again at text_seq_len {config.noise_text_seq_len} on captions of which "
           f"{config.caption_noise:.0%} (drawn per sample from the seed) have one attribute changed, the image "
           "unchanged (`--caption_noise`)." if config.caption_noise else "."),
        f"- Evaluation per run: losses in eval mode on {e.n_loss} validation and {e.n_loss} held-out-composition "
        f"samples; one image generated ({_sampling(e)}) for each of {e.n_val} "
        f"validation captions and {e.n_heldout} held-out-composition captions, scored by the Shapes checker "
        "(attribute accuracy: share of the caption's attributes the image satisfies; exact match: all of them).",
        *([f"- Two-object evaluation per run: {config.objects.samples} images for each of the first "
           f"{config.objects.n_val} two-object validation items and {config.objects.n_heldout} two-object held-out "
           f"items (seed {config.objects.seed}), under each sampling of the first section, every run from the same "
           "sampling seeds (two_objects.py)."] if config.objects else []),
        "- Runs: " + (f"one at a time with {config.threads} torch threads each" if config.workers == 1 else
                      f"{config.workers} at a time with {config.threads} torch threads each")
        + "; each run's result in results.json records its commit, CPU kind (avx512_bf16 or not) and load average.",
        *[f"- Image tokenizer: `{_relative(path)}` (sha256 {sha[:12]}...)." for path, sha in sorted(
            {(r["image_tokenizer"]["model_path"], r["image_tokenizer"]["sha256"]) for r in results
             if r.get("image_tokenizer")})],
        "- Cells are mean ± the t-based 95 % confidence interval half-width across seeds "
        "(mean ± t(0.975, n-1) · s / √n).",
        "",
        "How to read the losses: **train** numbers average the last 10 % of logged training steps. `loss_text` "
        "**(all positions)** is what training optimises; it averages over every text position, and every position "
        "after the caption's end is a pad that is trivially predictable, so a longer text_seq_len lowers it without "
        "the model knowing more. **(caption tokens)** averages only over the caption's tokens and the position "
        "where it ends: use it to compare text_seq_len. The total loss is (text + w · image) / (w + 1), so totals "
        "with different weights are different formulas and are not compared.",
        "",
        "## Results",
        "",
        "### Losses",
        "",
        *_table(settings, summary, ["train_loss_text", "train_loss_img", "train_loss", "val_loss_text",
                                    "val_loss_text_caption", "val_loss_img"]),
        "",
        "### The Shapes checker on generated images",
        "",
        *_table(settings, summary, ["val_accuracy", "val_exact_match", "heldout_accuracy", "heldout_exact_match",
                                    "heldout_loss_img"]),
        "",
        *attribute_table(settings, results),
        *object_table(settings, results),
    ]
    if plots.get("accuracy"):
        out += [f"![attribute accuracy and exact match per setting]({plots['accuracy']})", ""]
    if plots.get("attention"):
        out += [f"![image-token attention per caption role and layer, per setting]({plots['attention']})", ""]
    if plots.get("curves"):
        out += [f"![training text and image loss per setting]({plots['curves']})", ""]
    if plots.get("samples"):
        out += [f"![generated samples for held-out compositions, seed 0]({plots['samples']})", "",
                "Samples (seed 0 of each setting) for the held-out captions: "
                + "; ".join(f"{i + 1}. {c}" for i, c in enumerate(plots.get("sample_captions", []))), ""]
    out += ["## What the data shows", ""]
    if rows:
        n_seeds = sorted({len(summary[s]['seeds']) for s in summary})
        out += [f"{len(rows)} two-sided Welch t-tests between settings ({'/'.join(map(str, n_seeds))} seeds per "
                "setting), Holm-corrected over all of them. With few seeds only large, consistent effects can "
                "show: \"no significant difference\" means this study cannot tell the settings apart, not that "
                "they are equal.", ""]
        for factor, title in (("loss_img_weight", "Text vs image weighting (same text_seq_len)"),
                              ("text_seq_len", "Short vs long text context (same weighting)"),
                              ("caption_noise", "Noisy vs clean captions (same weighting)")):
            mine = [r for r in rows if r["factor"] == factor]
            if mine:
                out += [f"**{title}:**", "", *finding_lines(mine), ""]
        out += ["<details><summary>All comparisons</summary>", "", *comparison_table(rows), "", "</details>", ""]
    else:
        out += ["Not enough finished runs to compare settings yet.", ""]
    if mean_train_s:
        out += ["## Cost", "",
                "Mean training time per run (this machine, runs that were not resumed; shared CPUs inflate these): "
                + ", ".join(f"{label} {_duration(s)}" for label, s in mean_train_s.items()) + ".", ""]
    if failures:
        out += ["## Failed runs", ""] + [f"- {f['setting']} seed {f['seed']}: {f['error'].splitlines()[0]}"
                                         for f in failures] + [""]
    threads = f"OMP_NUM_THREADS={config.threads} " if config.recipe else ""
    command = f"{threads}python -m lab.studies.loss_weighting.run {command_flags(config)}".rstrip()
    out += ["## Reproduce", "", "```", command, "```", ""]
    if config.recipe:
        out += ["One run again (here seed 1 of the first weight) into folders of its own, to compare its result.json "
                "with this report's run (bit-identical only on the same CPU kind and thread count):", "", "```",
                f"{threads}python -m lab.studies.loss_weighting.run "
                f"{command_flags(config, leave_out=('out_dir', 'runs_dir'))} --loss_img_weights "
                f"{config.loss_img_weights[0]:g} --only_seeds 1 --runs_dir runs/loss_weighting_check "
                "--out_dir runs/loss_weighting_check/report", "```", ""]
    out += ["All numbers, per run and aggregated, with the loss curves: `results.json`. See docs/experiments.md.", ""]
    return "\n".join(out)


def _sampling(e) -> str:
    parts = [f"top-k {e.top_k}" if e.top_k else "no top-k", f"temperature {e.temperature:g}"]
    parts.append(f"guidance scale {e.cond_scale:g}" if e.cond_scale != 1 else "no guidance")
    return ", ".join(parts)


def _relative(path: str) -> str:
    """A path under the working directory without the machine-specific prefix."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def command_flags(config, leave_out: tuple[str, ...] = ()) -> str:
    """The flags that reproduce this study (the ones that differ from the defaults), but those in `leave_out`."""
    default = base_config(recipe="demo") if config.recipe else StudyConfig()
    flags = ["--recipe demo"] if config.recipe else []
    for name in ("steps", "batch_size", "learning_rate", "warmup_steps", "dim", "depth", "heads", "dim_head", "seeds",
                 "device", "workers", "threads", "out_dir", "runs_dir"):
        if getattr(config, name) != getattr(default, name) and name not in leave_out:
            flags.append(f"--{name} {getattr(config, name)}")
    if config.amp != default.amp:
        flags.append("--amp" if config.amp else "--no-amp")
    if config.image_tokenizer != default.image_tokenizer and not config.vqgan_model_path:
        flags.append(f"--image_tokenizer {config.image_tokenizer}")
    for name in ("loss_img_weights", "text_seq_lens"):
        if tuple(getattr(config, name)) != tuple(getattr(default, name)):
            flags.append(f"--{name} " + " ".join(f"{v:g}" for v in getattr(config, name)))
    for name in ("n_val", "n_heldout", "n_loss"):
        if getattr(config.eval, name) != getattr(default.eval, name):
            flags.append(f"--{name} {getattr(config.eval, name)}")
    if config.objects is not None and default.objects is not None:
        for name, flag in (("n_val", "two_object_val"), ("n_heldout", "two_object_heldout"),
                           ("samples", "two_object_samples")):
            if getattr(config.objects, name) != getattr(default.objects, name):
                flags.append(f"--{flag} {getattr(config.objects, name)}")
    return " ".join(flags)


# ------------------------------------------------------------------------------------------------ all of it

def write_report(config, results: list[dict], expected: int, failures: list[dict]) -> Path:
    """README.md, results.json and the PNGs in config.out_dir, from the finished runs' results."""
    from dalle_lab.utils import atomic_write

    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = config.settings()
    results = sorted(results, key=lambda r: ([s.name for s in settings].index(r["setting"])
                                             if r["setting"] in [s.name for s in settings] else 99, r["seed"]))
    summary = summarise(settings, results)
    rows = comparisons(config, results)
    claims = all_claims(config, results)
    plots = {}
    if plot_accuracy(settings, summary, out_dir / "accuracy.png"):
        plots["accuracy"] = "accuracy.png"
    if plot_curves(settings, results, out_dir / "loss_curves.png"):
        plots["curves"] = "loss_curves.png"
    attention = {s.label: a for s in settings if (a := mean_attention(results, s)) is not None}
    if attention:
        from dalle_lab.viz.attention_words import plot_word_attention

        plots["attention"] = plot_word_attention(attention, out_dir / "attention_words.png").name
    if plot_samples(config, settings, results, out_dir / "samples.png"):
        from dalle_lab.data.shapes import heldout_captions

        plots["samples"] = "samples.png"
        plots["sample_captions"] = heldout_captions(min(config.eval.n_heldout, 8), config.eval.seed)
    status = "complete" if len(results) == expected and not failures else "partial"
    document = {"status": status, "runs_finished": len(results), "runs_expected": expected,
                "study": config.to_dict(), "summary": summary, "comparisons": rows, "claims": claims,
                "failures": [{k: v for k, v in f.items()} for f in failures],
                "runs": [{k: v for k, v in r.items() if k != "cached"} for r in results]}
    atomic_write(out_dir / "results.json",
                 lambda tmp: Path(tmp).write_text(json.dumps(_finite(document), indent=1, allow_nan=False)))
    text = markdown(config, summary, rows, results, expected, failures, plots, claims)
    return atomic_write(out_dir / "README.md", lambda tmp: Path(tmp).write_text(text))


def _finite(value):
    """NaN/inf -> None (strict JSON has no NaN: a test with one seed has no interval)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


__all__ = ["comparison_table", "comparisons", "finding_lines", "markdown", "summarise", "write_report"]
