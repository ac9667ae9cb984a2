"""Resume and reproducibility with randomness on: caption dropout, attention and feed-forward dropout, several
captions per image, DataLoader workers. Every draw comes from (seed, rank, step, position) (dalle_lab/seeding.py)."""
import pytest
import torch

from dalle_lab.training.loop import train

from test_training import tiny_config

RANDOM_MODEL = dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.5, attn_dropout=0.2, ff_dropout=0.2)


def two_caption_folder(path, n=6):
    """n images, each with two caption lines (which one is used is a random draw)."""
    from PIL import Image

    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.image_grid import to_uint8

    path.mkdir(parents=True)
    shapes = ShapesDataset(length=2 * n, seed=4)
    for i in range(n):
        image, caption = shapes[i]
        Image.fromarray(to_uint8(image[None])[0]).save(path / f"{i}.png")
        (path / f"{i}.txt").write_text(f"{caption}\n{shapes[n + i][1]}\n")
    return path


def final_weights(result):
    return torch.load(result.checkpoint_path, weights_only=True)["model"]


def assert_same_weights(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=0, atol=atol, msg=name)


def split_run(make_cfg, stop_at):
    train(make_cfg(), RANDOM_MODEL, stop_at_step=stop_at)
    return train(make_cfg(resume="latest"), RANDOM_MODEL)


def test_resume_is_exact_with_caption_dropout_and_dropout_on_shapes(tiny_vqgan, tmp_path):
    # fails when the per-micro-batch re-seeding (seeding.seed_micro_batch) is removed: the resumed half then
    # draws its dropout masks from wherever the fresh process's RNG happens to be
    def cfg(out, **kw):
        return tiny_config(tiny_vqgan, out, max_steps=5, ga_steps=2, batch_size=2, amp=False, **kw)

    straight = train(cfg(tmp_path / "straight"), RANDOM_MODEL)
    resumed = split_run(lambda **kw: cfg(tmp_path / "split", **kw), stop_at=2)
    assert [h["loss"] for h in resumed.history] == pytest.approx([h["loss"] for h in straight.history[2:]],
                                                                 abs=1e-6)
    assert_same_weights(final_weights(straight), final_weights(resumed))


def test_resume_is_exact_on_a_folder_with_two_captions_and_workers(tiny_vqgan, tmp_path):
    folder = two_caption_folder(tmp_path / "data")

    def cfg(out, **kw):
        return tiny_config(tiny_vqgan, out, image_text_folder=str(folder), batch_size=2, max_steps=None, epochs=2,
                           num_workers=2, amp=False, **kw)

    straight = train(cfg(tmp_path / "straight"), RANDOM_MODEL)
    # stop mid-epoch (3 batches an epoch): the resumed loader starts its workers on the second batch of epoch 1
    resumed = split_run(lambda **kw: cfg(tmp_path / "split", **kw), stop_at=4)
    assert straight.step == resumed.step == 6
    assert_same_weights(final_weights(straight), final_weights(resumed))


def test_workers_do_not_change_the_run(tiny_vqgan, tmp_path):
    folder = two_caption_folder(tmp_path / "data")
    runs = [train(tiny_config(tiny_vqgan, tmp_path / f"w{n}", image_text_folder=str(folder), batch_size=2,
                              max_steps=3, num_workers=n, amp=False), RANDOM_MODEL) for n in (0, 2)]
    assert [h["loss"] for h in runs[0].history] == [h["loss"] for h in runs[1].history]


def test_the_same_seed_gives_the_same_run_and_another_seed_another(tiny_vqgan, tmp_path):
    folder = two_caption_folder(tmp_path / "data")

    def losses(name, seed):
        cfg = tiny_config(tiny_vqgan, tmp_path / name, image_text_folder=str(folder), batch_size=2, max_steps=4,
                          seed=seed, amp=False)
        return [h["loss"] for h in train(cfg, RANDOM_MODEL).history]

    first = losses("a", 11)
    assert losses("b", 11) == first  # bit for bit
    other = losses("c", 12)
    assert all(a != b for a, b in zip(first, other))


def test_caption_draws_are_fixed_by_seed_epoch_and_position(tmp_path):
    from dalle_lab.data import TextImageFolder
    from dalle_lab.training.batches import FolderBatches

    folder = two_caption_folder(tmp_path / "data")

    def captions(seed, position=None):
        source = FolderBatches(TextImageFolder(folder, image_size=8), 2, seed=seed, position=position)
        return [caption for _ in range(6) for caption in source.next_batch()[0]]

    first = captions(1)
    assert captions(1) == first
    # resumed at epoch 0, batch 2: the same captions as the straight run from there on
    assert captions(1, {"kind": "folder", "epoch": 0, "batch": 2})[:8] == first[4:12]
    both_lines_used = {line for i in range(6) for line in (folder / f"{i}.txt").read_text().split("\n") if line}
    assert len(set(first)) > len(first) // 2 and set(first) <= both_lines_used
    assert captions(2) != first


# ---------------------------------------------------------------------------------------------- refused resumes

TINY = dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.0)


def test_resume_with_changed_settings_names_each_flag_and_its_saved_value(tiny_vqgan, tmp_path):
    from dalle_lab.training.checkpoint import CheckpointError

    train(tiny_config(tiny_vqgan, tmp_path, max_steps=4), TINY, stop_at_step=2)
    with pytest.raises(CheckpointError) as err:
        train(tiny_config(tiny_vqgan, tmp_path, max_steps=4, batch_size=8, seed=9, resume="latest"),
              {**TINY, "dim": 64})
    message = str(err.value)
    assert str(tmp_path / "dalle.pt") in message and "\n" not in message
    for named in ("--batch_size 8 (saved: 4)", "--seed 9 (saved: 3)", "--dim 64 (saved: 32)"):
        assert named in message
    assert "micro-batch" not in message  # follows from --batch_size: named once

    with pytest.raises(CheckpointError, match=r"LR decay horizon in steps 10 \(saved: 4\)"):
        train(tiny_config(tiny_vqgan, tmp_path, max_steps=10, resume="latest"), TINY)


def test_resume_in_another_world_size_is_refused(tiny_vqgan, tmp_path):
    from dalle_lab.training.checkpoint import CheckpointError, save_checkpoint

    train(tiny_config(tiny_vqgan, tmp_path, max_steps=4), TINY, stop_at_step=2)
    ckpt = torch.load(tmp_path / "dalle.pt", weights_only=True)
    ckpt["run"]["world_size"] = 2  # as if two processes had written it
    save_checkpoint(ckpt, tmp_path / "dalle.pt")
    with pytest.raises(CheckpointError, match=r"processes \(world size\) 1 \(saved: 2\)"):
        train(tiny_config(tiny_vqgan, tmp_path, max_steps=4, resume="latest"), TINY)


def test_settings_that_cannot_change_the_result_may_change_on_resume(tiny_vqgan, tmp_path):
    straight = train(tiny_config(tiny_vqgan, tmp_path / "a", max_steps=4, amp=False), RANDOM_MODEL)
    train(tiny_config(tiny_vqgan, tmp_path / "b", max_steps=4, amp=False), RANDOM_MODEL, stop_at_step=2)
    resumed = train(tiny_config(tiny_vqgan, tmp_path / "b", max_steps=4, amp=False, resume="latest",
                                log_every_n_steps=3, save_every_n_steps=1, sample_every_n_steps=1,
                                sample_captions=["a red circle"], max_minutes=60.0), RANDOM_MODEL)
    assert_same_weights(final_weights(straight), final_weights(resumed))


def test_a_bare_resume_continues_with_the_saved_flags_and_given_flags_must_match(tiny_vqgan, tmp_path, capsys):
    from test_cli import TINY_FLAGS, script_main, vqgan_flags

    out = tmp_path / "run"
    flags = [*vqgan_flags(tiny_vqgan), *TINY_FLAGS, "--batch_size", "2", "--max_steps", "4", "--seed", "5",
             "--output_dir", out]
    assert script_main("train_dalle.py", *flags, "--save_every_n_steps", "2") == 0
    ckpt = torch.load(out / "dalle-step00000002.pt", weights_only=True)
    from dalle_lab.training.checkpoint import save_checkpoint

    save_checkpoint(ckpt, out / "dalle.pt")  # back to step 2, as if the run had been killed there
    capsys.readouterr()
    assert script_main("train_dalle.py", "--output_dir", out, "--resume") == 0  # nothing else given
    assert "at step 2" in capsys.readouterr().err
    resumed = torch.load(out / "dalle.pt", weights_only=True)
    assert resumed["step"] == 4 and resumed["train_config"]["batch_size"] == 2 and resumed["config"]["dim"] == 32

    save_checkpoint(ckpt, out / "dalle.pt")
    assert script_main("train_dalle.py", "--output_dir", out, "--resume", "--ga_steps", "2", "--depth", "2") == 1
    err = capsys.readouterr().err
    assert "--ga_steps 2 (saved: 1)" in err and "--depth 2 (saved: 1)" in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------- DDP accumulation

def test_ddp_all_reduces_gradients_once_per_optimizer_step(tiny_vqgan, tmp_path, monkeypatch):
    """The loop under DDP (a one-process gloo group stands in for many): no_sync must hold each non-final
    micro-batch's forward and backward, so 3 micro-batches a step cost one gradient all-reduce, not three."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from dalle_lab.training import loop
    from dalle_lab.training.distributed import DistInfo

    reductions = []
    original_init = DistributedDataParallel.__init__

    def counting_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)

        def hook(state, bucket):
            reductions.append(bucket.index())
            return torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook(None, bucket)

        self.register_comm_hook(None, hook)

    import torch.distributed.algorithms.ddp_comm_hooks.default_hooks  # noqa: F401

    monkeypatch.setattr(DistributedDataParallel, "__init__", counting_init)
    monkeypatch.setattr(loop, "env_dist_info", lambda: DistInfo(rank=0, world_size=2, local_rank=0))
    # an earlier in-process DeepSpeed test of this worker may have left its one-process group: use it then
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        train(tiny_config(tiny_vqgan, tmp_path, max_steps=2, ga_steps=3, batch_size=1, amp=False), TINY)
    finally:
        if own_group:
            dist.destroy_process_group()
    buckets = len(set(reductions))
    assert buckets >= 1 and len(reductions) == 2 * buckets  # one reduction of each bucket per optimizer step


# ---------------------------------------------------------------------------------------------- WebDataset shards

def two_caption_shards(path, n=8, per_shard=2):
    """Shards of `per_shard` samples, each with two caption lines; returns the brace pattern."""
    import io

    import webdataset as wds
    from PIL import Image

    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.image_grid import to_uint8

    path.mkdir(parents=True)
    shapes = ShapesDataset(length=2 * n, seed=6)
    with wds.ShardWriter(str(path / "shard-%03d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            buffer = io.BytesIO()
            Image.fromarray(to_uint8(shapes[i][0][None])[0]).save(buffer, "png")
            sink.write({"__key__": f"s{i:03d}", "png": buffer.getvalue(),
                        "txt": f"{shapes[i][1]}\n{shapes[n + i][1]}".encode()})
    return str(path / f"shard-{{000..{n // per_shard - 1:03d}}}.tar")


def test_shard_and_sample_shuffles_are_seeded_by_seed_and_epoch_and_split_across_ranks(tmp_path):
    from dalle_lab.data.wds import webdataset_dataset

    pattern = two_caption_shards(tmp_path / "shards", n=12, per_shard=2)

    def order(seed, epoch, rank=0, world_size=1):
        return [caption for _, caption in webdataset_dataset(pattern, image_size=8, shuffle=4, seed=seed,
                                                              epoch=epoch, rank=rank, world_size=world_size)]

    first = order(1, 0)
    assert order(1, 0) == first and len(first) == 12
    assert order(1, 1) != first and order(2, 0) != first
    ranks = [order(1, 0, rank, 2) for rank in (0, 1)]
    keys = [{caption for caption in captions} for captions in ranks]
    assert not keys[0] & keys[1] and len(ranks[0]) + len(ranks[1]) == 12


def test_resume_is_exact_on_shards_with_caption_dropout(tiny_vqgan, tmp_path):
    pattern = two_caption_shards(tmp_path / "shards")

    def cfg(out, **kw):
        return tiny_config(tiny_vqgan, out, image_text_folder=pattern, wds="png,txt", batch_size=2, max_steps=7,
                           amp=False, **kw)

    straight = train(cfg(tmp_path / "straight"), RANDOM_MODEL)
    resumed = split_run(lambda **kw: cfg(tmp_path / "split", **kw), stop_at=5)  # epoch 1, batch 1 of 4
    assert [h["loss"] for h in resumed.history] == pytest.approx([h["loss"] for h in straight.history[5:]],
                                                                 abs=1e-6)
    assert_same_weights(final_weights(straight), final_weights(resumed))
    epochs = [torch.load(r.checkpoint_path, weights_only=True)["data_position"] for r in (straight, resumed)]
    assert epochs[0] == epochs[1] == {"kind": "webdataset", "epoch": 1, "batch": 3}
