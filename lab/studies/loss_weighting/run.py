"""The CogView loss-weighting study: does weighting the text loss like the image loss (loss_img_weight 1, CogView)
instead of 7 (DALL-E) change what a text-to-image transformer learns, and does a longer text context matter?

    python -m lab.studies.loss_weighting.run            # (2 weights x 2 text_seq_len + 2 noisy) x 3 seeds
    python -m lab.studies.loss_weighting.run --quick    # the small study: 2 x 2 x 3 runs of a 1M model
    OMP_NUM_THREADS=2 python -m lab.studies.loss_weighting.run --recipe demo   # make demo's recipe: 2 weights x 3 seeds

Every run trains the same model on the built-in Shapes data through the library's training loop
(dalle_lab.training.loop.train) at equal compute: the same optimizer steps, batch size and learning-rate schedule,
and, for a given seed, the identical stream of training samples and the same initial weights wherever the shapes
agree. Then it measures held-out losses (text and image parts) and the Shapes checker's scores of images generated for
validation captions and held-out compositions. The report (markdown table, plots, JSON) aggregates the seeds with
t-based 95 % confidence intervals and Welch t-tests (see docs/experiments.md).

Resumable: each finished run leaves <runs_dir>/<setting>/seed<k>/result.json and is not redone; an interrupted run
continues from its last checkpoint. The report is rewritten after every finished run (labelled partial until all
runs are done), so a study stopped early still leaves a readable report of what it finished.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

from .config import (IMAGE_TOKENIZERS, PATCH_TOKENIZER_FILE, QUICK, RECIPES, SAMPLES_FILE, SAMPLES_KEPT, Setting,
                     StudyConfig, base_config, demo_recipe, recipe_config)
from .runs import (RESULT_FILE, collect_cached, final_train_losses, import_results, load_cached, read_curves, run_dir,
                   run_identity)
from .report import write_report
from .two_objects import TwoObjectEval, evaluate_two_objects

# the study's settings are defined in config.py; the command line and tests reach them here too
__all__ = ["IMAGE_TOKENIZERS", "QUICK", "RECIPES", "Setting", "StudyConfig", "base_config", "build_parser",
           "config_from_args", "demo_recipe", "main", "recipe_config", "run_one", "run_study"]

# ------------------------------------------------------------------------------------------------ one run

def run_one(config: StudyConfig, setting: Setting, seed: int, image_tokenizer: dict) -> dict:
    """Train and evaluate one (setting, seed), or return its cached result. Runs in a worker process."""
    import numpy as np
    import torch

    from dalle_lab.evaluate.shapes import evaluate_model
    from dalle_lab.provenance import git_state, machine
    from dalle_lab.tokenizers import get_tokenizer
    from dalle_lab.training.checkpoint import build_model, load_model_state, read_checkpoint
    from dalle_lab.training.config import TrainConfig
    from dalle_lab.training.loop import train
    from dalle_lab.utils import atomic_write, pick_device
    from dalle_lab.viz.attention_words import caption_word_attention
    from dalle_lab.image_grid import to_uint8

    torch.set_num_threads(config.threads)
    directory = run_dir(config, setting, seed)
    tokenizer = get_tokenizer(config.bpe_path)
    vae = load_image_tokenizer(image_tokenizer)
    identity = run_identity(config, setting, seed, vae.identity, tokenizer.identity)
    cached = load_cached(directory / RESULT_FILE, identity)
    if cached is not None:
        cached["cached"] = True
        return cached

    # a killed run is continued only by the same settings (its checkpoint alone would not say, e.g., the step budget)
    started_with = directory / "identity.json"
    latest = directory / "dalle.pt"
    if latest.is_file():
        load_cached(started_with, identity, key=None)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(started_with, lambda tmp: Path(tmp).write_text(json.dumps(identity, indent=1)))
    train_config = TrainConfig(
        bpe_path=config.bpe_path,  # the image tokenizer is passed as an object below
        caption_noise=setting.caption_noise,
        max_steps=config.steps, batch_size=config.batch_size, learning_rate=config.learning_rate,
        warmup_steps=config.warmup_steps, amp=config.amp, device=config.device, seed=seed,
        output_dir=str(directory), save_every_n_steps=config.save_every_n_steps, keep_n_checkpoints=1,
        sample_every_n_steps=0, log_every_n_steps=config.log_every_n_steps, progress=False,
        resume="latest" if latest.is_file() else None)
    started = time.monotonic()
    trained = train(train_config, config.model_overrides(setting), tokenizer=tokenizer, vae=vae)
    train_seconds = time.monotonic() - started

    checkpoint = read_checkpoint(trained.checkpoint_path)
    model = build_model(checkpoint["config"], vae=vae)
    load_model_state(model, checkpoint["model"], trained.checkpoint_path)
    model.to(pick_device(config.device)).eval()  # .to() moves the vae with it
    started = time.monotonic()
    numbers, images = evaluate_model(model, vae, tokenizer, config.eval)
    # where the image tokens look among the caption's words, layer by layer (the discussion's "heatmap" question)
    numbers["attention_words"] = caption_word_attention(model, vae, tokenizer, split="val", n=config.eval.n_val,
                                                        seed=config.eval.seed, batch_size=config.eval.batch_size)
    if config.objects is not None:
        numbers["two_objects"] = evaluate_two_objects(model, vae, tokenizer, config.objects)
    eval_seconds = time.monotonic() - started

    curves = read_curves(directory / "dalle-metrics.jsonl")
    result = {
        "identity": identity, "setting": setting.name, "label": setting.label, "seed": seed,
        "train": {"steps": trained.step, "seconds_this_session": train_seconds,
                  "resumed": train_config.resume is not None, "nonfinite_skipped": trained.nonfinite_skipped,
                  "samples_seen": trained.step * config.batch_size,
                  "tokens_per_sample": setting.text_seq_len + model.config.image_seq_len,
                  "final": final_train_losses(curves)},
        "eval": numbers, "eval_seconds": eval_seconds, "curves": curves,
        "image_tokenizer": {"model_path": vae.identity["model_path"], "sha256": vae.identity["sha256"]},
        # which code, on which CPU kind (native bf16 or not), how busy, on how many threads
        "provenance": {"git": git_state(), "machine": machine(), "torch_threads": torch.get_num_threads(),
                       "torch": torch.__version__},
    }
    kept = {split: to_uint8(batch[:SAMPLES_KEPT]) for split, batch in images.items() if batch is not None}
    np.savez_compressed(directory / SAMPLES_FILE, **kept)
    atomic_write(directory / RESULT_FILE, lambda tmp: Path(tmp).write_text(json.dumps(result, indent=1)))
    result["cached"] = False
    return result


def _run_one_safely(config, setting, seed, image_tokenizer):
    """Worker entry: a failed run is reported, not fatal to the others."""
    try:
        return run_one(config, setting, seed, image_tokenizer), None
    except Exception as error:  # noqa: BLE001 (reported with its type; the study goes on)
        import traceback

        return None, f"{type(error).__name__}: {error}\n{traceback.format_exc()}"


# ------------------------------------------------------------------------------------------------ the study

def resolve_image_tokenizer(config: StudyConfig) -> dict:
    """Which image tokenizer the runs load, as a small picklable spec. Resolved once in the parent, so worker
    processes never train or fit one at the same time."""
    if config.vqgan_model_path:
        return {"kind": "vqgan", "paths": [str(config.vqgan_model_path), str(config.vqgan_config_path)]}
    if config.image_tokenizer == "patch":
        from .patch_tokenizer import fit_patch_tokenizer

        path = Path(config.runs_dir) / PATCH_TOKENIZER_FILE
        if not path.is_file():
            fit_patch_tokenizer(path)
        return {"kind": "patch", "path": str(path)}
    from dalle_lab.vae import default_vae

    identity = default_vae().identity
    return {"kind": "vqgan", "paths": [str(identity["model_path"]), str(identity["config_path"])]}


def load_image_tokenizer(spec: dict):
    if spec["kind"] == "patch":
        from .patch_tokenizer import PatchCodebookTokenizer

        return PatchCodebookTokenizer.load(spec["path"])
    from dalle_lab.vae import VQGanVAE

    return VQGanVAE(*spec["paths"])


def run_study(config: StudyConfig, log=print, report_every_s: float = 60.0) -> dict:
    """Run every (setting, seed) not yet cached, `config.workers` at a time. The report is rewritten after a
    finished run when `report_every_s` have passed since the last one (plots take seconds), and at the end.
    Returns {"results": [...], "failures": [...], "report": path}."""
    config.check()
    image_tokenizer = resolve_image_tokenizer(config)
    tasks = config.tasks()
    results, failures = [], []
    started = last_report = time.monotonic()

    def finished(task, outcome):
        nonlocal last_report
        (setting, seed), (result, error) = task, outcome
        done = len(results) + len(failures) + 1
        if error is not None:
            failures.append({"setting": setting.name, "seed": seed, "error": error})
            log(f"[{done}/{len(tasks)}] {setting.label} seed {seed} FAILED: {error.splitlines()[0]}")
            return
        results.append(result)
        ev = result["eval"]
        log(f"[{done}/{len(tasks)}] {setting.label} seed {seed}{' (cached)' if result.get('cached') else ''}: "
            f"val accuracy {ev['val'].get('accuracy', math.nan):.3f}, heldout accuracy "
            f"{ev['heldout'].get('accuracy', math.nan):.3f}, val loss_img {ev['val']['loss_img']:.3f} "
            f"[{(time.monotonic() - started) / 60:.1f} min]")
        if time.monotonic() - last_report >= report_every_s:
            write_report(config, results, len(tasks), failures)
            last_report = time.monotonic()

    if config.workers == 1:
        for task in tasks:
            finished(task, _run_one_safely(config, *task, image_tokenizer))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: a fresh interpreter per worker (no forked torch thread pools), threads set per run
        with ProcessPoolExecutor(config.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_run_one_safely, config, *task, image_tokenizer): task for task in tasks}
            for future in as_completed(futures):
                finished(futures[future], future.result())
    report = write_report(config, results, len(tasks), failures)
    return {"results": results, "failures": failures, "report": report}


# ------------------------------------------------------------------------------------------------ command line


def _recipe_in(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--recipe" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--recipe="):
            return arg.split("=", 1)[1]
    return None


def build_parser(quick: bool = False, recipe: str | None = None) -> argparse.ArgumentParser:
    d = base_config(quick, recipe)
    e = d.eval
    p = argparse.ArgumentParser(prog="python -m lab.studies.loss_weighting.run",
                                description="Train the same Shapes model with loss_img_weight x text_seq_len at "
                                            "equal compute over several seeds; write a report with CIs and plots.")
    p.add_argument("--quick", action="store_true",
                   help="the small study: a 1M-parameter model, 250 steps, no caption-noise arm, its own "
                        "out_dir and runs_dir (flags given with it still win)")
    p.add_argument("--recipe", choices=RECIPES, default=None,
                   help="demo: make demo's recipe for this CPU kind (1800 bf16 steps of batch 64 with native bf16, "
                        "else 1000 float32 steps of batch 32), loss_img_weight 1 and 7, 3 seeds, one run at a time, "
                        "the powered two-object evaluation (flags given with it still win)")
    grid = p.add_argument_group("grid")
    grid.add_argument("--loss_img_weights", type=float, nargs="+", default=list(d.loss_img_weights), metavar="W",
                      help="loss = (text + W * image) / (W + 1); 1 as CogView, 7 as DALL-E")
    grid.add_argument("--text_seq_lens", type=int, nargs="+", default=list(d.text_seq_lens), metavar="T",
                      help="text tokens per caption (Shapes captions have at most 12)")
    grid.add_argument("--seeds", type=int, default=d.seeds, help="seeds per setting (0 .. N-1)")
    grid.add_argument("--caption_noise", type=float, default=d.caption_noise,
                      help="the caption-noise arm: every weight again, trained on captions of which this share has "
                           "one attribute changed (0 = no such arm)")
    grid.add_argument("--noise_text_seq_len", type=int, default=d.noise_text_seq_len,
                      help="text_seq_len of the caption-noise arm")
    model = p.add_argument_group("model")
    for name in ("dim", "depth", "heads", "dim_head"):
        model.add_argument(f"--{name}", type=int, default=getattr(d, name))
    train = p.add_argument_group("training (the same for every run)")
    train.add_argument("--steps", type=int, default=d.steps, help="optimizer steps per run")
    train.add_argument("--batch_size", type=int, default=d.batch_size)
    train.add_argument("--learning_rate", type=float, default=d.learning_rate)
    train.add_argument("--warmup_steps", type=int, default=d.warmup_steps)
    train.add_argument("--amp", action=argparse.BooleanOptionalAction, default=d.amp,
                       help="mixed precision (bf16 on CPU; bf16 or fp16 on CUDA)")
    train.add_argument("--device", default=d.device, help="auto|cpu|cuda")
    evaluation = p.add_argument_group("evaluation")
    evaluation.add_argument("--n_val", type=int, default=e.n_val, help="validation captions generated per run")
    evaluation.add_argument("--n_heldout", type=int, default=e.n_heldout,
                            help="held-out composition captions generated per run")
    evaluation.add_argument("--n_loss", type=int, default=e.n_loss, help="samples per split for held-out losses")
    objects = d.objects or TwoObjectEval()
    evaluation.add_argument("--two_object_val", type=int, default=objects.n_val,
                            help="the powered two-object evaluation (with --recipe demo): validation items")
    evaluation.add_argument("--two_object_heldout", type=int, default=objects.n_heldout, help="held-out items")
    evaluation.add_argument("--two_object_samples", type=int, default=objects.samples, help="images per item")
    files = p.add_argument_group("files")
    files.add_argument("--out_dir", default=d.out_dir, help="the report: README.md, results.json, PNG plots")
    files.add_argument("--runs_dir", default=d.runs_dir, help="checkpoints, metrics and cached results per run")
    files.add_argument("--image_tokenizer", choices=IMAGE_TOKENIZERS, default=d.image_tokenizer,
                       help="default: the shipped Shapes VQGAN; patch: a k-means patch codebook fit in seconds "
                            "(a stand-in while no VQGAN is available)")
    files.add_argument("--vqgan_model_path", default=None, help="a taming VQGAN instead (with --vqgan_config_path)")
    files.add_argument("--vqgan_config_path", default=None)
    files.add_argument("--bpe_path", default=None, help="default: the shipped vocabulary")
    run = p.add_argument_group("execution")
    run.add_argument("--workers", type=int, default=d.workers, help="runs trained at the same time")
    run.add_argument("--threads", type=int, default=d.threads, help="torch threads per run")
    run.add_argument("--only_seeds", type=int, nargs="+", default=None, metavar="K",
                     help="train just these of the study's seeds (e.g. to check one run again, with its own "
                          "--runs_dir and --out_dir); the report then covers only them")
    run.add_argument("--note", default=None, help="a paragraph for the top of the report")
    run.add_argument("--import_results", default=None, metavar="RESULTS_JSON",
                     help="first copy the finished runs of an earlier study's results.json into --runs_dir (those "
                          "made with these settings), so only the missing runs are trained")
    run.add_argument("--report_only", action="store_true",
                     help="do not train: rebuild the report from the finished runs in --runs_dir")
    return p


def config_from_args(args: argparse.Namespace) -> StudyConfig:
    """The base settings (--quick, --recipe or the full study) with every flag's value over them."""
    base = base_config(args.quick, args.recipe)
    names = {f.name for f in fields(StudyConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and k not in ("eval", "objects", "recipe")}
    values["loss_img_weights"] = tuple(args.loss_img_weights)
    values["text_seq_lens"] = tuple(args.text_seq_lens)
    values["only_seeds"] = None if args.only_seeds is None else tuple(args.only_seeds)
    values["eval"] = replace(base.eval, n_val=args.n_val, n_heldout=args.n_heldout, n_loss=args.n_loss)
    if base.objects is not None:
        values["objects"] = replace(base.objects, n_val=args.two_object_val, n_heldout=args.two_object_heldout,
                                    samples=args.two_object_samples)
    return replace(base, **values)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser("--quick" in argv, _recipe_in(argv)).parse_args(argv)
    config = config_from_args(args)
    try:
        config.check()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.import_results:
        import_results(config, args.import_results)
    if args.report_only:
        results = collect_cached(config)
        print(f"report of {len(results)} finished runs: {write_report(config, results, len(config.tasks()), [])}")
        return 0
    print(f"{len(config.tasks())} runs ({len(config.settings())} settings x {config.seeds} seeds), "
          f"{config.workers} at a time; report: {config.out_dir}/README.md", flush=True)
    outcome = run_study(config, log=lambda line: print(line, flush=True))
    print(f"report: {outcome['report']}")
    if outcome["failures"]:
        print(f"{len(outcome['failures'])} runs failed; their errors are in the report", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
