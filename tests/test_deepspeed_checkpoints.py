"""DeepSpeed checkpoints on disk: each rank's engine files in a directory beside the checkpoint file that names
them, written durably before that file, rotated with it and checked on resume; the old packed layout still
resumes; and the saved weights are DeepSpeed's float32 master weights, also where DeepSpeed trains a bf16 module
(its "bf16" section runs on the CPU too), at ZeRO 0-3."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from dalle_lab.training.checkpoint import CheckpointError, save_checkpoint  # noqa: E402
from dalle_lab.training.loop import train  # noqa: E402

from test_training_deepspeed import TINY_MODEL, ds_config  # noqa: E402
from test_training_resume import assert_same_weights  # noqa: E402

STEPS = 4


def record_file_events(monkeypatch, events: list) -> None:
    """Append (what, path) for every fsync, rename and deletion (file or directory tree)."""
    real_fsync, real_replace, real_unlink, real_rmtree = os.fsync, os.replace, Path.unlink, shutil.rmtree

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("rename", str(b))) or real_replace(a, b))
    monkeypatch.setattr(Path, "unlink", lambda self, **kw: events.append(("delete", str(self))) or
                        real_unlink(self, **kw))
    monkeypatch.setattr(shutil, "rmtree", lambda path, *a, **kw: events.append(("rmtree", str(path))) or
                        real_rmtree(path, *a, **kw))


@pytest.fixture(scope="module")
def zero2_runs(tiny_vqgan, tmp_path_factory):
    """(straight, stopped, file events of the straight run): a 4-step ZeRO-2 run saving every step and keeping
    two, and the same run stopped (and saved) at step 2."""
    root = tmp_path_factory.mktemp("deepspeed-checkpoints")
    events = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        record_file_events(monkeypatch, events)
        train(ds_config(tiny_vqgan, root / "straight", zero_stage=2, amp=False, max_steps=STEPS,
                        save_every_n_steps=1, keep_n_checkpoints=2), TINY_MODEL)
    train(ds_config(tiny_vqgan, root / "stopped", zero_stage=2, amp=False, max_steps=STEPS), TINY_MODEL,
          stop_at_step=2)
    return root / "straight", root / "stopped", events


def resume(tiny_vqgan, out):
    return train(ds_config(tiny_vqgan, out, zero_stage=2, amp=False, max_steps=STEPS, resume="latest"), TINY_MODEL)


def test_each_checkpoint_names_its_own_rank_files_beside_it_and_rotation_removes_both(zero2_runs):
    out, _, _ = zero2_runs
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"dalle-step00000003.deepspeed",
                                                             "dalle-step00000004.deepspeed"}
    assert sorted(p.name for p in out.glob("dalle-step*.pt")) == ["dalle-step00000003.pt", "dalle-step00000004.pt"]
    ckpt = torch.load(out / "dalle.pt", weights_only=True)
    meta = ckpt["deepspeed"]
    assert "optimizer" not in ckpt and meta["dir"] == "dalle-step00000004.deepspeed" and meta["world_size"] == 1
    assert json.loads(json.dumps(meta)) == meta  # names and sizes only: no engine bytes inside the file
    [rank0] = meta["files"]
    names = {name for name, _ in rank0}
    assert "dalle_lab/mp_rank_00_model_states.pt" in names
    assert any(name.startswith("dalle_lab/") and "zero_pp_rank_0_" in name and name.endswith("optim_states.pt")
               for name in names)
    engine_dir = out / meta["dir"]
    on_disk = {str(p.relative_to(engine_dir)): p.stat().st_size for p in (engine_dir / "dalle_lab").rglob("*")
               if p.is_file()}
    assert on_disk == {name: size for name, size in rank0}  # every file DeepSpeed wrote is listed, size and all


def test_engine_files_are_durable_before_the_checkpoint_file_names_them(zero2_runs):
    """Each engine file: fsynced, renamed into the temporary directory; the directory: fsynced, renamed into place,
    its folder fsynced; only then the checkpoint file, the latest link, and last the deletions of rotation."""
    out, _, events = zero2_runs
    folder_synced = ("fsync", str(out.resolve()))  # fsync events name the real path of the descriptor
    step3 = out / "dalle-step00000003.deepspeed"
    ckpt = torch.load(out / "dalle-step00000003.pt", weights_only=True)
    dir_renamed = events.index(("rename", str(step3)))
    for name, _ in ckpt["deepspeed"]["files"][0]:
        [renamed] = [i for i, (what, path) in enumerate(events)
                     if what == "rename" and path.endswith("/" + name) and ".dalle-step00000003.deepspeed." in path]
        assert renamed < dir_renamed
        assert events[renamed - 1][0] == "fsync" and Path(events[renamed - 1][1]).name.startswith(
            "." + Path(name).name)  # its temporary file
    tmp_dir_synced = [i for i, (what, path) in enumerate(events[:dir_renamed])
                      if what == "fsync" and Path(path).name.startswith(".dalle-step00000003.deepspeed.")]
    assert tmp_dir_synced and events[dir_renamed + 1] == folder_synced
    file_renamed = events.index(("rename", str(out / "dalle-step00000003.pt")))
    latest = events.index(("rename", str(out / "dalle.pt")), file_renamed)
    assert dir_renamed < file_renamed < latest and events[latest + 1] == folder_synced
    deleted = events.index(("delete", str(out / "dalle-step00000001.pt")))
    assert latest + 1 < deleted < events.index(("rmtree", str(out / "dalle-step00000001.deepspeed")))


def test_missing_or_cut_engine_files_are_a_one_line_error_naming_them(zero2_runs, tiny_vqgan, tmp_path):
    _, stopped, _ = zero2_runs
    out = tmp_path / "copy"
    shutil.copytree(stopped, out)
    engine_dir = out / "dalle-step00000002.deepspeed" / "dalle_lab"
    model_file = engine_dir / "mp_rank_00_model_states.pt"
    whole = model_file.read_bytes()
    model_file.write_bytes(whole[:100])  # as a copy cut short would leave it
    with pytest.raises(CheckpointError) as err:
        resume(tiny_vqgan, out)
    assert f"DeepSpeed file {model_file} (rank 0's part) has 100 bytes, not the {len(whole)} written" in str(err.value)
    assert "\n" not in str(err.value)
    model_file.write_bytes(whole)
    [partition] = engine_dir.glob("*zero_pp_rank_0_*")
    partition.unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"DeepSpeed file {partition} (rank 0's part) is missing; "
                                                        "the dalle-step00000002.deepspeed directory must stay "
                                                        "beside dalle.pt")):
        resume(tiny_vqgan, out)


def test_a_checkpoint_of_the_old_packed_layout_still_resumes_exactly(zero2_runs, tiny_vqgan, tmp_path):
    """Before per-rank directories, the engine files were packed as bytes into the checkpoint file."""
    straight, stopped, _ = zero2_runs
    out = tmp_path / "old"
    shutil.copytree(stopped, out)
    ckpt = torch.load(out / "dalle.pt", weights_only=True)
    engine_dir = out / ckpt["deepspeed"]["dir"]
    files = {str(p.relative_to(engine_dir)): torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8)
             for p in sorted(engine_dir.rglob("*")) if p.is_file()}
    ckpt["deepspeed"] = {"files": files, "world_size": 1, "zero_stage": 2}
    save_checkpoint(ckpt, out / "dalle.pt")
    shutil.rmtree(engine_dir)
    result = resume(tiny_vqgan, out)
    assert result.step == STEPS
    assert_same_weights(torch.load(straight / "dalle.pt", weights_only=True)["model"],
                        torch.load(out / "dalle.pt", weights_only=True)["model"], atol=1e-6)


def test_engine_state_of_another_layout_is_refused_in_one_line():
    from dalle_lab.training.deepspeed_files import check_layout
    from dalle_lab.training.distributed import DistInfo

    with pytest.raises(CheckpointError, match=r"^run/dalle.pt was written by 2 process\(es\) at ZeRO stage 2; this "
                                              r"run has 1 at stage 2: resume with the same number of processes"):
        check_layout({"world_size": 2, "zero_stage": 2}, DistInfo(), 2, "run/dalle.pt")


# ------------------------------------------------------------------ precision: the float32 master weights

def bf16_config(tiny_vqgan, tmp_path, zero_stage, **overrides):
    """DeepSpeed's own bf16 (the module in bf16, float32 master weights in the optimizer), as on CUDA."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}}))
    return ds_config(tiny_vqgan, tmp_path / "run", zero_stage=zero_stage, amp=False, deepspeed_config=str(path),
                     warmup_steps=1, **overrides)


def reference_masters(ckpt_path: Path, zero_stage: int, names: list[str]) -> dict:
    """The float32 master weights as DeepSpeed itself stored them in its engine files."""
    ckpt = torch.load(ckpt_path, weights_only=True)
    engine_dir = ckpt_path.parent / ckpt["deepspeed"]["dir"]
    if zero_stage == 0:  # FP16_UnfusedOptimizer's state: fp32_groups, in the optimizer's parameter order
        states = torch.load(engine_dir / "dalle_lab" / "mp_rank_00_model_states.pt", weights_only=False)
        masters = [t for group in states["optimizer"]["fp32_groups"] for t in group]
        return dict(zip(names, masters))
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(engine_dir), tag="dalle_lab")


def assert_saves_float32_masters(ckpt_path: Path, zero_stage: int) -> None:
    from dalle_lab.training.checkpoint import load_dalle

    saved = torch.load(ckpt_path, weights_only=True)["model"]
    assert all(t.dtype == torch.float32 for t in saved.values())
    # not the bf16 module widened: after a few Adam steps the masters are off the bf16 grid
    assert any(not torch.equal(t.bfloat16().float(), t) for t in saved.values())
    dalle, _, _ = load_dalle(ckpt_path)  # and they load as they are
    names = [name for name, _ in dalle.named_parameters() if not name.startswith("vae.")]
    reference = reference_masters(ckpt_path, zero_stage, names)
    assert set(reference) == set(saved)
    for name, tensor in reference.items():
        assert torch.equal(saved[name], tensor.float()), name
    if zero_stage < 3:  # the module DeepSpeed trains is the masters rounded to bf16
        engine_dir = ckpt_path.parent / torch.load(ckpt_path, weights_only=True)["deepspeed"]["dir"]
        module = torch.load(engine_dir / "dalle_lab" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
        for name, tensor in module.items():
            assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, saved[name].bfloat16()), name


@pytest.mark.parametrize("zero_stage", [0, 1, 3])
def test_a_bf16_module_saves_its_float32_master_weights(tiny_vqgan, tmp_path, zero_stage):
    result = train(bf16_config(tiny_vqgan, tmp_path, zero_stage, max_steps=3), TINY_MODEL)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in result.history)
    assert_saves_float32_masters(Path(result.checkpoint_path), zero_stage)


def test_a_bf16_module_at_zero2_saves_its_masters_and_resumes_exactly(tiny_vqgan, tmp_path):
    """The resumed run must get its float32 masters back from its partition (not re-made from the bf16 module)."""
    straight = train(bf16_config(tiny_vqgan, tmp_path / "a", 2, max_steps=STEPS), TINY_MODEL)
    assert_saves_float32_masters(Path(straight.checkpoint_path), 2)
    train(bf16_config(tiny_vqgan, tmp_path / "b", 2, max_steps=STEPS), TINY_MODEL, stop_at_step=2)
    resumed = train(bf16_config(tiny_vqgan, tmp_path / "b", 2, max_steps=STEPS, resume="latest"), TINY_MODEL)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in straight.history[2:]]
    assert_same_weights(torch.load(straight.checkpoint_path, weights_only=True)["model"],
                        torch.load(resumed.checkpoint_path, weights_only=True)["model"], atol=0)
