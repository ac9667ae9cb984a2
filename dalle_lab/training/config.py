"""TrainConfig: every setting of a training run that is not a model hyper-parameter (those live in DALLEConfig).

train_dalle.py builds one from its flags; tests and notebooks build one directly. Defaults are the main job's:
the built-in Shapes data with fresh batches of 64, bf16 autocast on the CPU, a fixed step budget.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class TrainConfig:
    # data: no folder and no shards -> the built-in `dataset` ("shapes": rendered fresh every step; "emoji": the
    # Twemoji drawings, epoch by epoch), with that dataset's shipped text vocabulary and image tokenizer
    dataset: str = "shapes"
    image_text_folder: str | None = None  # a folder of image + .txt pairs, or with `wds` the shard url(s)
    wds: str | None = None  # set (e.g. "jpg,txt", as DALLE-pytorch) to read WebDataset shards from image_text_folder
    truncate_captions: bool = False  # cut captions longer than text_seq_len (else: an error before step 1)
    skip_long_captions: bool = False  # leave such captions (and images left without one) out, reported
    num_workers: int = 0
    # image_text_folder images: a random square crop covering this fraction of the largest square or more, then
    # resized (DALLE-pytorch's RandomResizedCrop lower bound; it defaulted to 0.75). 1: the centre crop, no randomness
    random_resize_crop_lower_ratio: float = 1.0
    # built-in shapes only: this share of captions (each sample's own draw from (seed, index)) has one attribute
    # changed while the image stays true, to study training on partly wrong captions (issue 19). 0: exact captions
    caption_noise: float = 0.0

    # tokenizers
    bpe_path: str | None = None  # None: the shipped vocabulary
    vqgan_model_path: str | None = None  # None (with no config path): the default Shapes image tokenizer
    vqgan_config_path: str | None = None
    discrete_vae_path: str | None = None  # a DALLE-pytorch DiscreteVAE file (vae/discrete.py) instead of a VQGAN

    # budget: training stops at whichever of these comes first (Shapes is an endless stream: use steps/minutes)
    epochs: int | None = None
    max_steps: int | None = 1800
    max_minutes: float | None = None

    # optimisation
    batch_size: int = 64  # per process and per micro-batch; global batch = batch_size * ga_steps * processes
    ga_steps: int = 1
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    clip_grad_norm: float = 0.5  # 0 turns clipping off (the norm is still logged)
    warmup_steps: int = 100
    lr_decay: str = "cosine"  # cosine | linear | constant | plateau
    min_lr_ratio: float = 0.1
    plateau_patience: int = 200
    plateau_factor: float = 0.5
    max_nonfinite: int = 5  # stop after this many non-finite losses in a row (each one is skipped)

    # precision, device, processes
    # mixed precision, on by default because bf16 autocast needs ~40% less CPU time per step than float32 here:
    # bf16 autocast on CPU; bf16 (or fp16 + loss scaling) on CUDA. --no-amp trains in float32.
    amp: bool = True
    amp_dtype: str = "auto"
    device: str = "auto"
    seed: int = 42
    deepspeed: bool = False
    deepspeed_config: str | None = None  # a user's DeepSpeed JSON: honoured; only what it leaves out is filled
    zero_stage: int | None = None  # None: the user's config decides, else 0
    # recompute each transformer block in the backward instead of storing its activations: less memory, ~1/3 more
    # compute, the same numbers (so a resume may switch it freely)
    gradient_checkpointing: bool = False
    flops_profiler: bool = False  # DeepSpeed's flops profiler: one detailed report of the run's last step

    # files
    output_dir: str = "runs/dalle"
    dalle_output_file_name: str = "dalle"
    dalle_path: str | None = None  # start from these weights (a training checkpoint is resumed, see `resume`)
    resume: str | None = None  # a checkpoint to continue exactly; "latest" = output_dir/<name>.pt
    save_every_n_steps: int = 500
    keep_n_checkpoints: int | None = 2
    sample_every_n_steps: int = 500  # a grid PNG of generated samples (0: never)
    sample_captions: list[str] = field(default_factory=list)  # empty: a few validation captions of the data
    log_every_n_steps: int = 10

    # wandb (imported only when wandb_name is given)
    wandb_name: str | None = None
    wandb_entity: str | None = None
    wandb_project: str = "dalle_lab"

    # the console progress bar (off in tests)
    progress: bool = True

    def to_dict(self) -> dict:
        return asdict(self)
