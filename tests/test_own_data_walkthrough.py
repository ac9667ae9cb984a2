"""docs/own_data.md, run: every command of its `sh` blocks, in order, on a tiny folder whose captions use words no
shipped vocabulary knows. Each step gets flags appended that make it take seconds (the last flag wins, so the
documented command is otherwise what runs); the published VQGAN is served from a local file:// URL.

The test fails when the page gains, loses or changes a command that is not listed here: nothing in the page goes
unrun. It runs the command lines in this process (their main(argv)), from the folder's parent directory."""
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from own_data_folder import NEW_WORDS, make_photos

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "own_data.md"

TINY_DALLE = ["--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16", "--batch_size", "4",
              "--max_steps", "4", "--warmup_steps", "1", "--sample_every_n_steps", "0", "--save_every_n_steps", "2",
              "--log_every_n_steps", "1", "--no-progress"]
TINY_VAE = ["--image_size", "16", "--ch_mult", "1", "2", "2", "--n_embed", "32", "--steps", "3", "--batch_size", "4",
            "--val_every", "0", "--sample_every", "0", "--save_every", "0", "--threads", "1", "--no-progress"]
TINY_ALIGN = ["--epochs", "1", "--prompts_per_epoch", "2", "--group_size", "2", "--sample_batch_size", "4",
              "--train_batch_size", "4", "--threads", "1", "--eval_loss_images", "4"]

# the page's commands, in order: the flags the test appends to each
STEPS = {
    "python train_dalle.py --image_text_folder photos": [],
    "python train_vae.py --data photos --image_size 64 --max_steps 20000 --output_dir runs/photos_vae": TINY_VAE,
    "python -m dalle_lab.vae.fetch vqgan_imagenet_f16_1024 --to vqgan/": ["--no-progress"],
    "python -m dalle_lab.tokenizers.train --input photos --vocab_size 4096 --output photos.model": [],
    "python train_dalle.py --image_text_folder photos --bpe_path auto --text_seq_len auto "
    "--vqgan_model_path runs/photos_vae/vqgan.ckpt --vqgan_config_path runs/photos_vae/vqgan.yaml "
    "--epochs 100 --output_dir runs/photos": TINY_DALLE,
    "python train_dalle.py --image_text_folder photos --bpe_path auto --text_seq_len auto "
    "--vqgan_model_path vqgan/vqgan_imagenet_f16_1024.ckpt --vqgan_config_path vqgan/vqgan_imagenet_f16_1024.yaml "
    "--epochs 100 --output_dir runs/photos_imagenet": [*TINY_DALLE, "--max_steps", "1"],
    "python train_dalle.py --resume --output_dir runs/photos": ["--no-progress"],
    'python generate.py --dalle_path runs/photos/dalle.pt --text "a blue zorblat beside a red glimmow"':
        ["--num_images", "2", "--batch_size", "2"],
    "cat photos/*.txt > prompts.txt": None,  # a shell line
    "python -m dalle_lab.align --dalle_path runs/photos/dalle.pt --prompts prompts.txt --reward jpeg_compressibility "
    "--epochs 20 --output_dir runs/photos_align": TINY_ALIGN,
}


def documented_commands() -> list[str]:
    """The command lines of the page's ```sh blocks (backslash continuations joined)."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip():
                commands.append(" ".join(line.split()))
    return commands


def test_the_page_holds_exactly_the_commands_this_test_runs():
    assert documented_commands() == list(STEPS)


def _main_of(program: str):
    """The main(argv) behind a documented program name."""
    if program in ("train_dalle.py", "train_vae.py", "generate.py"):
        import importlib.util

        spec = importlib.util.spec_from_file_location(program.replace(".py", "_walkthrough"), ROOT / program)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main
    import importlib

    return importlib.import_module({"dalle_lab.vae.fetch": "dalle_lab.vae.fetch",
                                    "dalle_lab.tokenizers.train": "dalle_lab.tokenizers.train",
                                    "dalle_lab.align": "dalle_lab.align.__main__"}[program]).main


def run_step(command: str, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    extra = STEPS[command]
    if extra is None:
        code = subprocess.run(["bash", "-c", command]).returncode
    else:
        words = shlex.split(command)
        program, argv = (words[2], words[3:]) if words[1] == "-m" else (words[1], words[2:])
        code = _main_of(program)([*argv, *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def published_vqgan(tiny_vqgan, monkeypatch):
    """`fetch vqgan_imagenet_f16_1024` serves a tiny VQGAN from file:// URLs, with its true sha256 expected."""
    import hashlib

    from dalle_lab.vae import fetch

    ckpt, yaml = tiny_vqgan
    entry = fetch.Published(ckpt_url=ckpt.resolve().as_uri(), yaml_url=yaml.resolve().as_uri(), codes=64,
                            approx_mb=1, sha256=hashlib.sha256(ckpt.read_bytes()).hexdigest(), about="tiny")
    monkeypatch.setitem(fetch.PUBLISHED, "vqgan_imagenet_f16_1024", entry)


def test_the_walkthrough_from_a_folder_to_a_fine_tuned_model(tmp_path, monkeypatch, capsys, published_vqgan):
    from dalle_lab.training import loop

    monkeypatch.chdir(tmp_path)
    make_photos(tmp_path / "photos")
    commands = iter(STEPS)

    # 2. no vocabulary, no image tokenizer: stopped before step 1, both named with the commands that make them
    code, _, err = run_step(next(commands), capsys)
    assert code == 1 and "no text vocabulary (--bpe_path) and no image tokenizer" in err
    assert "--bpe_path auto" in err and "python train_vae.py --data photos" in err and not Path("runs").exists()

    # 3. an image tokenizer trained on the folder: held-out PSNR and the speed reported
    code, out, _ = run_step(next(commands), capsys)
    assert code == 0 and " dB on 4 held-out images of photos" in out and "s per 1000 steps (3 steps" in out
    code, out, _ = run_step(next(commands), capsys)  # or the published one, fetched and checked
    assert code == 0 and "matches the expected sha256" in out and Path("vqgan/vqgan_imagenet_f16_1024.ckpt").is_file()

    # 4. a vocabulary by hand (the walkthrough itself uses --bpe_path auto)
    code, out, _ = run_step(next(commands), capsys)
    assert code == 0 and "wrote photos.model" in out

    # 6. train, stopped at step 2 as an interrupted run would be, so that step 7 resumes it
    real_train = loop.train
    monkeypatch.setattr(loop, "train", lambda cfg, overrides, **kw: real_train(cfg, overrides, stop_at_step=2, **kw))
    code, _, err = run_step(next(commands), capsys)
    monkeypatch.setattr(loop, "train", real_train)
    assert code == 0, err
    first = next(line for line in err.splitlines() if line.strip())
    assert first.startswith("vocabulary: ") and "dalle-bpe.model (" in first
    assert "--bpe_path auto: youtokentome trained here on the 48 caption lines of photos" in first
    assert "| image tokenizer: runs/photos_vae/vqgan.ckpt (32 codes, 4x4 grid, 16 px, given)" in first
    assert "--text_seq_len auto: 48 captions of " in err and "does not know" not in err
    checkpoint = torch.load("runs/photos/dalle.pt", weights_only=True)
    assert checkpoint["step"] == 2 and checkpoint["tokenizer"]["path"] == str(tmp_path / "runs/photos/dalle-bpe.model")
    assert checkpoint["config"]["text_seq_len"] % 8 == 0

    code, _, err = run_step(next(commands), capsys)  # with the published VQGAN
    assert code == 0 and "image tokenizer: vqgan/vqgan_imagenet_f16_1024.ckpt (64 codes, 8x8 grid, 32 px" in err

    # 7. resume: the same run continues at step 2 with its recorded vocabulary and VQGAN
    code, _, err = run_step(next(commands), capsys)
    assert code == 0 and "at step 2" in err and "recorded in runs/photos/dalle.pt" in err
    assert torch.load("runs/photos/dalle.pt", weights_only=True)["step"] == 4

    # 8. generate the new words: the vocabulary knows every one of them (no unknown-word warning)
    code, out, err = run_step(next(commands), capsys)
    assert code == 0 and "warning" not in err and len(list(Path("outputs").rglob("*.png"))) >= 2
    assert {"zorblat", "glimmow"} <= set(NEW_WORDS)

    # 9. one epoch of fine-tuning on a reward, prompts from the folder's own captions
    assert run_step(next(commands), capsys)[0] == 0 and len(Path("prompts.txt").read_text().splitlines()) == 48
    code, _, err = run_step(next(commands), capsys)
    assert code == 0, err
    assert Path("runs/photos_align/dalle_aligned.pt").is_file()
    assert next(commands, None) is None
