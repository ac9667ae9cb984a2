"""The loss-weighting study's settings: one setting of the grid (`Setting`), the whole study (`StudyConfig`), and
the named variants flags start from (the full study, `--quick`, `--recipe demo`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from dalle_lab.evaluate.shapes import EvalSettings

from .two_objects import TwoObjectEval

SAMPLES_FILE = "samples.npz"  # a few generated images per split (uint8), for the report's sample figure
SAMPLES_KEPT = 8
IMAGE_TOKENIZERS = ("default", "patch")
PATCH_TOKENIZER_FILE = "patch_tokenizer.pt"


@dataclass(frozen=True)
class Setting:
    loss_img_weight: float
    text_seq_len: int
    caption_noise: float = 0.0  # share of training captions with one attribute changed (TrainConfig.caption_noise)

    @property
    def name(self) -> str:  # a directory name
        noise = f"_noise{self.caption_noise:g}" if self.caption_noise else ""
        return f"w{self.loss_img_weight:g}_T{self.text_seq_len}{noise}"

    @property
    def label(self) -> str:  # for tables and plots
        noise = f", noise {self.caption_noise:.0%}" if self.caption_noise else ""
        return f"w={self.loss_img_weight:g}, T={self.text_seq_len}{noise}"


@dataclass
class StudyConfig:
    """Every setting of the study. Defaults: the main job's model and schedule, shortened to `steps` (about 1.5 h
    on 2 free cores, 2 runs at a time); `--quick` (QUICK) is the small study that runs in under half of that."""

    # the grid
    loss_img_weights: tuple[float, ...] = (1.0, 7.0)
    text_seq_lens: tuple[int, ...] = (16, 64)  # Shapes captions are at most 12 tokens with the shipped vocab
    seeds: int = 3  # seeds 0 .. seeds-1; a seed fixes the initial weights and the training sample stream
    # the caption-noise arm: every weight again at noise_text_seq_len, trained on captions of which this share has
    # one attribute changed (does the best weighting depend on how noisy the captions are?); 0 = no such arm
    caption_noise: float = 0.25
    noise_text_seq_len: int = 16
    # the model (DALLEConfig fields; the rest keep DALLEConfig's defaults, i.e. the main job's model)
    dim: int = 192
    depth: int = 4
    heads: int = 6
    dim_head: int = 32
    # training (TrainConfig fields): the main job's float32 schedule (scripts/demo.sh) shortened from 1000 steps
    steps: int = 600
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 50
    amp: bool = False
    device: str = "auto"
    log_every_n_steps: int = 5  # loss-curve resolution
    save_every_n_steps: int = 100  # checkpoint interval: how much a killed run loses
    # evaluation
    eval: EvalSettings = field(default_factory=EvalSettings)
    objects: TwoObjectEval | None = None  # the powered two-object evaluation (two_objects.py); None: not run
    compare_to: str | None = None  # an earlier study's results.json whose one-word answer the report quotes beside
    # files
    out_dir: str = "lab/studies/loss_weighting/results"
    runs_dir: str = "runs/loss_weighting"
    # the image tokenizer: "default" = dalle_lab.vae.default_vae() (the shipped Shapes VQGAN), "patch" = a k-means
    # patch codebook fit in seconds (patch_tokenizer.py), for when the VQGAN is not available; VQGAN paths override
    image_tokenizer: str = "default"
    vqgan_model_path: str | None = None
    vqgan_config_path: str | None = None
    bpe_path: str | None = None  # None: the shipped vocabulary
    note: str | None = None  # a paragraph put at the top of the report (e.g. how this run departed from defaults)
    # execution
    workers: int = 2  # runs trained at the same time (separate processes)
    threads: int = 1  # torch threads per run
    only_seeds: tuple[int, ...] | None = None  # train just these seeds (e.g. to check one run again); None: all
    recipe: str | None = None  # the named recipe these settings came from (--recipe), for the report
    progress: bool = True

    def settings(self) -> list[Setting]:
        grid = [Setting(float(w), int(t)) for t in self.text_seq_lens for w in self.loss_img_weights]
        noisy = [Setting(float(w), int(self.noise_text_seq_len), float(self.caption_noise))
                 for w in self.loss_img_weights] if self.caption_noise > 0 else []
        return grid + noisy

    def tasks(self) -> list[tuple[Setting, int]]:
        """Every (setting, seed), seed-major: a study stopped early has the same seeds for every setting."""
        return [(setting, seed) for seed in range(self.seeds) for setting in self.settings()
                if self.only_seeds is None or seed in self.only_seeds]

    def model_overrides(self, setting: Setting) -> dict:
        return dict(dim=self.dim, depth=self.depth, heads=self.heads, dim_head=self.dim_head,
                    text_seq_len=setting.text_seq_len, loss_img_weight=setting.loss_img_weight)

    def quick(self) -> "StudyConfig":
        return replace(self, **QUICK)

    def to_dict(self) -> dict:
        return asdict(self)

    def check(self) -> None:
        if self.seeds < 1:
            raise ValueError(f"--seeds must be at least 1, got {self.seeds} (use 3 or more for confidence intervals)")
        if not self.loss_img_weights or not self.text_seq_lens:
            raise ValueError("give at least one --loss_img_weights value and one --text_seq_lens value")
        if not 0 <= self.caption_noise < 1:
            raise ValueError(f"--caption_noise must be in [0, 1), got {self.caption_noise}")
        if self.steps < 1 or self.batch_size < 1 or self.workers < 1 or self.threads < 1:
            raise ValueError("--steps, --batch_size, --workers and --threads must be positive")
        if self.only_seeds is not None and not set(self.only_seeds) <= set(range(self.seeds)):
            raise ValueError(f"--only_seeds {list(self.only_seeds)}: each must be one of the study's seeds "
                             f"0..{self.seeds - 1}")
        if self.objects is not None:
            self.objects.check()
        if self.image_tokenizer not in IMAGE_TOKENIZERS:
            raise ValueError(f"--image_tokenizer must be one of {IMAGE_TOKENIZERS}, got {self.image_tokenizer!r}")
        if (self.vqgan_model_path is None) != (self.vqgan_config_path is None):
            raise ValueError("give both --vqgan_model_path (.ckpt) and --vqgan_config_path (.yaml), or neither for "
                             "the default Shapes image tokenizer")


# The small study (the report of 30 Nov 2026, tests): a 1M-parameter model, 250 steps, no caption-noise arm
QUICK = dict(dim=128, depth=3, heads=4, dim_head=32, steps=250, warmup_steps=25, caption_noise=0.0,
             out_dir="lab/studies/loss_weighting/results_quick", runs_dir="runs/loss_weighting_quick")



def demo_recipe(native_bf16: bool) -> dict:
    """The study at `make demo`'s recipe for this CPU kind (issue 39): where the CPU computes bf16 natively,
    train_dalle.py's defaults (1800 bf16-autocast steps of batch 64, 100 warm-up steps: TrainConfig); elsewhere
    scripts/demo.sh's float32 recipe (1000 steps of batch 32, 50 warm-up steps). The default model and text_seq_len
    (DALLEConfig), loss_img_weight 1 and 7, 3 seeds, runs one at a time on 2 threads; evaluated with generate.py's
    sampling and the powered two-object evaluation."""
    from dalle_lab.model import DALLEConfig
    from dalle_lab.training.config import TrainConfig

    model, train = DALLEConfig(), TrainConfig()
    if native_bf16:
        schedule = dict(steps=train.max_steps, batch_size=train.batch_size, warmup_steps=train.warmup_steps, amp=True)
    else:
        schedule = dict(steps=1000, batch_size=32, warmup_steps=50, amp=False)  # scripts/demo.sh's DEMO_FP32_STEPS
    kind = "bf16" if native_bf16 else "fp32"
    return dict(schedule, recipe=f"demo ({kind})", loss_img_weights=(1.0, 7.0), text_seq_lens=(model.text_seq_len,),
                seeds=3, caption_noise=0.0, dim=model.dim, depth=model.depth, heads=model.heads,
                dim_head=model.dim_head, learning_rate=train.learning_rate, workers=1, threads=2,
                log_every_n_steps=10, save_every_n_steps=100,
                eval=EvalSettings(top_k=10, temperature=0.7, cond_scale=2.0),  # generate.py's sampling
                objects=TwoObjectEval(), compare_to="lab/studies/loss_weighting/results/results.json",
                out_dir=f"lab/studies/loss_weighting/results_demo_{kind}",
                runs_dir=f"runs/loss_weighting_demo_{kind}")


RECIPES = ("demo",)


def recipe_config(name: str) -> "StudyConfig":
    from dalle_lab.utils import cpu_has_native_bf16

    if name != "demo":
        raise ValueError(f"--recipe must be one of {RECIPES}, got {name!r}")
    return StudyConfig(**demo_recipe(cpu_has_native_bf16()))



def base_config(quick: bool = False, recipe: str | None = None) -> StudyConfig:
    """The settings flags start from: the full study, the quick one or a named recipe."""
    if recipe is not None:
        return recipe_config(recipe)
    return StudyConfig().quick() if quick else StudyConfig()
