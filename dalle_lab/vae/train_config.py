"""The settings of an image-tokenizer training run (train_vae.py's flags come from VAETrainConfig) and the taming
model config they describe (what vqgan.yaml holds)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import taming_format

# Settings that change the network; a resumed run must agree on them with the checkpoint it continues.
MODEL_FIELDS = ("image_size", "n_embed", "embed_dim", "z_channels", "ch", "ch_mult", "num_res_blocks", "gumbel")


@dataclass
class VAETrainConfig:
    """Every setting of a tokenizer training run (train_vae.py's flags come from here). Defaults: the Shapes one."""

    # the network: taming's Encoder/Decoder; 2 ** (len(ch_mult) - 1) downsampling (32 px -> 8x8 tokens)
    image_size: int = 32
    n_embed: int = 512
    embed_dim: int = 32  # for gumbel, taming requires embed_dim == z_channels (set automatically)
    z_channels: int = 64
    ch: int = 32  # multiples of 32 (taming's GroupNorm has 32 groups)
    ch_mult: tuple[int, ...] = (1, 2, 2)
    num_res_blocks: int = 1
    gumbel: bool = False
    # data: a built-in dataset name ("shapes", "emoji"), a folder of images (captions not needed), or
    # WebDataset shards (.tar pattern)
    data: str = "shapes"
    val_data: str | None = None  # shards for validation; folders hold out val_size images themselves
    val_size: int = 512
    seed: int = 0
    # optimisation
    steps: int = 2000  # the Shapes default: checker accuracy ~0.98 in under 5 minutes on 2 CPU cores
    batch_size: int = 16
    lr: float = 2e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05  # cosine decay to lr * min_lr_ratio
    l1_weight: float = 1.0
    l2_weight: float = 1.0
    commitment: float = 0.25
    codebook: str = "ema"  # "ema" (EMA of assigned encoder outputs) or "grad" (taming's codebook loss)
    ema_decay: float = 0.95
    restart_every: int = 50  # steps between dead-code restarts; 0 disables (VQModel only)
    # GumbelVQ only
    temperature_start: float = 1.0
    temperature_end: float = 0.1
    kl_weight: float = 5e-4
    # optional loss terms
    disc_weight: float = 0.0  # > 0 adds a PatchGAN discriminator (hinge loss) after disc_start steps
    disc_start: int = 0
    lpips_path: str | None = None  # TorchScript module lpips(x, y) on images in [-1, 1]; weights you supply
    lpips_weight: float = 1.0
    # bookkeeping
    out_dir: str = "runs/vae"
    resume: bool = True
    val_every: int = 500
    sample_every: int = 500
    save_every: int = 250
    export_half: bool = True  # store the exported tokenizer's weights in fp16 (half the size, same tokens)
    precision: str = "auto"  # "bf16" (autocast; ~1.8x faster on CPUs with avx512_bf16), "fp32", or "auto"
    threads: int | None = None  # torch.set_num_threads; None leaves torch's default
    device: str = "auto"
    progress: bool = True
    # wandb, as train_dalle's: off unless a run name is given (wandb is imported only then)
    wandb_name: str | None = None
    wandb_entity: str | None = None
    wandb_project: str = "dalle_lab"

    def __post_init__(self):
        """Impossible settings are one-line errors naming the flag and a value that works."""
        self.ch_mult = tuple(int(m) for m in self.ch_mult)
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"--precision must be auto, bf16 or fp32, got {self.precision!r}")
        if self.codebook not in ("ema", "grad"):
            raise ValueError(f"--codebook must be ema or grad, got {self.codebook!r}")
        if self.gumbel:
            self.embed_dim = self.z_channels
        if self.ch % 32 or self.ch < 32:
            raise ValueError(f"--ch {self.ch}: taming's GroupNorm needs channel counts that are multiples of 32")
        factor = 2 ** (len(self.ch_mult) - 1)
        if self.image_size < 8 or self.image_size % factor or self.image_size // factor < 2:
            fit = max(factor * 2, round(self.image_size / factor) * factor)
            raise ValueError(f"--image_size {self.image_size} is impossible with --ch_mult "
                             f"{' '.join(map(str, self.ch_mult))}: it downsamples {factor}x, so the size must be a "
                             f"multiple of {factor} and at least {2 * factor} (e.g. --image_size {fit})")
        for name in ("steps", "batch_size", "n_embed", "val_size"):
            low = 0 if name == "steps" else 1
            if getattr(self, name) < low:
                raise ValueError(f"--{name} {getattr(self, name)} must be at least {low}")

    @property
    def fmap_size(self) -> int:
        return self.image_size // 2 ** (len(self.ch_mult) - 1)


def model_config(cfg: VAETrainConfig) -> dict[str, Any]:
    """The taming `model:` section for a training config (what vqgan.yaml holds)."""
    params: dict[str, Any] = {
        "embed_dim": cfg.embed_dim,
        "n_embed": cfg.n_embed,
        "ddconfig": {
            "double_z": False,
            "z_channels": cfg.z_channels,
            "resolution": cfg.image_size,
            "in_channels": 3,
            "out_ch": 3,
            "ch": cfg.ch,
            "ch_mult": list(cfg.ch_mult),
            "num_res_blocks": cfg.num_res_blocks,
            "attn_resolutions": [],
            "dropout": 0.0,
        },
        "lossconfig": dict(taming_format.NO_LOSS),
    }
    if cfg.gumbel:
        params["kl_weight"] = cfg.kl_weight
        # GumbelVQ's constructor requires a temperature schedule; ours lives in the trainer, this one is inert
        params["temperature_scheduler_config"] = {
            "target": "taming.lr_scheduler.LambdaWarmUpCosineScheduler",
            "params": {"warm_up_steps": 0, "max_decay_steps": cfg.steps, "lr_start": cfg.temperature_start,
                       "lr_max": cfg.temperature_start, "lr_min": cfg.temperature_end},
        }
    target = "taming.models.vqgan.GumbelVQ" if cfg.gumbel else "taming.models.vqgan.VQModel"
    return {"base_learning_rate": cfg.lr, "target": target, "params": params}
