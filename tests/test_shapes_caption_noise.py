"""--caption_noise: a controlled share of Shapes training captions with exactly one attribute changed (issue 19).
The wrong captions stay in the grammar and in the training split, and which samples get one is a function of
(seed, sample index) only, so the stream keeps its rank, resume and seed guarantees."""
import math
from collections import Counter

import numpy as np
import pytest
import torch

from dalle_lab.data.shapes import (
    ATTRIBUTE_VALUES,
    ShapesDataset,
    all_scene_specs,
    describe,
    parse,
    perturb_caption,
    perturb_spec,
    spec_attributes,
    split_of,
)
from dalle_lab.training.batches import ShapesStream
from dalle_lab.seeding import derive_seed

SEED, N = 7, 4000


def changed(a, b) -> list[str]:
    before, after = spec_attributes(a), spec_attributes(b)
    assert before.keys() == after.keys()  # a one-object scene stays one-object
    return [name for name in before if before[name] != after[name]]


# ------------------------------------------------------------------------------------------------ perturbation

@pytest.mark.parametrize("split", [None, "train"])
def test_perturbation_changes_exactly_one_attribute_into_a_parseable_caption(split):
    specs = [s for s in all_scene_specs() if split is None or split_of(s) == split]
    assert {len(s.objects) for s in specs} == {1, 2}
    for seed in range(3):
        rng = np.random.default_rng(seed)
        for spec in specs:
            new = perturb_spec(spec, rng, split)
            assert len(changed(spec, new)) == 1, (describe(spec), describe(new))
            assert parse(describe(new)) == new
            if len(new.objects) == 2:
                assert new.objects[0].color != new.objects[1].color
            if split is not None:  # a training caption: no held-out pair, no validation caption
                assert split_of(new) == split


def assert_uniform(counts: Counter, keys, n: int):
    assert set(counts) == set(keys), counts
    expected = n / len(keys)
    for key, count in counts.items():  # 5 standard deviations of a binomial count
        assert abs(count - expected) < 5 * math.sqrt(expected), (key, counts)


@pytest.mark.parametrize("caption", ["a small green circle at the top left on a white background",
                                     "a red circle above a green square on a black background"])
def test_attribute_and_value_are_uniform(caption):
    spec, rng, n = parse(caption), np.random.default_rng(0), 12_000
    draws = [perturb_spec(spec, rng) for _ in range(n)]
    names = [changed(spec, new)[0] for new in draws]
    assert_uniform(Counter(names), spec_attributes(spec), n)

    # the colour becomes any other colour; in a two-object scene not the second object's either
    color = "color" if len(spec.objects) == 1 else "color1"
    colors = [new.objects[0].color for new, name in zip(draws, names) if name == color]
    assert_uniform(Counter(colors), set(ATTRIBUTE_VALUES[color]) - {o.color for o in spec.objects}, len(colors))


def test_perturb_caption_is_the_spec_perturbation():
    caption = "a large blue square on the right on a gray background"
    assert perturb_caption(caption, np.random.default_rng(3)) == describe(perturb_spec(parse(caption),
                                                                                       np.random.default_rng(3)))


# ------------------------------------------------------------------------------------------------ the stream

def stream_captions(p, batch=N, seed=SEED, **kw):
    return ShapesStream(batch, image_size=8, seed=seed, caption_noise=p, **kw).next_batch()[0]


def clean_captions(n=N, seed=SEED):
    """What the stream gave before caption noise existed: ShapesDataset("train") items 0..n-1."""
    dataset = ShapesDataset("train", length=n, image_size=8, seed=seed)
    return [dataset.caption(i) for i in range(n)]


def chosen(p, n=N, seed=SEED) -> list[bool]:
    """Which samples get a wrong caption: the first draw of the generator of (seed, index)."""
    return [np.random.default_rng(derive_seed("caption_noise", seed, i)).random() < p for i in range(n)]


def test_no_noise_is_the_stream_as_it_was():
    clean = clean_captions(1000)
    assert stream_captions(0.0, batch=1000) == clean
    captions, images = ShapesStream(16, image_size=8, seed=SEED).next_batch()
    assert captions == clean[:16]
    torch.testing.assert_close(images, ShapesDataset("train", length=16, image_size=8, seed=SEED).batch(range(16))[0],
                               rtol=0, atol=0)


def test_share_of_wrong_captions_and_the_rest_untouched():
    p, clean = 0.25, clean_captions()
    noisy = stream_captions(p)
    wrong = [a != b for a, b in zip(noisy, clean)]
    assert abs(sum(wrong) - p * N) < 4 * math.sqrt(N * p * (1 - p)), sum(wrong)
    assert wrong == chosen(p)  # decided by (seed, index); every other sample keeps its true caption
    for a, b in zip(noisy, clean):
        assert len(changed(parse(b), parse(a))) == int(a != b)
        assert split_of(a) == "train"
    assert all(a != b for a, b in zip(stream_captions(1.0, batch=500), clean[:500]))


def test_images_stay_true_and_the_stream_is_seeded():
    a = ShapesStream(64, image_size=8, seed=SEED, caption_noise=0.5).next_batch()
    b = ShapesStream(64, image_size=8, seed=SEED, caption_noise=0.5).next_batch()
    clean_images = ShapesStream(64, image_size=8, seed=SEED).next_batch()[1]
    assert a[0] == b[0]
    torch.testing.assert_close(a[1], clean_images, rtol=0, atol=0)
    other = stream_captions(0.5, batch=64, seed=SEED + 1)
    assert [x != y for x, y in zip(other, clean_captions(64, SEED + 1))] != [x != y for x, y in
                                                                            zip(a[0], clean_captions(64))]


def test_a_larger_share_keeps_the_wrong_captions_of_a_smaller_one():
    clean, low, high = clean_captions(1000), stream_captions(0.2, 1000), stream_captions(0.6, 1000)
    for c, lo, hi in zip(clean, low, high):
        if lo != c:
            assert hi == lo


def test_two_ranks_see_what_one_rank_with_double_batch_sees_and_resume_continues():
    one = ShapesStream(16, image_size=8, seed=SEED, caption_noise=0.3)
    ranks = [ShapesStream(8, image_size=8, seed=SEED, rank=r, world_size=2, caption_noise=0.3) for r in (0, 1)]
    seen = []
    for _ in range(3):
        expected = one.next_batch()[0]
        r0, r1 = (stream.next_batch()[0] for stream in ranks)
        assert [c for pair in zip(r0, r1) for c in pair] == expected
        seen += expected
    assert sum(a != b for a, b in zip(seen, clean_captions(48))) == 8  # samples 1, 6, 7, 11, 17, 18, 20, 30

    resumed = ShapesStream(16, image_size=8, seed=SEED, caption_noise=0.3, position=one.position)
    assert resumed.next_batch()[0] == one.next_batch()[0]


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_a_share_outside_0_1_is_refused(p):
    with pytest.raises(ValueError, match=r"--caption_noise .* must be a probability in \[0, 1\]"):
        ShapesStream(4, image_size=8, caption_noise=p)


# ------------------------------------------------------------------------------------------------ training

from test_cli import TINY_FLAGS, script_main, vqgan_flags  # noqa: E402
from test_training import tiny_config  # noqa: E402

TINY = dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.0)


def test_the_flag_reaches_the_config():
    from dalle_lab.training.cli import build_train_parser, config_from_args

    assert config_from_args(build_train_parser().parse_args([]))[0].caption_noise == 0.0
    assert config_from_args(build_train_parser().parse_args(["--caption_noise", "0.25"]))[0].caption_noise == 0.25


def test_caption_noise_is_refused_out_of_range_and_off_the_shapes_data(tiny_vqgan, tmp_path, capsys):
    from PIL import Image

    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (8, 8)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text("a red circle\n")
    base = [*vqgan_flags(tiny_vqgan), *TINY_FLAGS, "--max_steps", "1", "--batch_size", "2",
            "--output_dir", tmp_path / "out"]
    for extra, message in ((["--caption_noise", "1.5"], "--caption_noise 1.5 must be a probability in [0, 1]"),
                           (["--caption_noise", "0.25", "--dataset", "emoji"], "applies to the built-in shapes"),
                           (["--caption_noise", "0.25", "--image_text_folder", folder], "applies to the built-in shapes"),
                           (["--caption_noise", "0.25", "--image_text_folder", "x-{0..1}.tar", "--wds", "jpg,txt"],
                            "applies to the built-in shapes")):
        capsys.readouterr()
        assert script_main("train_dalle.py", *base, *extra) == 1, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_training_reads_the_noisy_stream_and_a_resume_with_another_share_is_refused(tiny_vqgan, tmp_path,
                                                                                     monkeypatch):
    from dalle_lab.training import sources
    from dalle_lab.training.checkpoint import CheckpointError, save_checkpoint
    from dalle_lab.training.loop import train
    from dalle_lab.training.resume import settings_from_checkpoint

    streams = []

    class Recorded(ShapesStream):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            streams.append(self)

    monkeypatch.setattr(sources, "ShapesStream", Recorded)
    train(tiny_config(tiny_vqgan, tmp_path, max_steps=4, batch_size=2, caption_noise=0.25), TINY, stop_at_step=2)
    assert [s.caption_noise for s in streams] == [0.25]
    ckpt = torch.load(tmp_path / "dalle.pt", weights_only=True)
    assert ckpt["train_config"]["caption_noise"] == 0.25
    with pytest.raises(CheckpointError, match=r"--caption_noise 0.5 \(saved: 0.25\)"):
        train(tiny_config(tiny_vqgan, tmp_path, max_steps=4, batch_size=2, caption_noise=0.5, resume="latest"), TINY)
    # a bare --resume takes the saved share
    cfg, _ = settings_from_checkpoint(tiny_config(tiny_vqgan, tmp_path), {}, set(), ckpt)
    assert cfg.caption_noise == 0.25

    del ckpt["train_config"]["caption_noise"]  # a checkpoint from before the flag trained without noise
    save_checkpoint(ckpt, tmp_path / "dalle.pt")
    with pytest.raises(CheckpointError, match=r"--caption_noise 0.25 \(saved: 0.0\)"):
        train(tiny_config(tiny_vqgan, tmp_path, max_steps=4, batch_size=2, caption_noise=0.25, resume="latest"), TINY)
