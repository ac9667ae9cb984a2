"""Where a run's text vocabulary and image tokenizer come from: decided here and nowhere else (the training loop,
train_dalle.py's --taming and the pretokenize command all ask this module).

In this order:
1. objects handed to train() (tests, notebooks) are used as they are;
2. a checkpoint the run continues or starts from (--resume, --dalle_path): the ones it recorded, unless a flag
   names a file, which must then be the same file (hashes are checked);
3. the flags: --bpe_path FILE, or --bpe_path auto (a youtokentome vocabulary trained here on the folder's captions
   and saved beside the checkpoint); --vqgan_model_path with --vqgan_config_path, or a DALLE-pytorch DiscreteVAE
   (--vae_path FILE.pt);
4. pre-tokenized data: the VQGAN its index recorded;
5. the built-in datasets (no --image_text_folder): their shipped vocabulary and image tokenizer;
6. the user's own data (a folder or WebDataset shards) with either of them missing, or token shards without a
   vocabulary: MissingTokenizerError, naming what is missing and the commands that make it. The built-in Shapes
   vocabulary (200 tokens) would spell a photo's caption letter by letter, and its 32-pixel tokenizer of flat
   shapes cannot draw a photo: a run that silently used them would train for hours on nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from dalle_lab.data.builtin import check_builtin
from dalle_lab.data.folder import iter_folder_captions
from dalle_lab.data.tokens import TokenShards, check_vae, is_token_dir, read_index
from dalle_lab.tokenizers import get_tokenizer
from dalle_lab.tokenizers.vocab import minimum_vocab_size, train_bpe
from dalle_lab.vae.default import default_vae
from dalle_lab.vae.discrete import load_discrete_vae
from dalle_lab.vae.vqgan import VQGanVAE

from . import checkpoint as ckpt_io
from .config import TrainConfig
from .distributed import DistInfo, barrier, env_dist_info, init_process_group
from .errors import MissingTokenizerError

AUTO = "auto"  # --bpe_path auto, --text_seq_len auto
AUTO_VOCAB_LIMITS = (512, 16384)  # the smallest and largest vocabulary --bpe_path auto trains
PUBLISHED_VQGAN = "vqgan_imagenet_f16_1024"  # what the messages suggest fetching (dalle_lab.vae.fetch)


@dataclass
class RunTokenizers:
    text: object  # a dalle_lab.tokenizers TextTokenizer
    vae: object  # a VQGanVAE (or any object with its interface)
    text_origin: str  # how it was chosen, for the first log line
    vae_origin: str

    def describe(self) -> str:
        """The first line of a run's log: which vocabulary and image tokenizer it uses, and why."""
        vae = self.vae
        where = getattr(vae, "model_path", None) or getattr(vae, "path", None) or type(vae).__name__
        return (f"vocabulary: {self.text.path} ({self.text.vocab_size} tokens, {self.text_origin}) | image "
                f"tokenizer: {where} ({vae.num_tokens} codes, {vae.fmap_size}x{vae.fmap_size} grid, "
                f"{vae.image_size} px, {self.vae_origin})")


def user_data(cfg: TrainConfig) -> bool:
    """The run reads the user's own images (a folder or shards), not a built-in dataset or token shards."""
    return bool(cfg.image_text_folder) and not token_dir(cfg)


def token_dir(cfg: TrainConfig) -> bool:
    """--image_text_folder names pre-tokenized data (a directory with the index pretokenize writes)."""
    return bool(cfg.image_text_folder) and not cfg.wds and is_token_dir(cfg.image_text_folder)


def auto_vocab_path(cfg: TrainConfig) -> Path:
    """Where --bpe_path auto writes its vocabulary: beside the checkpoint, <output_dir>/<name>-bpe.model."""
    return Path(cfg.output_dir) / f"{cfg.dalle_output_file_name}-bpe.model"


def choose_tokenizers(cfg: TrainConfig, init_ckpt: dict | None = None, init_path=None, *, tokenizer=None, vae=None,
                      dist: DistInfo | None = None, device="cpu") -> RunTokenizers:
    """The run's text tokenizer and image tokenizer (see the module docstring for the order). `init_ckpt` is the
    checkpoint the run resumes or starts from (read from `init_path`); `device` is the run's (for the process
    group that --bpe_path auto waits on)."""
    dist = dist or env_dist_info()
    check_user_data_has_tokenizers(cfg, init_ckpt, given_text=tokenizer is not None, given_vae=vae is not None)
    vae, vae_origin = _image_tokenizer(cfg, init_ckpt, init_path, vae)
    tokenizer, text_origin = _text_tokenizer(cfg, init_ckpt, init_path, tokenizer, dist, device)
    if token_dir(cfg):  # the codes mean something only to the VQGAN that made them (it still decodes samples)
        check_vae(read_index(cfg.image_text_folder), vae.identity, cfg.image_text_folder)
    if init_ckpt:
        ckpt_io.check_identities(init_ckpt, tokenizer.identity, vae.identity, init_path)
    return RunTokenizers(tokenizer, vae, text_origin, vae_origin)


# ------------------------------------------------------------------------------------------------ refusals

def check_user_data_has_tokenizers(cfg: TrainConfig, init_ckpt: dict | None, given_text: bool = False,
                                   given_vae: bool = False) -> None:
    """The user's own data needs its own vocabulary and image tokenizer: stop before step 1 naming what is missing
    and the commands that make it. A checkpoint to continue from brings both."""
    if not cfg.image_text_folder or init_ckpt:
        return
    missing_text = cfg.bpe_path is None and not given_text
    # token shards keep the VQGAN they were made with; their captions still need a vocabulary
    missing_vae = (user_data(cfg) and cfg.vqgan_model_path is None and cfg.vqgan_config_path is None
                   and not cfg.discrete_vae_path and not given_vae)
    if not (missing_text or missing_vae):
        return
    data = cfg.image_text_folder
    missing = " and ".join(what for what, gone in (("no text vocabulary (--bpe_path)", missing_text),
                                                   ("no image tokenizer (--vqgan_model_path with "
                                                    "--vqgan_config_path)", missing_vae)) if gone)
    lines = [f"{data} is your own data, but this run has {missing}; the built-in Shapes ones would read it wrongly "
             f"(a 200-token vocabulary that spells your words letter by letter, a 32-pixel tokenizer of flat "
             f"shapes). Make {'them' if missing_text and missing_vae else 'it'} (docs/own_data.md):"]
    if missing_text:
        lines.append("  vocabulary:      " + vocabulary_advice(cfg))
    if missing_vae:
        lines.append("  image tokenizer: " + image_tokenizer_advice(data))
    raise MissingTokenizerError("\n".join(lines))


def vocabulary_advice(cfg: TrainConfig) -> str:
    if cfg.wds:
        return ("python -m dalle_lab.tokenizers.train --input captions.txt --vocab_size 8192 --output my.model "
                "(captions.txt: your captions, one a line), then --bpe_path my.model")
    return "--bpe_path auto (trains one on the folder's captions before step 1 and saves it beside the checkpoint)"


def image_tokenizer_advice(data: str) -> str:
    return (f"python train_vae.py --data {data} --image_size 64 --output_dir runs/my_vae, then --vqgan_model_path "
            f"runs/my_vae/vqgan.ckpt --vqgan_config_path runs/my_vae/vqgan.yaml; or a published one: python -m "
            f"dalle_lab.vae.fetch {PUBLISHED_VQGAN} --to vqgan/ (about 1 GB, once)")


def taming_without_paths(data: str) -> str:
    """The message for DALLE-pytorch's --taming with no VQGAN files, on the user's own data."""
    return (f"--taming without --vqgan_model_path/--vqgan_config_path: DALLE-pytorch downloaded the ImageNet VQGAN "
            f"at this point, but nothing downloads during a run here, and the built-in Shapes tokenizer cannot draw "
            f"{data}. Fetch the published one once (python -m dalle_lab.vae.fetch {PUBLISHED_VQGAN} --to vqgan/) "
            f"and pass --vqgan_model_path vqgan/{PUBLISHED_VQGAN}.ckpt --vqgan_config_path "
            f"vqgan/{PUBLISHED_VQGAN}.yaml, or train one (python train_vae.py --data {data} ...)")


# ------------------------------------------------------------------------------------------------ image tokenizer

def _image_tokenizer(cfg: TrainConfig, init_ckpt, init_path, vae):
    if vae is not None:
        return vae, "given"
    if (cfg.vqgan_model_path is None) != (cfg.vqgan_config_path is None):
        neither = "" if user_data(cfg) else f", or neither for the default image tokenizer of --dataset {cfg.dataset}"
        raise ValueError(f"give both --vqgan_model_path (.ckpt) and --vqgan_config_path (.yaml){neither}")
    if cfg.vqgan_model_path:
        return VQGanVAE(cfg.vqgan_model_path, cfg.vqgan_config_path), "given"
    if cfg.discrete_vae_path:  # DALLE-pytorch's DiscreteVAE file (--vae_path x.pt)
        return load_discrete_vae(cfg.discrete_vae_path), "given"
    if init_ckpt:
        return ckpt_io.vae_from_identity(init_ckpt["vae"], init_path), f"recorded in {init_path}"
    if token_dir(cfg):  # the VQGAN the tokens were made with, as recorded
        index = read_index(cfg.image_text_folder)
        return ckpt_io.vae_from_identity(index["vae"], cfg.image_text_folder), \
            f"recorded in {cfg.image_text_folder}"

    name = check_builtin(cfg.dataset)
    return default_vae(dataset=name), f"shipped for --dataset {name}"


def image_tokenizer_for_pretokenize(data: str, model_path=None, config_path=None, dataset: str | None = None):
    """The VQGAN that pretokenize encodes the user's data with: the one the paths name, or the built-in dataset's
    when --dataset names one explicitly; neither is MissingTokenizerError, as for training."""
    if (model_path is None) != (config_path is None):
        raise ValueError("give both --vqgan_model_path (.ckpt) and --vqgan_config_path (.yaml)")
    if model_path:
        return VQGanVAE(model_path, config_path)
    if dataset is None:
        raise MissingTokenizerError(f"{data} needs an image tokenizer to be encoded with: "
                                    + image_tokenizer_advice(data) + " (or --dataset shapes|emoji for a built-in one)")

    return default_vae(dataset=check_builtin(dataset))


# ------------------------------------------------------------------------------------------------ text vocabulary

def _text_tokenizer(cfg: TrainConfig, init_ckpt, init_path, tokenizer, dist: DistInfo, device):
    if tokenizer is not None:
        return tokenizer, "given"
    if init_ckpt and cfg.bpe_path in (None, AUTO):  # its model's text embedding was trained on that vocabulary
        return ckpt_io.tokenizer_from_identity(init_ckpt["tokenizer"], init_path), f"recorded in {init_path}"
    if init_ckpt and _is_recorded_file(cfg.bpe_path, init_ckpt["tokenizer"]):
        # the file the checkpoint recorded, named again (as a DALLE-pytorch resume command does): read it the way
        # the checkpoint does (a converted model's DALLE-pytorch tokenizer kind, not this package's default)
        recorded = {**init_ckpt["tokenizer"], "path": str(Path(cfg.bpe_path).expanduser())}
        return ckpt_io.tokenizer_from_identity(recorded, init_path), f"recorded in {init_path}, file given"
    if cfg.bpe_path == AUTO:
        return train_auto_vocab(cfg, dist, device)
    if cfg.bpe_path is not None:
        return get_tokenizer(cfg.bpe_path), "given"
    name = check_builtin(cfg.dataset)
    return get_tokenizer(None, dataset=name), f"shipped for --dataset {name}"


def _is_recorded_file(bpe_path, identity: dict) -> bool:
    """--bpe_path names the very file (by sha256) the checkpoint's tokenizer identity recorded."""
    from dalle_lab.utils import file_sha256

    path = Path(bpe_path).expanduser()
    return path.is_file() and identity.get("sha256") is not None and file_sha256(path) == identity["sha256"]


def auto_vocab_size(captions: int, needed: int) -> int:
    """--bpe_path auto's vocabulary size: 64 * ceil(sqrt(captions)) within AUTO_VOCAB_LIMITS, and never fewer than
    the captions' characters need. It grows slowly with the data: 40 captions -> 512, 10k -> 6400, a million or
    more -> 16384 (DALLE-pytorch's users trained with vocabularies of about that size)."""
    low, high = AUTO_VOCAB_LIMITS
    return max(needed, min(high, max(low, 64 * math.ceil(math.sqrt(captions)))))


def train_auto_vocab(cfg: TrainConfig, dist: DistInfo, device):
    """--bpe_path auto: a youtokentome vocabulary trained on the data's caption lines, written beside the
    checkpoint (rank 0 trains it; the other processes wait, then load the same file)."""
    path = auto_vocab_path(cfg)
    captions = _caption_lines(cfg)
    size = auto_vocab_size(len(captions), minimum_vocab_size(captions))
    if dist.distributed:
        init_process_group(dist, device)  # DeepSpeed would set it up later (and keeps it); the others wait now
    if dist.is_main:
        path.parent.mkdir(parents=True, exist_ok=True)
        train_bpe(captions, size, path, backend="yttm")
    barrier()
    low, high = AUTO_VOCAB_LIMITS
    return get_tokenizer(path), (f"--bpe_path auto: youtokentome trained here on the {len(captions)} caption lines "
                                 f"of {cfg.image_text_folder}; size asked {size} = 64 x ceil(sqrt({len(captions)})) "
                                 f"within {low}-{high}, fewer when the captions allow no more merges")


def _caption_lines(cfg: TrainConfig) -> list[str]:
    """Every caption line of the run's data, for --bpe_path auto (a folder or token shards: their lines are known
    before training; WebDataset shards are not read twice)."""
    if cfg.wds or not cfg.image_text_folder:
        raise ValueError("--bpe_path auto trains a vocabulary on an --image_text_folder's caption files; for "
                         + ("WebDataset shards, " + vocabulary_advice(cfg) if cfg.wds else
                            f"the built-in --dataset {cfg.dataset}, leave --bpe_path out: it ships its own"))
    if token_dir(cfg):
        return [line for _, _, line in TokenShards(cfg.image_text_folder).numbered_caption_lines()]

    return list(iter_folder_captions(cfg.image_text_folder))

