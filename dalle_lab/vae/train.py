"""Training an image tokenizer: a taming VQModel (or GumbelVQ) trained with an offline loss, saved in taming's format.

The loss needs no downloaded weights: L1 + L2 reconstruction, the commitment term, codebook updates by EMA (or the
codebook loss with `codebook="grad"`), an optional PatchGAN discriminator (taming's NLayerDiscriminator, hinge
loss), and a perceptual term only when the user gives a TorchScript LPIPS module (`lpips_path`).

Files in `out_dir`:
    vqgan.yaml              the taming model config (load with VQGanVAE(ckpt, vqgan.yaml))
    last.ckpt               taming format + training state (optimizer, EMA codebook statistics, step): resume point
    vqgan.ckpt              the exported tokenizer: taming format, weights only (fp16 with export_half)
    samples/step_XXXXXX.png reconstructions (top rows: inputs, bottom rows: reconstructions)
    metrics.jsonl           one line per validation
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from . import taming_format
from .codebook import EMACodebook, nearest_codes, usage_stats
from .vqgan import codebook_of, decode_latents, encode_to_indices

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
    # data: a built-in dataset name ("shapes", "emoji"), an image-text folder, or WebDataset shards (.tar pattern)
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

    def __post_init__(self):
        self.ch_mult = tuple(int(m) for m in self.ch_mult)
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {self.precision!r}")
        if self.codebook not in ("ema", "grad"):
            raise ValueError(f"codebook must be 'ema' or 'grad', got {self.codebook!r}")
        if self.gumbel:
            self.embed_dim = self.z_channels
        if self.ch % 32:
            raise ValueError(f"ch={self.ch}: taming's GroupNorm needs channel counts that are multiples of 32")
        if self.image_size % 2 ** (len(self.ch_mult) - 1):
            raise ValueError(f"image_size {self.image_size} is not divisible by the downsampling "
                             f"2**{len(self.ch_mult) - 1} that ch_mult={self.ch_mult} implies")

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


# ---------------------------------------------------------------------------------------------------------------
# data


def _is_shards(data: str) -> bool:
    return ".tar" in data


def _datasets(cfg: VAETrainConfig):
    """(train source, validation images or None). The train source is a map-style dataset or shard pattern."""
    from ..data.builtin import BUILTIN_DATASETS, builtin_dataset

    if cfg.data in BUILTIN_DATASETS:
        # Shapes is procedural: a practically endless train split, so every batch is fresh (emoji ignores length)
        train = builtin_dataset(cfg.data, "train", cfg.image_size, length=10**12, seed=cfg.seed)
        val = builtin_dataset(cfg.data, "val", cfg.image_size, length=cfg.val_size, seed=cfg.seed)
        val_items = [val[i] for i in range(min(cfg.val_size, len(val)))]
        return train, val_items
    if _is_shards(cfg.data):
        val_items = None
        if cfg.val_data:
            from ..data.wds import webdataset_dataset

            val_items = []
            for item in webdataset_dataset(cfg.val_data, image_size=cfg.image_size, rank=0, world_size=1):
                val_items.append(item)
                if len(val_items) >= cfg.val_size:
                    break
        return cfg.data, val_items
    if Path(cfg.data).is_dir():
        from torch.utils.data import Subset

        from ..data.folder import TextImageFolder

        folder = TextImageFolder(cfg.data, image_size=cfg.image_size)
        if len(folder) < 2:
            raise ValueError(f"{cfg.data}: found {len(folder)} usable image+caption pairs; need at least 2 "
                             f"(see the folder report: {folder.report})")
        order = torch.randperm(len(folder), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        n_val = min(cfg.val_size, len(folder) // 10) or 1  # hold out at most a tenth of a small folder
        val_items = [folder[i] for i in order[:n_val]]
        return Subset(folder, order[n_val:]), val_items
    raise ValueError(f"data {cfg.data!r} is neither a built-in dataset ({', '.join(BUILTIN_DATASETS)}), "
                     "an existing image-text folder, nor WebDataset shards (a .tar path or brace pattern)")


def _stack(items) -> torch.Tensor:
    return torch.stack([image for image, _ in items])


def image_batches(source, cfg: VAETrainConfig, start_step: int) -> Iterator[torch.Tensor]:
    """Endless (B, 3, H, W) batches in [0, 1] for steps start_step, start_step + 1, ...

    Map-style data is read in a seeded order that depends only on the step, so a resumed run sees exactly the
    batches it would have seen; shards are re-read from the start on resume (webdataset has no random access).
    """
    if isinstance(source, str):  # WebDataset shards
        from ..data.wds import webdataset_loader

        epoch = 0
        while True:
            loader = webdataset_loader(source, batch_size=cfg.batch_size, image_size=cfg.image_size,
                                       shuffle=1000, seed=cfg.seed + epoch)
            for images, _ in loader:
                if images.shape[0] == cfg.batch_size:
                    yield images
            epoch += 1
    size = len(source)
    orders: dict[int, list[int]] = {}  # epoch -> its shuffled order (a batch spans at most two epochs)

    def position_to_index(position: int) -> int:
        epoch, offset = divmod(position, size)
        if epoch not in orders:
            for old_epoch in [e for e in orders if e < epoch - 1]:
                del orders[old_epoch]
            generator = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
            orders[epoch] = torch.randperm(size, generator=generator).tolist()
        return orders[epoch][offset]

    step = start_step
    while True:
        first = step * cfg.batch_size
        if size >= 10**9:  # procedural: just take the next indices
            indices = list(range(first, first + cfg.batch_size))
        else:
            indices = [position_to_index(p) for p in range(first, first + cfg.batch_size)]
        if hasattr(source, "batch"):
            yield source.batch(indices)[0]
        else:
            yield _stack(source[i] for i in indices)
        step += 1


# ---------------------------------------------------------------------------------------------------------------
# evaluation


@torch.no_grad()
def evaluate_reconstructions(model, images: torch.Tensor, gumbel: bool, fmap_size: int,
                             batch_size: int = 128) -> tuple[dict[str, float], torch.Tensor]:
    """Encode to tokens and decode (the inference path); MSE/PSNR in [0, 1] and codebook usage. Returns recons."""
    was_training = model.training
    model.eval()
    codebook = codebook_of(model)
    recons, all_indices = [], []
    device = codebook.device
    for chunk in images.split(batch_size):
        indices = encode_to_indices(model, chunk.to(device), gumbel)
        all_indices.append(indices.flatten())
        recons.append(decode_latents(model, codebook[indices], fmap_size).cpu())
    model.train(was_training)
    recon = torch.cat(recons)
    mse = float(F.mse_loss(recon, images.cpu()))
    counts = torch.bincount(torch.cat(all_indices), minlength=codebook.shape[0])
    metrics = {"val_mse": mse, "val_psnr": 10 * math.log10(1 / max(mse, 1e-10))}
    metrics.update({f"val_{k}": v for k, v in usage_stats(counts).items()})
    return metrics, recon


def shapes_accuracy(recon: torch.Tensor, captions: list[str]) -> dict[str, float]:
    """The Shapes checker on reconstructions: does the tokenizer keep every attribute the captions state?"""
    from ..data.checker import evaluate

    result = evaluate(recon, captions)
    return {"checker_accuracy": result["accuracy"], "checker_exact": result["exact_match"]}


# ---------------------------------------------------------------------------------------------------------------
# training


def _lr_at(step: int, cfg: VAETrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _temperature_at(step: int, cfg: VAETrainConfig) -> float:
    """Gumbel temperature: exponential decay from temperature_start to temperature_end over the run."""
    progress = min(1.0, step / max(1, cfg.steps))
    return cfg.temperature_start * (cfg.temperature_end / cfg.temperature_start) ** progress


@dataclass
class _Run:
    """Everything that changes while training (and is saved in last.ckpt)."""

    model: Any
    optimizer: torch.optim.Optimizer
    ema: EMACodebook | None
    discriminator: Any = None
    disc_optimizer: torch.optim.Optimizer | None = None
    step: int = 0
    history: list = field(default_factory=list)


class Float32GroupNorm(torch.nn.GroupNorm):
    """GroupNorm computed in float32 inside bf16 autocast. Same parameters and state-dict keys as taming's.

    Autocast hands GroupNorm bf16 activations, and the CPU kernels for bf16 GroupNorm (backward above all) are
    about twice as slow as the float32 ones: swapping them in makes a training step ~1.4x faster on the CPU,
    and it is the more accurate of the two.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.float())


def _float32_groupnorms(module: torch.nn.Module) -> torch.nn.Module:
    for name, child in module.named_children():
        if type(child) is torch.nn.GroupNorm:
            swapped = Float32GroupNorm(child.num_groups, child.num_channels, child.eps, child.affine)
            swapped.load_state_dict(child.state_dict())
            setattr(module, name, swapped)
        else:
            _float32_groupnorms(child)
    return module


def _build_run(cfg: VAETrainConfig, device) -> _Run:
    model = _float32_groupnorms(taming_format.build_model(model_config(cfg))).to(device).train()
    ema = None
    if not cfg.gumbel:
        codebook = codebook_of(model)
        if cfg.codebook == "ema":
            codebook.requires_grad_(False)
        ema = EMACodebook(codebook, decay=cfg.ema_decay)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=cfg.lr, betas=(0.9, 0.99))
    run = _Run(model, optimizer, ema)
    if cfg.disc_weight > 0:
        from .taming_compat import import_taming

        import_taming()
        from taming.modules.discriminator.model import NLayerDiscriminator, weights_init

        depth = max(1, min(3, int(math.log2(cfg.image_size)) - 3))  # keep >= 2x2 patch logits on small images
        run.discriminator = NLayerDiscriminator(input_nc=3, ndf=32, n_layers=depth).apply(weights_init).to(device)
        run.disc_optimizer = torch.optim.Adam(run.discriminator.parameters(), lr=cfg.lr, betas=(0.5, 0.9))
    return run


def _state_dict_with_loss(run: _Run) -> dict[str, torch.Tensor]:
    """Model weights plus, as in published checkpoints, the discriminator under `loss.discriminator.`"""
    state = dict(run.model.state_dict())
    if run.discriminator is not None:
        state.update({f"loss.discriminator.{k}": v for k, v in run.discriminator.state_dict().items()})
    return state


def _save(run: _Run, cfg: VAETrainConfig, path: Path) -> None:
    from ..utils import atomic_torch_save

    train_state = {"torch_rng": torch.get_rng_state(), "history": run.history}
    if run.ema is not None:
        train_state["codebook"] = run.ema.state_dict()
    optimizers = [run.optimizer.state_dict()]
    if run.disc_optimizer is not None:
        optimizers.append(run.disc_optimizer.state_dict())
    atomic_torch_save({"state_dict": _state_dict_with_loss(run), "global_step": run.step,
                       "optimizer_states": optimizers, "train_state": train_state,
                       "train_config": asdict(cfg)}, path)


def _resume(run: _Run, cfg: VAETrainConfig, path: Path) -> None:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    saved = checkpoint.get("train_config", {})
    def comparable(value):
        return tuple(value) if isinstance(value, (list, tuple)) else value

    different = [f"{k}: checkpoint {saved[k]!r} vs now {getattr(cfg, k)!r}" for k in MODEL_FIELDS
                 if k in saved and comparable(saved[k]) != comparable(getattr(cfg, k))]
    if different:
        raise ValueError(f"{path} was trained with other model settings ({'; '.join(different)}); "
                         "use another out_dir, the same settings, or resume=False to start over")
    state = checkpoint["state_dict"]
    run.model.load_state_dict({k: v for k, v in state.items() if not k.startswith(taming_format.LOSS_PREFIX)})
    if run.discriminator is not None:
        prefix = "loss.discriminator."
        disc_state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if disc_state:
            run.discriminator.load_state_dict(disc_state)
    run.optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    if run.disc_optimizer is not None and len(checkpoint["optimizer_states"]) > 1:
        run.disc_optimizer.load_state_dict(checkpoint["optimizer_states"][1])
    train_state = checkpoint.get("train_state", {})
    if run.ema is not None and "codebook" in train_state:
        run.ema.load_state_dict(train_state["codebook"])
    if "torch_rng" in train_state:
        torch.set_rng_state(train_state["torch_rng"])
    run.history = list(train_state.get("history", []))
    run.step = int(checkpoint["global_step"])


def _quantize(run: _Run, cfg: VAETrainConfig, h: torch.Tensor):
    """Training-time quantisation: (z_q with straight-through gradients, quantizer loss, code ids, flat z)."""
    model = run.model
    if cfg.gumbel:
        z_q, kl_loss, (_, _, indices) = model.quantize(h, temp=_temperature_at(run.step, cfg))
        return z_q, kl_loss, indices.flatten(), None
    z = h.permute(0, 2, 3, 1).reshape(-1, h.shape[1])  # (B*h*w, d), row-major like taming
    codebook = codebook_of(model)
    indices = nearest_codes(z.detach(), codebook.detach())
    chosen = codebook[indices]
    loss = cfg.commitment * F.mse_loss(z, chosen.detach())
    if cfg.codebook == "grad":
        loss = loss + F.mse_loss(chosen, z.detach())
    z_q = z + (chosen - z).detach()
    z_q = z_q.reshape(h.shape[0], h.shape[2], h.shape[3], -1).permute(0, 3, 1, 2)
    return z_q, loss, indices, z.detach()


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `precision` on `device` (None: plain fp32)."""
    if precision == "fp32":
        return None
    if precision == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        from dalle_lab.utils import cpu_has_native_bf16

        return torch.bfloat16 if cpu_has_native_bf16() else None
    return torch.bfloat16


def _train_step(run: _Run, cfg: VAETrainConfig, images: torch.Tensor, lpips, amp_dtype) -> dict[str, float]:
    model = run.model
    for group in run.optimizer.param_groups:
        group["lr"] = _lr_at(run.step, cfg)
    x = images * 2 - 1  # taming's range
    autocast = torch.autocast(x.device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None)
    with autocast:
        h = model.quant_conv(model.encoder(x))
    # nearest-code search and the codebook statistics need fp32: bf16 distances pick the wrong codes
    z_q, q_loss, indices, z = _quantize(run, cfg, h.float())
    with autocast:
        x_rec = model.decode(z_q)
    x_rec = x_rec.float()
    rec_loss = cfg.l1_weight * (x_rec - x).abs().mean() + cfg.l2_weight * (x_rec - x).pow(2).mean()
    loss = rec_loss + q_loss
    logs = {"rec": rec_loss.item(), "q": q_loss.item()}
    if lpips is not None:
        p_loss = lpips(x_rec, x).mean()
        loss = loss + cfg.lpips_weight * p_loss
        logs["lpips"] = p_loss.item()
    use_disc = run.discriminator is not None and run.step >= cfg.disc_start
    if use_disc:
        g_loss = -run.discriminator(x_rec).mean()
        loss = loss + cfg.disc_weight * g_loss
        logs["g"] = g_loss.item()
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    run.optimizer.step()
    if use_disc:
        d_loss = F.relu(1 - run.discriminator(x)).mean() + F.relu(1 + run.discriminator(x_rec.detach())).mean()
        run.disc_optimizer.zero_grad(set_to_none=True)
        d_loss.backward()
        run.disc_optimizer.step()
        logs["d"] = d_loss.item()
    if run.ema is not None:
        run.ema.update(z, indices, ema=cfg.codebook == "ema")
        if cfg.restart_every and (run.step + 1) % cfg.restart_every == 0:
            logs["restarted"] = run.ema.restart_dead(z)
    logs["loss"] = loss.item()
    logs["batch_psnr"] = 10 * math.log10(4 / max(float((x_rec.detach() - x).pow(2).mean()), 1e-10))
    logs["batch_codes"] = int(indices.unique().numel())
    return logs


def export_tokenizer(cfg: VAETrainConfig, checkpoint_path: str | os.PathLike, ckpt_out: str | os.PathLike,
                     yaml_out: str | os.PathLike) -> tuple[Path, Path]:
    """Write a slim copy of a training checkpoint: weights only (fp16 with export_half) + the yaml."""
    state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)["state_dict"]
    state = {k: (v.half() if cfg.export_half and v.is_floating_point() else v)
             for k, v in state.items() if not k.startswith(taming_format.LOSS_PREFIX)}
    from ..utils import atomic_torch_save

    taming_format.write_config(model_config(cfg), yaml_out)
    atomic_torch_save({"state_dict": state}, ckpt_out)
    return Path(ckpt_out), Path(yaml_out)


def load_perceptual(path: str | os.PathLike, device) -> Any:
    """A user-supplied perceptual distance `f(x, y) -> per-image distances`, images in [-1, 1], frozen.

    `.pt2`: a torch.export program (torch.export.save); anything else: a TorchScript file (torch.jit.save).
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"lpips_path {path} does not exist (a torch.export .pt2 or TorchScript file)")
    if str(path).endswith(".pt2"):
        module = torch.export.load(str(path)).module().to(device)
    else:
        module = torch.jit.load(str(path), map_location=device).eval()
    for parameter in module.parameters():  # a frozen judge (ScriptModules have no requires_grad_)
        parameter.requires_grad_(False)
    return module


def train_vae(cfg: VAETrainConfig) -> dict[str, Any]:
    """Train (or resume) a tokenizer per `cfg`; returns the final validation metrics and the written paths."""
    from tqdm import tqdm

    from ..utils import pick_device

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    yaml_path = taming_format.write_config(model_config(cfg), out / "vqgan.yaml")
    last = out / "last.ckpt"

    torch.manual_seed(cfg.seed)
    run = _build_run(cfg, device)
    if cfg.resume and last.is_file():
        _resume(run, cfg, last)
    amp_dtype = resolve_precision(cfg.precision, device)
    lpips = load_perceptual(cfg.lpips_path, device) if cfg.lpips_path else None

    train_source, val_items = _datasets(cfg)
    val_images = _stack(val_items) if val_items else None
    val_captions = [caption for _, caption in val_items] if val_items else None
    batches = image_batches(train_source, cfg, run.step)

    def validate() -> dict[str, Any]:
        metrics: dict[str, Any] = {"step": run.step}
        if val_images is not None:
            scores, recon = evaluate_reconstructions(run.model, val_images, cfg.gumbel, cfg.fmap_size)
            metrics.update(scores)
            if cfg.data == "shapes":  # the checker costs ~3 ms per image: cheap enough for every validation
                metrics.update(shapes_accuracy(recon, val_captions))
        run.history.append(metrics)
        with open(out / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(metrics) + "\n")
        return metrics

    def save_samples() -> None:
        from ..viz.grid import save_grid

        images = val_images[:16] if val_images is not None else next(batches)[:16]
        _, recon = evaluate_reconstructions(run.model, images, cfg.gumbel, cfg.fmap_size)
        save_grid(torch.cat([images, recon]), out / "samples" / f"step_{run.step:06d}.png", nrow=8, scale=2)

    started, cpu_started, start_step = time.time(), time.process_time(), run.step
    bar = tqdm(total=cfg.steps, initial=run.step, disable=not cfg.progress, desc="train_vae", dynamic_ncols=True)
    metrics: dict[str, Any] = {}
    while run.step < cfg.steps:
        logs = _train_step(run, cfg, next(batches).to(device), lpips, amp_dtype)
        run.step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{logs['loss']:.4f}", psnr=f"{logs['batch_psnr']:.1f}", codes=logs["batch_codes"],
                        refresh=False)
        if cfg.val_every and run.step % cfg.val_every == 0 and run.step < cfg.steps:
            metrics = validate()
            bar.write(f"step {run.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()
                                                         if isinstance(v, float)))
        if cfg.sample_every and run.step % cfg.sample_every == 0:
            save_samples()
        if cfg.save_every and run.step % cfg.save_every == 0:
            _save(run, cfg, last)
    bar.close()

    metrics = validate()
    metrics["train_seconds"] = time.time() - started
    metrics["train_cpu_seconds"] = time.process_time() - cpu_started
    metrics["steps_this_run"] = run.step - start_step
    metrics["precision"] = "bf16" if amp_dtype is not None else "fp32"
    _save(run, cfg, last)
    save_samples()
    ckpt_path, _ = export_tokenizer(cfg, last, out / "vqgan.ckpt", yaml_path)
    metrics.update({"checkpoint": str(ckpt_path), "config": str(yaml_path), "last": str(last)})
    return metrics
