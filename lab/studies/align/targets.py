#!/usr/bin/env python
"""Issue 6 section 4 targets on the built-in model: prints the numbers and writes lab/studies/align/results/.

    python -m lab.studies.align.targets --dalle_path runs/dalle/dalle.pt               # all three tasks
    python -m lab.studies.align.targets --dalle_path ... --task jpeg --budget_s 900

jpeg     policy gradient on jpeg_compressibility for at most --budget_s seconds (15 minutes by default); then
         256 fresh samples on the training prompts before and after: reward mean +- SE, the improvement in units
         of the difference's standard error (target >= 3), Shapes checker accuracy change (reward hacking), KL.
shapes   policy gradient on shapes_faithfulness; exact-match rate on held-out validation captions before/after.
compare  policy gradient vs reward backpropagation on the same differentiable reward (negative_total_variation)
         and the same number of sampled images: reward against images sampled, one plot.

Timings on the shared 2-core machine are inflated by other jobs; the log says how many images each run sampled.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from dalle_lab.align.config import AlignConfig
from dalle_lab.align.evaluate import evaluate_model, improvement_in_se
from dalle_lab.align.plots import plot_reward_curves
from dalle_lab.rewards import get_reward
from dalle_lab.training.checkpoint import load_dalle

from lab.common import ROOT as REPO


def shapes_train_prompts(n: int) -> list[str]:
    from dalle_lab.data.shapes import ShapesDataset

    dataset = ShapesDataset("train", length=n, seed=0)
    return [dataset.caption(i) for i in range(n)]


def fine_tune(args, config: AlignConfig, prompts, name: str, method_cls=None):
    from dalle_lab.align.policy_gradient import PolicyGradientTrainer

    dalle, tokenizer, _ = load_dalle(args.dalle_path)
    cls = method_cls or PolicyGradientTrainer
    out = Path(args.runs_dir) / name
    if out.exists():
        shutil.rmtree(out)  # a benchmark measures a fresh run, never a resumed one
    trainer = cls(dalle, tokenizer, config, prompts, out, log_fn=lambda line: print(line, flush=True))
    trainer.train()
    return trainer, out


def copy_figures(out: Path, report: Path, prefix: str) -> None:
    for name in ("reward_curve.png", "samples_before.png", "samples_after.png"):
        if (out / name).exists():
            shutil.copy(out / name, report / f"{prefix}_{name}")


def fmt(result: dict, key: str) -> str:
    se_key = key.replace("_mean", "") + "_se" if key.endswith("_mean") else key + "_se"
    return f"{result[key]:.4f} +- {result[se_key]:.4f}"


def strip(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "images"}


def timed_config(args, reward: str, budget_s: float) -> AlignConfig:
    """The fine-tuning settings of a time-budgeted task: stop on the clock, not on the epoch count."""
    return AlignConfig(reward=reward, epochs=10_000, time_budget_s=budget_s, lr=args.lr, kl_coef=args.kl_coef,
                       prompts_per_epoch=args.prompts_per_epoch, group_size=args.group_size,
                       sample_batch_size=args.batch, train_batch_size=args.batch, seed=0)


def task_jpeg(args, report: Path) -> dict:
    prompts = shapes_train_prompts(args.num_prompts)
    eval_prompts = [prompts[i % len(prompts)] for i in range(args.n_eval)]
    reward = get_reward("jpeg_compressibility")
    config = timed_config(args, "jpeg_compressibility", args.budget_s)
    dalle, tokenizer, _ = load_dalle(args.dalle_path)
    before = evaluate_model(dalle, tokenizer, eval_prompts, reward, config, seed=101)
    print(f"[jpeg] before: reward {fmt(before, 'reward_mean')}, checker accuracy {fmt(before, 'checker_accuracy')}",
          flush=True)
    start = time.perf_counter()
    trainer, out = fine_tune(args, config, prompts, "jpeg")
    wall = time.perf_counter() - start
    after = evaluate_model(trainer.dalle, tokenizer, eval_prompts, reward, config, seed=202,
                           reference=trainer.reference)
    z = improvement_in_se(before, after)
    result = {
        "before": strip(before), "after": strip(after), "improvement_in_se": z,
        "checker_accuracy_change": after["checker_accuracy"] - before["checker_accuracy"],
        "exact_match_change": after["exact_match"] - before["exact_match"],
        "fine_tune_seconds": trainer.elapsed_s, "wall_seconds_incl_grids": wall,
        "epochs": trainer.epoch, "images_sampled": trainer.images_sampled, "config": vars(config).copy(),
    }
    print(f"[jpeg] after {trainer.elapsed_s:.0f}s of fine-tuning ({trainer.images_sampled} images sampled): "
          f"reward {fmt(after, 'reward_mean')}  improvement {z:.2f} standard errors (target >= 3)")
    print(f"[jpeg] checker accuracy {before['checker_accuracy']:.4f} -> {after['checker_accuracy']:.4f}, exact match "
          f"{before['exact_match']:.4f} -> {after['exact_match']:.4f}, KL to start {fmt(after, 'kl_ref_image')} nats")
    copy_figures(out, report, "jpeg")
    return result


def task_shapes(args, report: Path) -> dict:
    from dalle_lab.data.shapes import validation_captions

    prompts = shapes_train_prompts(args.num_prompts)
    held_out = validation_captions(args.n_eval // 2)
    eval_prompts = [caption for caption in held_out for _ in range(2)]
    reward = get_reward("shapes_faithfulness")
    config = timed_config(args, "shapes_faithfulness", args.shapes_budget_s)
    dalle, tokenizer, _ = load_dalle(args.dalle_path)
    before = evaluate_model(dalle, tokenizer, eval_prompts, reward, config, seed=303)
    trainer, out = fine_tune(args, config, prompts, "shapes")
    after = evaluate_model(trainer.dalle, tokenizer, eval_prompts, reward, config, seed=404,
                           reference=trainer.reference)
    result = {"before": strip(before), "after": strip(after),
              "exact_match_change": after["exact_match"] - before["exact_match"],
              "exact_match_change_in_se": improvement_in_se(before, after, "exact_match"),
              "fine_tune_seconds": trainer.elapsed_s, "images_sampled": trainer.images_sampled,
              "held_out_captions": len(held_out)}
    print(f"[shapes] held-out exact match {fmt(before, 'exact_match')} -> {fmt(after, 'exact_match')} "
          f"({result['exact_match_change']:+.4f}); attribute accuracy {before['checker_accuracy']:.4f} -> "
          f"{after['checker_accuracy']:.4f}; KL {fmt(after, 'kl_ref_image')} ({trainer.images_sampled} images, "
          f"{trainer.elapsed_s:.0f}s)")
    copy_figures(out, report, "shapes")
    return result


def task_compare(args, report: Path) -> dict:
    from dalle_lab.align.reward_backprop import RewardBackpropTrainer

    prompts = shapes_train_prompts(args.num_prompts)
    common = dict(reward="negative_total_variation", epochs=args.compare_epochs, lr=args.lr, kl_coef=args.kl_coef,
                  prompts_per_epoch=args.prompts_per_epoch, group_size=args.group_size, sample_batch_size=args.batch,
                  train_batch_size=args.batch, seed=0)
    jpeg, tv = get_reward("jpeg_compressibility"), get_reward("negative_total_variation")
    eval_prompts = [prompts[i % len(prompts)] for i in range(args.n_eval)]

    def measure(dalle, tokenizer, seed):
        """JPEG reward and the TV proxy on the same fresh samples, and how well they agree."""
        from dalle_lab.numerics import spearman

        result = evaluate_model(dalle, tokenizer, eval_prompts, jpeg, AlignConfig(), seed=seed, shapes=False)
        proxy = tv(result["images"]).numpy()
        jpeg_scores = jpeg(result["images"]).numpy()
        return {"jpeg_mean": result["reward_mean"], "jpeg_se": result["reward_se"],
                "tv_mean": float(proxy.mean()), "tv_se": float(proxy.std(ddof=1) / len(proxy) ** 0.5),
                "spearman_jpeg_tv": spearman(jpeg_scores, proxy)}

    dalle, tokenizer, _ = load_dalle(args.dalle_path)
    start = measure(dalle, tokenizer, seed=505)
    print(f"[compare] start: jpeg {start['jpeg_mean']:.4f} +- {start['jpeg_se']:.4f}, TV proxy {start['tv_mean']:.3f}"
          f" +- {start['tv_se']:.3f}, Spearman(jpeg, TV) on these samples {start['spearman_jpeg_tv']:.3f}", flush=True)
    histories, summary = {}, {"start": start}
    for label, method, cls, extra in (
        ("policy gradient (PPO)", "policy_gradient", None, {}),
        ("reward backprop (ST-Gumbel, last K=16)", "reward_backprop", RewardBackpropTrainer,
         {"lr": args.backprop_lr, "backprop_last_k": 16}),
    ):
        config = AlignConfig(method=method, **{**common, **extra})
        trainer, out = fine_tune(args, config, prompts, f"compare_{method}", cls)
        histories[label] = trainer.history
        after = measure(trainer.dalle, tokenizer, seed=606)
        summary[label] = {"first_reward": trainer.history[0]["reward_mean"],
                          "last_reward": trainer.history[-1]["reward_mean"],
                          "images_sampled": trainer.images_sampled, "seconds": trainer.elapsed_s,
                          "fresh_samples_after": after}
        copy_figures(out, report, f"compare_{method}")
        print(f"[compare] {label}: training reward {summary[label]['first_reward']:.3f} -> "
              f"{summary[label]['last_reward']:.3f} over {trainer.images_sampled} images ({trainer.elapsed_s:.0f}s); "
              f"fresh samples: TV {start['tv_mean']:.3f} -> {after['tv_mean']:.3f} +- {after['tv_se']:.3f}, "
              f"jpeg {start['jpeg_mean']:.4f} -> {after['jpeg_mean']:.4f} +- {after['jpeg_se']:.4f}", flush=True)
    plot_reward_curves(histories, report / "compare_reward_vs_images.png",
                       title="negative total variation: PPO vs reward backprop")
    return {"runs": summary, "histories": histories}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dalle_path", default=str(REPO / "runs" / "dalle" / "dalle.pt"))
    parser.add_argument("--task", choices=("jpeg", "shapes", "compare", "all"), default="all")
    parser.add_argument("--budget_s", type=float, default=900.0, help="jpeg fine-tuning budget (target: <= 900)")
    parser.add_argument("--shapes_budget_s", type=float, default=600.0)
    parser.add_argument("--compare_epochs", type=int, default=8)
    parser.add_argument("--n_eval", type=int, default=256)
    parser.add_argument("--num_prompts", type=int, default=64)
    parser.add_argument("--prompts_per_epoch", type=int, default=8)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=AlignConfig.lr)
    parser.add_argument("--backprop_lr", type=float, default=AlignConfig.lr)
    parser.add_argument("--kl_coef", type=float, default=AlignConfig.kl_coef)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 on the shared machine (2 threads under contention ran 10x slower)")
    parser.add_argument("--runs_dir", default=str(REPO / "runs" / "align_bench"))
    parser.add_argument("--report_dir", default=str(REPO / "lab" / "studies" / "align" / "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report = Path(args.report_dir)
    report.mkdir(parents=True, exist_ok=True)
    results_path = report / "targets.json"
    tasks = ("jpeg", "shapes", "compare") if args.task == "all" else (args.task,)
    for task in tasks:
        result = {"task": {"jpeg": task_jpeg, "shapes": task_shapes, "compare": task_compare}[task](args, report),
                  "dalle_path": args.dalle_path, "threads": args.threads,
                  "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        # read just before writing: tasks may run as separate processes side by side
        results = json.loads(results_path.read_text()) if results_path.exists() else {}
        results[task] = result
        results_path.write_text(json.dumps(results, indent=1, default=str))
    print(f"results: {results_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
