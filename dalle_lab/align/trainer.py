"""The run machinery both fine-tuning paths share: prompts per epoch, the frozen reference, LoRA, the optimiser,
checkpoints that resume, per-epoch logs, the reward-curve plot, sample grids and the exported model.

A subclass supplies `train_epoch(prompts) -> dict of logged numbers` (policy_gradient.py, reward_backprop.py).
Files written under `out_dir`:
    align_state.pt          everything needed to resume (trainable weights, optimiser, RNG, stat tracker, history)
    log.jsonl               one line of logged numbers per epoch
    reward_curve.png        reward mean +- std against images sampled, and the KL to the starting model
    samples_before.png, samples_after.png   one image per evaluation prompt, same seed
    dalle_aligned.pt        the fine-tuned model in the standard checkpoint format (generate.py loads it)
    eval.jsonl, results.json   the in-run evaluations (in_run_eval.py) and the run's results file
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from dalle_lab.align.config import AlignConfig
from dalle_lab.align.in_run_eval import RunEvaluator, TermRecorder, write_results
from dalle_lab.align.kl_control import KLController
from dalle_lab.align.logprobs import policy_logprobs, sample_with_support
from dalle_lab.align.lora import add_lora, lora_disabled, lora_parameters
from dalle_lab.align.processes import Processes
from dalle_lab.align.prompts import default_eval_sets, screen_prompts, split_rl_prompts
from dalle_lab.align.reward_precision import epoch_reward_gap, set_reward_precision
from dalle_lab.align.run_files import STATE_FILE, RunFiles, base_identity, resume_line
from dalle_lab.align.updates import Updates, chunks  # noqa: F401  (chunks: re-exported)
from dalle_lab.rewards import RewardWorker, get_reward
from dalle_lab.seeding import seeded_generator
from dalle_lab.training.engine import adamw
from dalle_lab.vae.images import decode_images


def make_optimizer(parameters, config: AlignConfig):
    """AdamW, or SGD with momentum (config.optimizer). Why SGD: Adam moves every weight by about `lr` per step
    whatever the gradient's signal-to-noise ratio, and one epoch's RL gradient is mostly noise
    (lab/studies/align/results/gradient_noise.json), so Adam turns it into a random walk of every weight; SGD's step is
    proportional to the gradient, so the weights with small, inconsistent gradients move little."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    return adamw(parameters, lr=config.lr, weight_decay=config.weight_decay)


class AlignTrainer(RunFiles):
    needs_reference = False  # subclasses whose loss has a KL term to the starting model set this
    several_processes = True  # False: the method's epoch is not split across processes (refused under torchrun)

    def __init__(self, dalle, tokenizer, config: AlignConfig, prompts: Sequence[str], out_dir,
                 *, reward: Callable | None = None, eval_prompts: Sequence[str] | None = None,
                 reward_options: dict | None = None, resume: bool = True, log_fn: Callable[[str], None] = print,
                 eval_sets: dict[str, list[str]] | None = None, argv: Sequence[str] | None = None,
                 base_checkpoint=None, wandb: dict | None = None):
        """`base_checkpoint`: the file `dalle` was loaded from; its sha256 is recorded, and a run folder holding the
        fine-tuning of another file is refused. `wandb`: {"name", "entity", "project"} logs every epoch there."""
        if not prompts:
            raise ValueError("fine-tuning needs at least one prompt (--prompts FILE with one caption per line)")
        self.dalle = dalle.eval()  # eval: no dropout, so recorded and recomputed log-probs agree
        self.tokenizer = tokenizer
        self.config = config
        self.load_average_start = os.getloadavg()
        self.out_dir = Path(out_dir)
        self.device = next(p for p in dalle.parameters()).device
        self.processes = Processes(self.device)
        self.log_fn = log_fn if self.processes.is_main else (lambda _: None)
        self.base = base_identity(base_checkpoint) if base_checkpoint is not None else None
        resume = resume and (self.out_dir / STATE_FILE).exists()
        if resume:  # the first line: which run continues, from where (or the refusal, before anything is built)
            self.log_fn(resume_line(self.out_dir, self.base, config))
        elif self.processes.is_main:  # a fresh run: no state of an earlier one may be continued by mistake later
            (self.out_dir / STATE_FILE).unlink(missing_ok=True)
        # evaluation sets (never RL prompts), the KL controller, the results file
        eval_sets = default_eval_sets(config, prompts) if eval_sets is None else eval_sets
        self.prompts = split_rl_prompts(list(prompts), eval_sets, log_fn)
        self.evaluator = RunEvaluator(eval_sets, config)
        self.eval_history: list[dict] = []
        self.kl = KLController(config.kl_coef, config.kl_target, config.kl_horizon)
        self.argv = argv
        self.eval_prompts = list(eval_prompts) if eval_prompts else list(dict.fromkeys(self.prompts))[:8]
        if self.processes.distributed and not self.several_processes:
            raise ValueError(f"--method {config.method} runs in one process only ({self.processes.world_size} were "
                             f"started): launch it without torchrun / the deepspeed launcher")
        if self.processes.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)  # the reward-gap subsample (process 0)

        self.reward_options = dict(reward_options or {})
        if config.reward_precision != "fp32":
            self.reward_options["precision"] = config.reward_precision
        self.reward = reward if reward is not None else get_reward(config.reward, **self.reward_options)
        set_reward_precision(self.reward, config.reward_precision, config.reward)
        # a weighted sum's terms are logged one by one (in_run_eval.TermRecorder)
        self.term_recorder = TermRecorder(self.reward) if getattr(self.reward, "terms", None) else None
        self.reward_worker = RewardWorker(self.scoring_function())

        self.lora_modules = []
        if config.lora_rank > 0:
            self.lora_modules = add_lora(self.dalle, rank=config.lora_rank, alpha=config.lora_alpha)
        self.trainable = self._trainable_parameters()
        self.processes.broadcast_parameters(self.trainable)
        # the reference also serves the in-run evaluation's KL, so it exists whenever the method has a KL term
        self.reference = self._make_reference() if self.needs_reference else None
        self.optimizer = make_optimizer(self.trainable, config)
        # optimizer steps, plain or DeepSpeed, one process or several (updates.py)
        self.updates = Updates(self.dalle, self.trainable, self.optimizer, config, self.processes)
        self.deepspeed = self.updates.deepspeed  # None without DeepSpeed; run_files packs its engine state

        self.screened = config.screen_samples == 0  # the prompt pool is final (screening done or not asked for)
        self.epoch = 0
        self.images_sampled = 0
        self.elapsed_s = 0.0
        self.cpu_s = 0.0
        self._last_epoch_s = 0.0  # duration of the latest epoch: the time-budget check's estimate of the next one
        self.history: list[dict] = []
        self._build_extra_state()
        self.processes.barrier()  # process 0 has created out_dir
        if resume:
            self.load_state(self.out_dir / STATE_FILE)
        self.wandb_run = self.start_wandb(wandb, resume) if self.processes.is_main else None
        if self.processes.is_main:
            self.write_run_file()  # the folder says which run it holds from the start

    # ------------------------------------------------------------ hooks for subclasses

    def _build_extra_state(self) -> None:
        pass

    def scoring_function(self) -> Callable:
        """What the reward worker runs on (images, prompts): the reward (terms recorded for a weighted sum)."""
        return self.term_recorder or self.reward

    def extra_state_dict(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def train_epoch(self, prompts: list[str]) -> dict:
        raise NotImplementedError

    # ------------------------------------------------------------ model plumbing

    def _transformer_parameters(self):
        # DALLE keeps its frozen VAE out of parameters() and state_dict(), so these are the transformer's own.
        return list(self.dalle.named_parameters())

    def _trainable_parameters(self) -> list:
        if self.lora_modules:
            for _, p in self._transformer_parameters():
                p.requires_grad_(False)
            params = lora_parameters(self.dalle)
            for p in params:
                p.requires_grad_(True)
            return params
        params = []
        for name, p in self._transformer_parameters():
            # "blocks": only the transformer blocks learn (config.py says why the heads may stay frozen)
            p.requires_grad_(self.config.trainable == "all" or name.startswith("transformer."))
            if p.requires_grad:
                params.append(p)
        return params

    def _make_reference(self):
        """The frozen starting model. With LoRA the base weights are the reference (adapters switched off), so no
        copy is made; otherwise a deep copy that shares the (frozen) VAE instead of duplicating it."""
        if self.lora_modules:
            return None
        vae = getattr(self.dalle, "vae", None)
        memo = {id(vae): vae} if vae is not None else {}
        reference = copy.deepcopy(self.dalle, memo).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        return reference

    @property
    def has_reference(self) -> bool:
        """Whether the loss has a KL term to the starting model (LoRA runs get it from the adapters switched off)."""
        return self.needs_reference and self.config.kl_coef > 0  # kl_target needs kl_coef > 0 (config checks)

    @torch.no_grad()
    def kl_reference_logprobs(self, text, tokens, support=None):
        """(B, N, V) log-probs of the starting model that the KL penalty compares the policy with: its sampling
        distribution over the sampler's support (kl_distribution="sampling") or its plain conditional one."""
        if self.config.kl_distribution == "conditional":
            return self.reference_logprobs(text, tokens)
        if self.lora_modules:
            with lora_disabled(self.dalle):
                return policy_logprobs(self.dalle, text, tokens, self.config, support)[1]
        return policy_logprobs(self.reference, text, tokens, self.config, support)[1]

    def kl_policy_logprobs(self, processed, model_full):
        """The policy's side of the KL penalty, matching kl_reference_logprobs (see there)."""
        return model_full if self.config.kl_distribution == "conditional" else processed

    @torch.no_grad()
    def reference_logprobs(self, text, tokens):
        """(B, N, V) log-probs of the starting model's plain conditional next-token distribution."""
        if self.lora_modules:
            with lora_disabled(self.dalle):
                logits = self.dalle.logits(text, tokens)
        else:
            logits = self.reference.logits(text, tokens)
        return torch.log_softmax(logits.float(), dim=-1)

    def tokenize(self, prompts: Sequence[str]):
        return self.tokenizer.tokenize(list(prompts), self.dalle.config.text_seq_len).to(self.device)

    @torch.no_grad()
    def sample_tokens(self, text, generator=None):
        """(tokens, log-probs of the sampled tokens under the sampling distribution, the sampler's packed support or
        None): see dalle_lab.align.logprobs. generator None: the global torch RNG."""
        return sample_with_support(self.dalle, text, self.config, generator)

    @torch.no_grad()
    def sample(self, text, generator=None):
        """(images, tokens, log-probs of the sampled tokens under the sampling distribution)."""
        tokens, logprobs, _ = self.sample_tokens(text, generator)
        return decode_images(self.dalle.vae, tokens), tokens, logprobs

    def chunk_generator(self, *key: int):
        """The generator of one chunk of samples: depends on (seed, epoch, chunk, ...) only, so a chunk's samples are
        the same whichever process draws them and after a resume."""
        return seeded_generator(self.device, self.config.seed, *key)

    def sample_chunks(self, num_samples: int) -> list[tuple[int, slice]]:
        """This process's chunks of an epoch's `num_samples` samples: (chunk id, slice), chunks of sample_batch_size
        dealt round-robin over processes."""
        size = self.config.sample_batch_size
        chunks_all = [(c, slice(start, min(start + size, num_samples)))
                      for c, start in enumerate(range(0, num_samples, size))]
        return self.processes.my_share(chunks_all)

    def gather_rows(self, rows: dict, index: torch.Tensor) -> dict:
        """Concatenate every process's rows (dict of tensors, first dim = samples; `index` their global positions)
        into the global epoch, in global order, on this process's device."""
        parts = self.processes.gather_objects({"index": index.cpu(), **{k: v.cpu() for k, v in rows.items()}})
        order = torch.cat([p["index"] for p in parts]).argsort()
        return {k: torch.cat([p[k] for p in parts])[order].to(rows[k].device) for k in rows}

    @property
    def step_size(self) -> int:
        """Samples per optimizer step: train_batch_size x processes x gradient_accumulation_steps."""
        return self.config.train_batch_size * self.processes.world_size * self.config.gradient_accumulation_steps

    def step(self, loss) -> float:
        """One optimiser step on one loss (one micro-batch, this process only); returns the gradient norm."""
        return self.updates.single(loss)

    # ------------------------------------------------------------ logging helpers

    @staticmethod
    def reward_summary(rewards) -> dict:
        rewards = np.asarray(torch.as_tensor(rewards).detach().float().cpu(), dtype=np.float64)
        se = rewards.std(ddof=1) / math.sqrt(len(rewards)) if len(rewards) > 1 else float("nan")
        return {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()), "reward_se": float(se)}

    def reward_precision_gap(self, images, prompts, scores) -> dict:
        """Issue 7: in a lower reward precision, the float32 re-scoring of a share of this epoch's images."""
        return epoch_reward_gap(self.reward, images, prompts, scores, self.config, self.epoch, self.generator)

    # ------------------------------------------------------------ the loop

    def epoch_prompts(self, epoch: int) -> list[str]:
        """`prompts_per_epoch` prompts drawn from the pool (deterministically from seed and epoch), each repeated
        `group_size` times so per-prompt statistics have a group to work with."""
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, epoch])
        pool = list(dict.fromkeys(self.prompts))
        chosen = rng.choice(len(pool), size=cfg.prompts_per_epoch, replace=len(pool) < cfg.prompts_per_epoch)
        return [pool[i] for i in chosen for _ in range(cfg.group_size)]

    def out_of_time(self) -> bool:
        """True when the next epoch would end past `time_budget_s`, judged by how long the last epoch took (so a run
        stays within its budget rather than overshooting it by up to an epoch)."""
        budget = self.config.time_budget_s
        over = budget is not None and self.elapsed_s + self._last_epoch_s > budget
        return self.processes.any(over)  # every process stops at the same epoch

    def stop_reason(self) -> str | None:
        """Which limit ends the run now, in words (None while neither does)."""
        cfg = self.config
        if self.epoch >= cfg.max_epochs:
            return f"epochs: {self.epoch} of --epochs {cfg.max_epochs}"
        if self.out_of_time():
            return (f"time budget: {self.elapsed_s:.0f} s used, the next epoch (~{self._last_epoch_s:.0f} s) would "
                    f"pass --time_budget_s {cfg.time_budget_s:g}")
        return None

    def screen(self) -> None:
        """`screen_samples`: keep the RL prompts the model gets exactly right sometimes but not (almost) always
        (prompts.screen_prompts). Process 0 screens, every process keeps its verdict; the time counts as
        fine-tuning time, and the kept pool is saved in the state, so a resumed run does not screen again."""
        cfg, start = self.config, time.perf_counter()
        kept = None
        if self.processes.is_main:
            generator = seeded_generator(self.device, cfg.seed, 2**31)  # a stream no epoch's chunk uses

            def sample(batch):
                return self.sample(self.tokenize(batch), generator)[0].cpu()

            kept = screen_prompts(sample, self.prompts, cfg.screen_samples, cfg.sample_batch_size, self.log_fn)
        self.prompts = self.processes.gather_objects(kept)[0]
        self.screened = True
        self.elapsed_s += time.perf_counter() - start

    def evaluate_now(self) -> dict:
        """Issue 13 hook: score the current model on the evaluation sets; appended to eval.jsonl and eval_history."""
        row = {"epochs_done": self.epoch, "images_sampled": self.images_sampled,
               "elapsed_s": round(self.elapsed_s, 2), **self.evaluator(self)}
        self.eval_history.append(row)
        with open(self.out_dir / "eval.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        shown = [f"{k[5:]} {v:.4g}" for k, v in row.items()
                 if k.startswith("eval_") and k != "eval_s" and not k.endswith("_se")]
        self.log_fn(f"[align] eval after {self.epoch} epochs ({row['eval_s']:.0f}s): " + ", ".join(shown))
        return row

    def train(self) -> list[dict]:
        cfg = self.config
        wall_start = time.perf_counter()
        self.log_fn(f"[align] {cfg.method} on {cfg.reward}: {len(self.prompts)} RL prompts, "
                    f"{cfg.prompts_per_epoch} x {cfg.group_size} images per epoch; sampling "
                    f"{cfg.sampling_kwargs()}; runs for {cfg.limits_text()}; eval sets "
                    f"{ {k: len(v) for k, v in self.evaluator.eval_sets.items()} } sampled with "
                    f"{vars(self.evaluator.sampling)} every {cfg.eval_every or 'no'} epochs")
        main = self.processes.is_main  # process 0 writes the files and runs the in-run evaluation
        if self.epoch == 0 and not self.history and main:  # a fresh run: no log lines from an earlier run here
            (self.out_dir / "log.jsonl").unlink(missing_ok=True)
            (self.out_dir / "eval.jsonl").unlink(missing_ok=True)
            self.save_grid(self.out_dir / "samples_before.png")
        if main and self.evaluator.active and not self.eval_history and cfg.eval_at_start:
            self.evaluate_now()
        if not self.screened:
            self.screen()
            self.save_state()
        while (reason := self.stop_reason()) is None:
            start, cpu_start = time.perf_counter(), time.process_time()
            prompts = self.epoch_prompts(self.epoch)
            log = self.train_epoch(prompts)
            if self.term_recorder is not None:
                log.update(self.term_recorder.pop_means())
            self._last_epoch_s = time.perf_counter() - start
            self.elapsed_s += self._last_epoch_s
            self.cpu_s += time.process_time() - cpu_start  # load-independent cost (all threads of this process)
            self.images_sampled += len(prompts)
            log = {"epoch": self.epoch, "images_sampled": self.images_sampled,
                   "elapsed_s": round(self.elapsed_s, 2), "cpu_s": round(self.cpu_s, 2), **log}
            if self.has_reference:  # the coefficient this epoch used, then the controller's next one
                log["kl_coef"] = self.kl.coef
                self.kl.update(log.get("kl_ref_image", float("nan")), len(prompts))
            self.epoch += 1
            if main and self.evaluator.active and cfg.eval_every and self.epoch % cfg.eval_every == 0:
                log.update({k: v for k, v in self.evaluate_now().items() if k.startswith("eval_")})
            self.history.append(log)
            if main:
                self._write_log(log)
            self.save_state()  # every process: a collective under DeepSpeed
            if main:
                self.plot_curve()
        self.log_fn(f"[align] stopped: {reason}")
        self.reward_worker.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        final_eval = main and self.evaluator.active and (not self.eval_history
                                                         or self.eval_history[-1]["epochs_done"] != self.epoch)
        if self.processes.any(final_eval):
            if main:
                self.evaluate_now()
            self.save_state()
        if main:
            self.save_grid(self.out_dir / "samples_after.png")
            self.export(self.out_dir / "dalle_aligned.pt")
            # always: the command, config, commit, machine and stop reason, with or without evaluations
            write_results(self.out_dir / "results.json", self, self.argv, reason, time.perf_counter() - wall_start)
            if self.evaluator.active:
                self.plot_curve()
        self.processes.barrier()
        return self.history

    def _write_log(self, log: dict) -> None:
        with open(self.out_dir / "log.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(log) + "\n")
        if self.wandb_run is not None:  # one wandb step per epoch, the epochs done so far
            self.wandb_run.log({k: v for k, v in log.items() if isinstance(v, (int, float))}, step=log["epoch"] + 1)
        shown = ("reward_mean", "reward_std", "kl_ref_image", "approx_kl", "clipfrac", "entropy", "reward_gap")
        parts = [f"{k} {log[k]:.4g}" for k in shown if k in log]
        self.log_fn(f"[align] epoch {log['epoch']} images {log['images_sampled']} "
                    f"{log['elapsed_s']:.0f}s: " + ", ".join(parts))
