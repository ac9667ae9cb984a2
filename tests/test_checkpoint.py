"""The checkpoint format: atomic writes survive a crash, clear errors, identities guard resumes, load_dalle."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from dalle_lab.training import checkpoint as ckpt_io
from dalle_lab.training.config import TrainConfig
from dalle_lab.training.loop import train

TINY_MODEL = dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step training checkpoint of a tiny model on a tiny random VQGAN."""
    from dalle_lab.vae.tiny import make_tiny_vqgan

    root = tmp_path_factory.mktemp("ckpt")
    vq_ckpt, vq_yaml = make_tiny_vqgan(root / "vqgan")
    cfg = TrainConfig(vqgan_model_path=str(vq_ckpt), vqgan_config_path=str(vq_yaml), batch_size=2, max_steps=2,
                      output_dir=str(root / "run"), sample_every_n_steps=0, progress=False)
    result = train(cfg, TINY_MODEL)
    return result.checkpoint_path, (vq_ckpt, vq_yaml)


def test_training_checkpoint_holds_everything_a_resume_needs(trained):
    path, _ = trained
    ckpt = torch.load(path, weights_only=True)  # loads without unpickling arbitrary objects
    for key in ("config", "tokenizer", "vae", "model", "optimizer", "scheduler", "scaler", "step", "epoch",
                "data_position", "rng"):
        assert key in ckpt, key
    assert ckpt["step"] == 2 and ckpt["data_position"] == {"kind": "shapes", "samples": 4}
    assert not any(name.startswith("vae.") or "encoder" in name for name in ckpt["model"])  # no VQGAN weights
    assert set(ckpt["vae"]) >= {"kind", "model_path", "sha256"} and set(ckpt["tokenizer"]) >= {"path", "sha256"}
    assert {"torch", "numpy", "python"} <= set(ckpt["rng"][0])


def test_rng_states_round_trip():
    import random

    import numpy as np

    state = ckpt_io.capture_rng()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(5), random.random()
    ckpt_io.restore_rng(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def test_killed_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = tmp_path / "dalle.pt"
    ckpt_io.save_checkpoint(ckpt_io.make_checkpoint(config={"dim": 1}, tokenizer_identity={}, vae_identity={},
                                                    model={"w": torch.ones(3)}, step=1), path)
    # A second save, killed (SIGKILL) half-way through writing: its torch.save writes some bytes, then hangs.
    script = textwrap.dedent(f"""
        import time, torch
        from dalle_lab.training import checkpoint as ckpt_io
        def slow_save(obj, f):
            with open(f, "wb") as handle:
                handle.write(b"PK-half-written")
                handle.flush()
                print("writing", flush=True)
                time.sleep(60)
        torch.save = slow_save
        ckpt_io.save_checkpoint(ckpt_io.make_checkpoint(config={{"dim": 2}}, tokenizer_identity={{}},
                                vae_identity={{}}, model={{"w": torch.zeros(3)}}, step=2), {str(path)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ckpt = ckpt_io.read_checkpoint(path)
    assert ckpt["step"] == 1 and torch.equal(ckpt["model"]["w"], torch.ones(3))


def test_failed_save_cleans_up_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "dalle.pt"
    ckpt_io.save_checkpoint(ckpt_io.make_checkpoint(config={}, tokenizer_identity={}, vae_identity={}, model={},
                                                    step=1), path)

    def broken_save(obj, f):
        with open(f, "wb") as handle:
            handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        ckpt_io.save_checkpoint({"format": ckpt_io.CHECKPOINT_FORMAT, "step": 2}, path)
    assert ckpt_io.read_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dalle.pt"]  # no temporary file left behind


def test_unreadable_or_foreign_files_get_clear_errors(tmp_path):
    with pytest.raises(ckpt_io.CheckpointError, match="does not exist"):
        ckpt_io.read_checkpoint(tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ckpt_io.CheckpointError, match="not a readable dalle_lab checkpoint"):
        ckpt_io.read_checkpoint(garbage)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")  # torch.load raises an EOFError without a message here
    with pytest.raises(ckpt_io.CheckpointError, match=r"empty.pt is empty \(0 bytes\)"):
        ckpt_io.read_checkpoint(empty)
    cut = tmp_path / "cut.pt"
    torch.save({"format": "x", "w": torch.ones(1000)}, cut)
    cut.write_bytes(cut.read_bytes()[:100])
    with pytest.raises(ckpt_io.CheckpointError, match="cut.pt is not a readable dalle_lab checkpoint"):
        ckpt_io.read_checkpoint(cut)
    foreign = tmp_path / "vae.pt"
    torch.save({"state_dict": {"w": torch.ones(1)}}, foreign)
    with pytest.raises(ckpt_io.CheckpointError, match="not a dalle_lab DALLE checkpoint"):
        ckpt_io.read_checkpoint(foreign)


def test_load_dalle_rebuilds_the_trained_model(trained):
    path, _ = trained
    dalle, tokenizer, vae = ckpt_io.load_dalle(path)
    saved = torch.load(path, weights_only=True)
    assert dalle.config.to_dict() == saved["config"]
    for name, tensor in dalle.state_dict().items():
        assert torch.equal(tensor, saved["model"][name])
    assert tokenizer.identity["sha256"] == saved["tokenizer"]["sha256"]
    assert vae.identity["sha256"] == saved["vae"]["sha256"] and not dalle.training


def test_resume_with_another_image_tokenizer_is_refused(trained, tmp_path):
    from dalle_lab.vae.tiny import make_tiny_vqgan

    path, _ = trained
    other_ckpt, other_yaml = make_tiny_vqgan(tmp_path / "other", n_embed=32)
    cfg = TrainConfig(vqgan_model_path=str(other_ckpt), vqgan_config_path=str(other_yaml), resume=str(path),
                      batch_size=2, max_steps=4, output_dir=str(tmp_path / "run"), progress=False)
    with pytest.raises(ckpt_io.CheckpointError, match="different image tokenizer"):
        train(cfg)


def test_resume_with_another_vocabulary_is_refused(trained, tmp_path):
    from dalle_lab.tokenizers import train_bpe

    path, (vq_ckpt, vq_yaml) = trained
    bpe = tmp_path / "other.json"
    train_bpe(["a tiny vocabulary of other words", "words and more words"], output_path=bpe, vocab_size=60)
    cfg = TrainConfig(vqgan_model_path=str(vq_ckpt), vqgan_config_path=str(vq_yaml), bpe_path=str(bpe),
                      resume=str(path), batch_size=2, max_steps=4, output_dir=str(tmp_path / "run"), progress=False)
    with pytest.raises(ckpt_io.CheckpointError, match="different text tokenizer"):
        train(cfg)


def test_weights_only_checkpoint_cannot_be_resumed_but_can_start_a_run(trained, tmp_path):
    path, (vq_ckpt, vq_yaml) = trained
    full = torch.load(path, weights_only=True)
    weights = tmp_path / "weights.pt"
    ckpt_io.save_checkpoint({k: full[k] for k in ("format", "config", "tokenizer", "vae", "model")}, weights)
    cfg = TrainConfig(resume=str(weights), max_steps=3, output_dir=str(tmp_path / "a"), progress=False)
    with pytest.raises(ckpt_io.CheckpointError, match="cannot be resumed"):
        train(cfg)
    cfg = TrainConfig(dalle_path=str(weights), batch_size=2, max_steps=1, output_dir=str(tmp_path / "b"),
                      sample_every_n_steps=0, progress=False)
    result = train(cfg)  # tokenizer and VAE come from what the checkpoint recorded
    assert result.step == 1


def test_checkpoints_are_durable_before_an_older_one_is_deleted(tiny_vqgan, tmp_path, monkeypatch):
    """fsync the new file, rename it, fsync its folder; only then may rotation delete the oldest step file."""
    from pathlib import Path

    events = []
    real_fsync, real_replace, real_unlink = os.fsync, os.replace, Path.unlink

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("rename", Path(b).name)) or real_replace(a, b))
    monkeypatch.setattr(Path, "unlink", lambda self, **kw: events.append(("delete", self.name)) or
                        real_unlink(self, **kw))
    cfg = TrainConfig(vqgan_model_path=str(tiny_vqgan[0]), vqgan_config_path=str(tiny_vqgan[1]), batch_size=2,
                      max_steps=3, save_every_n_steps=1, keep_n_checkpoints=2, output_dir=str(tmp_path),
                      sample_every_n_steps=0, progress=False, log_every_n_steps=100)
    train(cfg, TINY_MODEL)
    step3 = events.index(("rename", "dalle-step00000003.pt"))
    assert events[step3 - 1][0] == "fsync" and events[step3 - 1][1].startswith(".dalle-step00000003.pt")
    assert events[step3 + 1] == ("fsync", tmp_path.name)  # the folder entry
    latest = events.index(("rename", "dalle.pt"), step3)
    assert events[latest + 1] == ("fsync", tmp_path.name)
    assert events.index(("delete", "dalle-step00000001.pt")) > latest + 1


def test_rotation_deletes_old_steps_with_their_engine_directories_and_never_the_current_or_later_ones(tmp_path):
    """keep 2 at step 3: step 1 goes (its file, then its DeepSpeed directory); steps 4-5 (left by a run resumed
    from an older checkpoint) are not counted or touched; a directory no step file names, and a temporary one an
    interrupted save left, go too."""
    for step in range(1, 6):
        ckpt_io.step_checkpoint_path(tmp_path, "dalle", step).write_bytes(b"x")
        (tmp_path / f"dalle-step{step:08d}.deepspeed").mkdir()
    (tmp_path / "dalle-step00000009.deepspeed").mkdir()  # orphan: its save stopped before the file was written
    (tmp_path / ".dalle-step00000006.deepspeed.abc.tmp").mkdir()  # an interrupted save's temporary directory
    (tmp_path / "other-step00000001.deepspeed").mkdir()  # another run's: not ours to delete
    deleted = ckpt_io.rotate_checkpoints(tmp_path, "dalle", keep_n=2, current_step=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dalle-step00000002.deepspeed", "dalle-step00000002.pt", "dalle-step00000003.deepspeed",
        "dalle-step00000003.pt", "dalle-step00000004.deepspeed", "dalle-step00000004.pt",
        "dalle-step00000005.deepspeed", "dalle-step00000005.pt", "other-step00000001.deepspeed"]
    assert deleted[0].name == "dalle-step00000001.pt"  # the file before any directory


def test_a_run_folder_moved_as_a_whole_still_loads_and_a_different_file_of_the_same_name_is_refused(tmp_path):
    """The vocabulary and image tokenizer a checkpoint recorded are found beside it when their recorded paths are
    gone (a copied or moved run folder); the sha256 checks still refuse another file under the same name."""
    import shutil

    from dalle_lab.model import DALLE
    from dalle_lab.tokenizers import get_tokenizer
    from dalle_lab.tokenizers.vocab import train_bpe
    from dalle_lab.vae import VQGanVAE, make_tiny_vqgan

    run = tmp_path / "run"
    run.mkdir()
    train_bpe([f"a {c} zorblat number {i}" for i, c in enumerate(["red", "blue", "green"] * 10)], 60,
              run / "dalle-bpe.model", backend="yttm")
    tokenizer, vae = get_tokenizer(run / "dalle-bpe.model"), VQGanVAE(*make_tiny_vqgan(run, n_embed=32))
    dalle = DALLE(vae=vae, dim=32, depth=1, heads=2, dim_head=16, num_text_tokens=tokenizer.vocab_size)
    ckpt_io.save_checkpoint(ckpt_io.make_checkpoint(
        config=dalle.config.to_dict(), tokenizer_identity=tokenizer.identity, vae_identity=vae.identity,
        model=ckpt_io.model_state_without_vae(dalle)), run / "dalle.pt")
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(run, moved)
    shutil.rmtree(run)
    loaded, loaded_tokenizer, loaded_vae = ckpt_io.load_dalle(moved / "dalle.pt")
    assert loaded_tokenizer.path == moved / "dalle-bpe.model" and loaded_tokenizer.sha256 == tokenizer.sha256
    assert str(moved) in str(loaded_vae.identity["model_path"])
    train_bpe(["something else entirely"] * 5 + ["a b c d e f g h"], 40, moved / "dalle-bpe.model", backend="yttm")
    with pytest.raises(ckpt_io.CheckpointError, match="needs the text tokenizer it was trained with"):
        ckpt_io.load_dalle(moved / "dalle.pt")
