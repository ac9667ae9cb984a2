"""Diagnostics with power for the policy gradient on held-out compositions (lab/studies/align/README.md).

    python -m lab.studies.align.diagnostics headroom --dalle_path D   # room in the model's own samples
    python -m lab.studies.align.diagnostics noise --dalle_path D      # how much of one batch's gradient is signal
    python -m lab.studies.align.diagnostics step --dalle_path D       # does a step along it go uphill?

- headroom: for held-out captions (the taught-compositions evaluation set) and validation captions, `--samples`
  images each under the RL sampling with and without top-k; accuracy, exact match, best-of-n, and the share of
  captions / (caption, attribute) pairs that are never, sometimes or always right (only "sometimes" gives a group
  spread), and the accuracy of each attribute.
- noise: `--repeats` independent batches of `--batch` images (prompts drawn from the RL pool), each one's policy
  gradient (the PPO objective at ratio 1, no KL term) under every estimator variant on the same samples; the mean
  pairwise cosine between batches estimates the share of one batch's gradient that is signal,
  |g|^2 / (|g|^2 + noise^2); its standard error is the jackknife's over batches.
- step: one gradient over `--batch` images, the weights moved by eta along its unit ascent direction, the expected
  reward measured on fresh samples of the held-out evaluation captions with the same random numbers at every eta
  (paired differences, their standard error), with the KL to the start per image at each eta; the control is the
  gradient of the same samples with the advantages shuffled within each group (no signal, the same noise).

Results files (written only by this script): results/diagnostics_<kind>.json with the command, commit, CPU kind, load,
settings and raw values (the machine through lab.common.write_results).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

from dalle_lab.align.config import AlignConfig, to_dict
from dalle_lab.align.credit import token_advantages
from dalle_lab.align.evaluate import sequence_kl
from dalle_lab.align.logprobs import policy_logprobs
from dalle_lab.align.policy_gradient import PolicyGradientTrainer, ppo_clipped_loss
from dalle_lab.align.prompts import heldout_protocol
from dalle_lab.data.checker import check
from dalle_lab.rewards.credit import CreditedScores, uniform_credit
from dalle_lab.stats import mean_se
from dalle_lab.training.checkpoint import load_dalle
from dalle_lab.vae.images import decode_images
from lab.common import git_state, write_results
from lab.studies.align.compositions import RESULTS

# estimator variants compared on the same samples: (credit, adv_std, guidance_grad)
VARIANTS = {f"{credit}_{std}_{branch}": (credit, std, branch) for credit in ("uniform", "localized")
            for std in ("group", "batch") for branch in ("both", "conditional")}


def make_trainer(args, **overrides) -> PolicyGradientTrainer:
    """A policy-gradient trainer on the taught-compositions RL prompts, no KL term, no in-run evaluation."""
    dalle, tokenizer, _ = load_dalle(args.dalle_path, torch.device("cpu"))
    settings = dict(reward="shapes_faithfulness", advantage="group", credit="localized", kl_coef=0.0,
                    group_size=args.group, prompts_per_epoch=args.batch // args.group, sample_batch_size=args.group * 8,
                    top_k=args.top_k, temperature=0.7, cond_scale=2.0, seed=args.seed, eval_num_prompts=200,
                    eval_num_heldout=200)
    config = AlignConfig(**{**settings, **overrides})
    prompts, sets = heldout_protocol(config)
    return PolicyGradientTrainer(dalle, tokenizer, config, prompts, tempfile.mkdtemp(prefix="align_diag_"),
                                 eval_sets={}, resume=False, log_fn=lambda _: None), sets


def variant_advantages(batch, prompts, variant: str) -> torch.Tensor:
    credit, std, _ = VARIANTS[variant]
    credited = CreditedScores(batch["rewards"], batch["reward_parts"], batch["credit_maps"])
    if credit == "uniform":
        credited = uniform_credit(batch["rewards"], batch["tokens"].shape[1])
    return token_advantages(prompts, credited, std, clip=5.0)[0]


def batch_gradient(trainer, batch, advantages, guidance_grad: str, params) -> torch.Tensor:
    """The flat gradient of the PPO objective at ratio 1 (no KL) over the batch, in micro-batches of 64."""
    config = AlignConfig(**{**to_dict(trainer.config), "guidance_grad": guidance_grad})
    trainer.dalle.zero_grad(set_to_none=True)
    n = len(batch["tokens"])
    for index in torch.arange(n).split(64):
        support = batch["support"][index] if "support" in batch else None
        sampled = policy_logprobs(trainer.dalle, batch["text"][index], batch["tokens"][index], config, support)[0]
        loss, _ = ppo_clipped_loss(sampled, batch["old_logprobs"][index], advantages[index], 0.2)
        (loss * len(index) / n).backward()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params]).clone()


def jackknife_cosine(gradients: list[torch.Tensor]) -> dict:
    """Mean pairwise cosine of the gradients and its jackknife standard error over gradients."""
    g = torch.stack(gradients).double()
    g = g / g.norm(dim=1, keepdim=True)
    cos = (g @ g.T).numpy()
    r = len(gradients)
    pairs = [(i, j) for i, j in itertools.combinations(range(r), 2)]
    mean = float(np.mean([cos[i, j] for i, j in pairs]))
    leave_out = [np.mean([cos[i, j] for i, j in pairs if k not in (i, j)]) for k in range(r)]
    se = float(np.sqrt((r - 1) / r * np.sum((np.asarray(leave_out) - np.mean(leave_out)) ** 2)))
    return {"mean_cosine": mean, "se": se, "pairs": len(pairs), "cosines": [float(cos[i, j]) for i, j in pairs]}


def noise(args) -> dict:
    trainer, _ = make_trainer(args)
    params = [p for p in trainer.dalle.parameters() if p.requires_grad]
    blocks = torch.cat([torch.full((p.numel(),), name.startswith("transformer."))
                        for name, p in trainer.dalle.named_parameters() if p.requires_grad])
    grads = {v: [] for v in args.variants}
    for repeat in range(args.repeats):
        trainer.epoch = 1000 + repeat  # independent prompts and samples per repeat
        prompts = trainer.epoch_prompts(trainer.epoch)
        batch = trainer.collect(prompts)
        for variant in args.variants:
            advantages = variant_advantages(batch, prompts, variant)
            grads[variant].append(batch_gradient(trainer, batch, advantages, VARIANTS[variant][2], params))
        print(f"repeat {repeat}: reward {batch['rewards'].mean():.3f}", flush=True)
    out = {}
    for variant, gs in grads.items():
        out[variant] = {"all_weights": jackknife_cosine(gs), "blocks": jackknife_cosine([g[blocks] for g in gs])}
        print(f"{variant}: cosine {out[variant]['all_weights']['mean_cosine']:.4f} +- "
              f"{out[variant]['all_weights']['se']:.4f}", flush=True)
    return {"variants": {v: VARIANTS[v] for v in args.variants}, "config": to_dict(trainer.config), "results": out}


def shuffled_within_groups(advantages, prompts, generator) -> torch.Tensor:
    out = advantages.clone()
    names = np.asarray(prompts, dtype=object)
    for prompt in dict.fromkeys(prompts):
        index = torch.as_tensor(np.flatnonzero(names == prompt))
        out[index] = advantages[index[torch.randperm(len(index), generator=generator)]]
    return out


def step(args) -> dict:
    trainer, sets = make_trainer(args)
    variant = args.variants[0]
    params = [p for p in trainer.dalle.parameters() if p.requires_grad]
    prompts = trainer.epoch_prompts(2000)
    batch = trainer.collect(prompts)
    advantages = variant_advantages(batch, prompts, variant)
    shuffled = shuffled_within_groups(advantages, prompts, torch.Generator().manual_seed(args.seed))
    directions = {name: -batch_gradient(trainer, batch, adv, VARIANTS[variant][2], params)
                  for name, adv in (("gradient", advantages), ("shuffled_control", shuffled))}
    start = [p.detach().clone() for p in params]
    captions = [c for c in sets["heldout"][:args.eval // 2] for _ in range(2)]

    def move(eta, direction):
        unit, offset = direction / direction.norm(), 0
        with torch.no_grad():
            for p, p0 in zip(params, start):
                p.copy_(p0 + eta * unit[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def measure():
        scores, kls = [], []
        with torch.no_grad():
            for chunk, begin in enumerate(range(0, len(captions), 128)):
                part = captions[begin:begin + 128]
                text = trainer.tokenize(part)
                tokens, _, _ = trainer.sample_tokens(text, trainer.chunk_generator(77, chunk))
                images = decode_images(trainer.dalle.vae, tokens).float().cpu()
                scores += [check(image, caption).accuracy for image, caption in zip(images, part)]
                kls.append(sequence_kl(trainer.dalle, trainer.reference, text, tokens, trainer.config))
        return np.asarray(scores), np.concatenate(kls)

    move(0.0, directions["gradient"])
    before, _ = measure()
    out = {"variant": VARIANTS[variant], "start_accuracy": float(before.mean()), "eval_images": len(captions),
           "gradient_norms": {k: float(d.norm()) for k, d in directions.items()}, "steps": []}
    for name, direction in directions.items():
        for eta in args.etas:
            move(eta, direction)
            after, kl = measure()
            diff, diff_se = mean_se(after - before)
            out["steps"].append({"direction": name, "eta": eta, "accuracy": float(after.mean()),
                                 "difference": diff, "difference_se": diff_se, "kl_ref_image": float(kl.mean())})
            print(f"{name} eta {eta:+.3f}: accuracy {after.mean():.4f} ({diff:+.4f} +- {diff_se:.4f}), KL "
                  f"{kl.mean():.2f} nats/image", flush=True)
    move(0.0, directions["gradient"])
    return out | {"config": to_dict(trainer.config)}


def headroom(args) -> dict:
    trainer, sets = make_trainer(args)
    out = {}
    for top_k in (10, None):
        trainer.config = AlignConfig(**{**to_dict(trainer.config), "top_k": top_k})
        for name in ("heldout", "val"):
            captions = sets[name][:args.captions]
            repeated = [c for c in captions for _ in range(args.samples)]
            results = []
            with torch.no_grad():
                for chunk, begin in enumerate(range(0, len(repeated), 128)):
                    part = repeated[begin:begin + 128]
                    tokens, _, _ = trainer.sample_tokens(trainer.tokenize(part), trainer.chunk_generator(55, chunk))
                    images = decode_images(trainer.dalle.vae, tokens).float().cpu()
                    results += [check(image, caption) for image, caption in zip(images, part)]
            out[f"{name}_top_k_{top_k}"] = headroom_summary(results, len(captions), args.samples)
            print(f"{name} top_k {top_k}: {json.dumps({k: v for k, v in out[f'{name}_top_k_{top_k}'].items() if not isinstance(v, (list, dict))})}", flush=True)
    return out


def headroom_summary(results, captions: int, samples: int) -> dict:
    acc = np.asarray([r.accuracy for r in results]).reshape(captions, samples)
    exact = np.asarray([r.exact for r in results], dtype=float).reshape(captions, samples)
    pair_rates = [np.mean([r.attributes[a] for r in results[c * samples:(c + 1) * samples]])
                  for c in range(captions) for a in results[c * samples].attributes]
    per_attribute: dict[str, list] = {}
    for r in results:
        for a, ok in r.attributes.items():
            per_attribute.setdefault(a.rstrip("12"), []).append(ok)

    def shares(rates):
        rates = np.asarray(rates)
        return {"never": float(np.mean(rates == 0)), "sometimes": float(np.mean((rates > 0) & (rates < 1))),
                "always": float(np.mean(rates == 1))}

    return {"accuracy": float(acc.mean()), "exact_match": float(exact.mean()), "best_of_n_accuracy":
            float(acc.max(1).mean()), "captions_exact": shares(exact.mean(1)), "attribute_pairs": shares(pair_rates),
            "per_attribute_accuracy": {a: float(np.mean(v)) for a, v in per_attribute.items()},
            "exact_rate_per_caption": exact.mean(1).tolist()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("headroom", "noise", "step"))
    parser.add_argument("--dalle_path", required=True)
    parser.add_argument("--batch", type=int, default=256, help="images per gradient (noise, step)")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=16, help="noise: independent batches")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS),
                        default=["uniform_group_both", "uniform_batch_conditional", "localized_batch_conditional"])
    parser.add_argument("--etas", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2, 0.5, 1.0])
    parser.add_argument("--eval", type=int, default=512, help="step: images per expected-reward measurement")
    parser.add_argument("--captions", type=int, default=128, help="headroom: captions per set")
    parser.add_argument("--samples", type=int, default=8, help="headroom: samples per caption")
    parser.add_argument("--top_k", type=lambda s: None if s == "none" else int(s), default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tag", default="", help="appended to the results file's name")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started, load = time.time(), os.getloadavg()
    values = {"headroom": headroom, "noise": noise, "step": step}[args.kind](args)
    record = {"command": [sys.executable, *sys.argv], "git": git_state(),
              "threads": args.threads, "load_average_start": load, "load_average_end": os.getloadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "seconds": round(time.time() - started, 1),
              "args": vars(args), **values}
    write_results(record, RESULTS / f"diagnostics_{args.kind}{args.tag}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
