"""Hyper-parameters of the two fine-tuning paths: one dataclass, saved in every alignment checkpoint.

The command line (`python -m dalle_lab.align`) takes its defaults from these classes, so the library and the CLI
never disagree.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, fields

from dalle_lab.generate import GenerationConfig

METHODS = ("policy_gradient", "reward_backprop", "best_of_n")
TRAINABLE = ("all", "blocks")
CREDITS = ("uniform", "localized", "content")  # which tokens an advantage is credited to: dalle_lab.align.credit
DEFAULT_EPOCHS = 20  # epochs of a run given neither --epochs nor --time_budget_s
_GENERATE = GenerationConfig()  # generate.py's sampling: the RL sampler and the in-run evaluation default to it


@dataclass
class AlignConfig:
    """Everything both paths share, plus the knobs of each (unused ones are ignored by the other path)."""

    method: str = "policy_gradient"  # or "reward_backprop", "best_of_n" (METHODS)
    reward: str = "jpeg_compressibility"  # a name or a weighted sum: "jpeg_compressibility:1+shapes_faithfulness:2"
    epochs: int | None = None  # None: until time_budget_s when one is given, else DEFAULT_EPOCHS
    # the defaults of this block and of the policy-gradient block below are the settings docs/align.md's results were
    # measured with (it says which were compared one by one): 32 prompts x 8 samples per epoch, one optimizer step
    # over all 256 of them
    prompts_per_epoch: int = 32
    group_size: int = 8  # images sampled per prompt per epoch (GRPO's group; DDPO's per-prompt statistics)
    sample_batch_size: int = 128
    train_batch_size: int = 64
    lr: float = 1e-4
    optimizer: str = "adamw"  # or "sgd" (with `momentum`): see trainer.make_optimizer for when it matters
    momentum: float = 0.9
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    kl_coef: float = 0.01  # per-token KL penalty to the frozen starting model (the start value when kl_target is set)
    kl_target: float | None = None  # nats per image: adapt kl_coef so the KL to the start stays near it (kl_control)
    kl_horizon: int = 128  # images: the adaptive coefficient moves by at most 20 % per this many (Ziegler et al.)
    seed: int = 0
    time_budget_s: float | None = None  # seconds of fine-tuning; no epoch starts that is expected to end past it
    lora_rank: int = 0  # 0 = fine-tune every weight; >0 = train only LoRA adapters of this rank
    # which weights fine-tuning moves: "all", or "blocks" = the transformer blocks only (token embeddings, positions
    # and the two logit heads stay frozen). Why: Adam gives every row of the image logit head an update of about
    # `lr` whenever its token is sampled, however rare the token, so on sparse RL batches the tail codes of the
    # codebook gain probability step after step (entropy and KL to the start rise while the reward does not).
    trainable: str = "all"
    # best_of_n: keep a group's best samples only when they score at least this (None: whatever the best scores)
    best_of_n_min_reward: float | None = None
    lora_alpha: float = 16.0
    deepspeed_zero_stage: int | None = None  # None: plain PyTorch; 0, 1 or 2: DeepSpeed's engine at that ZeRO stage

    # sampling: the policy the update optimises is exactly this distribution, so the same settings record the
    # log-probs while sampling and recompute them during the update
    # (defaults: generate.py's GenerationConfig, so RL optimises the distribution users sample from)
    temperature: float = _GENERATE.temperature
    top_k: int | None = _GENERATE.top_k  # keep the k most likely image tokens (counted over the image vocabulary only)
    top_p: float | None = _GENERATE.top_p  # nucleus sampling
    cond_scale: float = _GENERATE.cond_scale  # classifier-free guidance scale; 1 = plain conditional sampling

    # evaluation inside the run (dalle_lab.align.in_run_eval): every eval_every epochs (0 = only before and after),
    # fresh samples with generate.py's sampling for unseen captions, scored by the reward and the Shapes checker
    eval_every: int = 20
    eval_num_prompts: int = 200  # validation captions (never RL prompts) when no eval prompt file is given
    eval_num_heldout: int = 200  # Shapes held-out compositions (colour-shape pairs never trained on); 0 = none
    eval_loss_images: int = 64  # real validation images for the image loss (forgetting); 0 = skip
    eval_diversity_samples: int = 8  # samples of one caption for the diversity measures; 0 = skip
    eval_samples: int = 2  # samples of every evaluation caption (from fixed seeds); >= 2 also gives pixel diversity
    # evaluate the starting model before the first update. Off only where an identical start evaluation exists (same
    # model, evaluation sets, sampling and thread count: it is deterministic), e.g. the other seeds of one study
    eval_at_start: bool = True
    eval_temperature: float = _GENERATE.temperature
    eval_top_k: int | None = _GENERATE.top_k
    eval_cond_scale: float = _GENERATE.cond_scale

    # policy gradient (PPO on per-token probability ratios)
    inner_epochs: int = 1
    # which tokens an image's advantage is credited to (credit.py): "uniform" = all of them; "localized" = each part
    # of the reward to the tokens the reward's credit map names (the Shapes checker: each attribute to the cells of
    # the object it judged); "content" = the cells that show something other than the plain background
    credit: str = "localized"
    clip_range: float = 0.2
    advantage: str = "group"  # "group" (GRPO) or "per_prompt" (DDPO's tracker)
    adv_std: str = "batch"  # group advantages over the batch's reward std ("batch": Flow-GRPO) or the group's (GRPO)
    drop_flat_groups: bool = True  # leave groups whose rewards have no spread out of the update (DAPO)
    # policy gradient: among each group's best samples, weight x (pixel distance to the others - its mean) is added
    # to the reward, so equally good images that differ from the rest are preferred (diversity_bonus.py). 5 kept the
    # Shapes model's held-out images as varied as at the start where 0 lost 22 % of their pixel diversity and 15
    # cost accuracy (docs/align.md, lab/studies/align/results/pilot_bonus*.json)
    diversity_weight: float = 5.0
    # with guidance, which branches the gradient moves: "both", or "conditional" (the caption-free branch is a
    # constant of the update, as in T2I-R1: dalle_lab.align.logprobs.guided_logits)
    guidance_grad: str = "conditional"
    # keep only the RL prompts whose exact-match rate over this many samples lies in (0, 0.9) (0 = keep all): prompts
    # the model always or never gets right give groups without spread (dalle_lab.align.prompts.screen_prompts)
    screen_samples: int = 0
    adv_clip_max: float | None = 5.0
    stat_buffer_size: int = 32
    stat_min_count: int = 16

    # reward backpropagation (straight-through Gumbel-softmax)
    backprop_last_k: int = 16  # gradient flows through the last K sampled image tokens only
    gumbel_tau: float = 1.0

    # issue 7: score with the reward model in a lower precision, measure the gap to float32 on a fraction of samples
    reward_precision: str = "fp32"
    reward_gap_fraction: float = 0.25
    reward_gap_warn: float = 0.1  # warn when the mean |score(precision) - score(fp32)| exceeds this

    # ---- issue 14: exact and scalable RL machinery (kept together at the end to ease merging)
    # Which distributions the KL penalty compares: "sampling" = the policy's and the starting model's sampling
    # distributions (guidance, temperature, renormalised over the sampler's top-k / top-p support), i.e. what is
    # sampled, unconditional branch included; "conditional" = their plain conditional next-token distributions.
    kl_distribution: str = "sampling"
    # Optimizer steps over train_batch_size x processes x gradient_accumulation_steps images, gradients summed over
    # the micro-batches and all-reduced across processes once per step.
    gradient_accumulation_steps: int = 4
    # reward_backprop: AlignProp's randomised truncation. None: always the last backprop_last_k tokens; an int m:
    # each step draws K uniformly from [m, backprop_last_k].
    backprop_last_k_min: int | None = None
    # reward_backprop: how many links of the chain the gradient follows inside the window. 1: each window token's
    # relaxation reaches only its own logits (one pass); d: the relaxed one-hots are fed forward as input embeddings
    # d - 1 times, so token j's gradient also flows through how it shaped tokens j+1.. up to d - 1 links deep (d
    # passes); None: the whole chain of the window (backprop_last_k passes).
    backprop_chain_depth: int | None = 1
    backprop_checkpoint: int = 0  # 1: recompute each pass in the backward (gradient checkpointing) to save memory

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if self.advantage not in ("per_prompt", "group"):
            raise ValueError(f"advantage must be 'per_prompt' or 'group', not {self.advantage!r}")
        if self.group_size < 2 and self.advantage == "group":
            raise ValueError("group advantages need group_size >= 2 (a group of one has no spread)")
        if self.deepspeed_zero_stage not in (None, 0, 1, 2):
            raise ValueError(f"deepspeed_zero_stage must be 0, 1 or 2 (None: plain PyTorch), got "
                             f"{self.deepspeed_zero_stage}")
        if self.backprop_last_k < 1:
            raise ValueError(f"backprop_last_k must be >= 1 (the reward's gradient reaches the model through the last "
                             f"K tokens), got {self.backprop_last_k}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', not {self.optimizer!r}")
        if self.credit not in CREDITS:
            raise ValueError(f"credit must be one of {', '.join(CREDITS)}, not {self.credit!r}")
        if self.credit != "uniform" and self.advantage != "group":
            raise ValueError(f"credit={self.credit!r} splits group advantages over tokens: it needs advantage='group' "
                             f"(got {self.advantage!r}); with per-prompt advantages use credit='uniform'")
        for name, allowed in (("adv_std", ("group", "batch")), ("guidance_grad", ("both", "conditional"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        if self.diversity_weight < 0:
            raise ValueError(f"diversity_weight must be >= 0 (0 turns the bonus off), got {self.diversity_weight}")
        if self.trainable not in TRAINABLE:
            raise ValueError(f"trainable must be one of {', '.join(TRAINABLE)}, not {self.trainable!r}")
        if self.kl_distribution not in ("sampling", "conditional"):
            raise ValueError(f"kl_distribution must be 'sampling' or 'conditional', not {self.kl_distribution!r}")
        if self.backprop_last_k_min is not None and not 1 <= self.backprop_last_k_min <= self.backprop_last_k:
            raise ValueError(f"backprop_last_k_min must be in [1, backprop_last_k={self.backprop_last_k}], got "
                             f"{self.backprop_last_k_min}")
        if self.backprop_chain_depth is not None and self.backprop_chain_depth < 1:
            raise ValueError(f"backprop_chain_depth must be >= 1 or None (the whole window), got "
                             f"{self.backprop_chain_depth}")
        if self.kl_target is not None and (self.kl_target <= 0 or self.kl_coef <= 0):
            raise ValueError(f"kl_target needs a positive target (nats per image) and a positive starting kl_coef, "
                             f"got kl_target={self.kl_target}, kl_coef={self.kl_coef}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be >= 1 (or None: run until time_budget_s), got {self.epochs}")
        if self.screen_samples < 0:
            raise ValueError(f"screen_samples must be >= 0 (0: no screening), got {self.screen_samples}")
        for name in ("prompts_per_epoch", "group_size", "sample_batch_size", "train_batch_size",
                     "inner_epochs", "gradient_accumulation_steps", "eval_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def sampling_kwargs(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "cond_scale": self.cond_scale}

    def generation(self) -> GenerationConfig:
        """How the RL sampler generates: exactly the distribution the update recomputes."""
        return GenerationConfig(**self.sampling_kwargs())

    def eval_sampling(self) -> GenerationConfig:
        return GenerationConfig(top_k=self.eval_top_k, top_p=None, temperature=self.eval_temperature,
                                cond_scale=self.eval_cond_scale)

    @property
    def max_epochs(self) -> float:
        """The epoch limit: `epochs` if given, unlimited when only a time budget is given, else DEFAULT_EPOCHS."""
        if self.epochs is not None:
            return self.epochs
        return math.inf if self.time_budget_s is not None else DEFAULT_EPOCHS

    def limits_text(self) -> str:
        """How the run will end, for the log's first line."""
        parts = []
        if self.max_epochs != math.inf:
            default = "" if self.epochs is not None else " (the default without --time_budget_s)"
            parts.append(f"{self.max_epochs} epochs{default}")
        if self.time_budget_s is not None:
            parts.append(f"{self.time_budget_s:g} s time budget")
        return " or ".join(parts) + (", whichever comes first" if len(parts) > 1 else "")

    @property
    def samples_per_epoch(self) -> int:
        return self.prompts_per_epoch * self.group_size


# Named settings for a goal, applied under the explicit flags (`--preset faithfulness --lr 2e-4` keeps lr 2e-4).
# docs/align.md says why each value is what it is and lab/studies/align/results/ holds the measurements behind them.
PRESETS: dict[str, dict] = {
    # caption faithfulness where the model fails (docs/align.md "Results"): GRPO on the Shapes checker's attribute
    # accuracy with each attribute credited to the cells of the object it judged, the batch's reward std, groups
    # without spread left out, gradients through the captioned branch only, sampling as generate.py does (top-k 10,
    # temperature 0.7, guidance 2), one optimizer step per 256 images (32 prompts x 8), lr 1e-4. These are also
    # AlignConfig's defaults; the preset pins them as measured (tests/test_align_presets.py)
    "faithfulness": dict(reward="shapes_faithfulness", advantage="group", adv_std="batch", credit="localized",
                         drop_flat_groups=True, guidance_grad="conditional", group_size=8, prompts_per_epoch=32,
                         sample_batch_size=128, train_batch_size=64, gradient_accumulation_steps=4, inner_epochs=1,
                         lr=1e-4, kl_coef=0.01, temperature=0.7, top_k=10, cond_scale=2.0, trainable="all",
                         diversity_weight=5.0),
    # smaller JPEG files without hacking the reward: the JPEG reward plus half the checker's attribute accuracy, so
    # an image that stops matching its caption pays for it, and a KL coefficient of 0.03; guided sampling without
    # top-k; per-prompt advantages (uniform credit, both guidance branches); 96 epochs of 16 prompts x 8 samples.
    # Its measurement over seeds, against the plain JPEG reward: lab/studies/align/explorations.md ("Reward hacking
    # against KL strength", lab/studies/align/results/kl_sweep_jpeg_protected_96.json, which
    # tests/test_align_presets.py ties to this preset)
    "jpeg_protected": dict(reward="jpeg_compressibility:1+shapes_faithfulness:0.5", group_size=8,
                           prompts_per_epoch=16, sample_batch_size=64, train_batch_size=32, inner_epochs=1,
                           gradient_accumulation_steps=1, lr=1e-4, kl_coef=0.03, temperature=0.7, top_k=None,
                           cond_scale=2.0, epochs=96, advantage="per_prompt", credit="uniform", adv_std="group",
                           drop_flat_groups=False, guidance_grad="both", diversity_weight=0.0),
}


def preset(name: str, **overrides) -> "AlignConfig":
    """AlignConfig from a named preset, with `overrides` on top."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(sorted(PRESETS))}")
    return AlignConfig(**{**PRESETS[name], **overrides})


def to_dict(config) -> dict:
    return asdict(config)


def from_dict(values: dict, cls=None):
    """Rebuild a config from a checkpoint, ignoring keys this version no longer has (named in the warning)."""
    cls = cls or AlignConfig
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        warnings.warn(f"ignoring unknown {cls.__name__} fields from a checkpoint: {unknown}")
    return cls(**{k: v for k, v in values.items() if k in known})
