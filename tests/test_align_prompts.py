"""RL prompts where the model fails (dalle_lab/align/prompts.py): the two held-out protocols never sample an
evaluation caption, leave-one-pair-out never mentions its pair, screening keeps prompts sometimes but not always
exactly right, and the command line's --prompts heldout / --leave_out_pair."""
import numpy as np
import pytest
import torch

from dalle_lab.align.__main__ import build_parser, read_prompts
from dalle_lab.align.config import AlignConfig
from dalle_lab.align.in_run_eval import pixel_diversity
from dalle_lab.align.prompts import (distinct_captions, heldout_protocol, pairs_of, parse_pair, screen_prompts,
                                     split_rl_prompts)
from dalle_lab.data.shapes import HELDOUT_PAIRS, all_captions, layout, parse, render, split_of, to_tensor

from test_align_finetune import make_trainer, tokenizer  # noqa: F401  (the fixture)

SMALL = AlignConfig(eval_num_prompts=20, eval_num_heldout=30)


def test_taught_compositions_train_and_evaluate_on_disjoint_captions_of_the_held_out_pairs():
    prompts, sets = heldout_protocol(SMALL)
    assert set(sets) == {"val", "heldout"} and len(sets["val"]) == 20 and len(sets["heldout"]) == 30
    assert len(set(sets["heldout"])) == 30 and all(split_of(c) == "heldout" for c in sets["heldout"])
    assert all(split_of(c) == "val" for c in sets["val"])
    assert not set(prompts) & set(sets["heldout"]) and not set(prompts) & set(sets["val"])
    assert set(prompts) | set(sets["heldout"]) == set(all_captions("heldout"))  # every other held-out caption
    one_object = sum(len(parse(c).objects) == 1 for c in sets["heldout"])
    assert 5 <= one_object <= 25  # drawn like the dataset's items: about half one-object scenes


def test_leave_one_pair_out_never_shows_its_pair_to_rl():
    prompts, sets = heldout_protocol(SMALL, "Red Triangle")
    assert set(sets) == {"val", "heldout", "left_out"}
    assert all(("red", "triangle") not in pairs_of(c) for c in prompts + sets["heldout"])
    assert all(("red", "triangle") in pairs_of(c) for c in sets["left_out"]) and len(sets["left_out"]) == 30
    assert {pair for c in prompts for pair in pairs_of(c)} == HELDOUT_PAIRS - {("red", "triangle")}
    assert not set(prompts) & set(sets["heldout"])
    with pytest.raises(ValueError, match="'green circle' is not a held-out colour-shape pair; choose one of "
                                         "'blue circle', 'red triangle', 'yellow square'"):
        parse_pair("green circle")


def test_distinct_captions_are_distinct_and_filtered():
    captions = distinct_captions("heldout", 50, lambda c: len(parse(c).objects) == 1)
    assert len(captions) == len(set(captions)) == 50 and all(len(parse(c).objects) == 1 for c in captions)
    assert distinct_captions("val", 10) == distinct_captions("val", 12)[:10]  # a prefix: stable under n


def drawn(caption, seed):
    return to_tensor(render(layout(parse(caption), np.random.default_rng(seed)), 32))


def test_screening_keeps_prompts_that_are_sometimes_but_not_always_exact():
    always, sometimes, never = all_captions("heldout")[:3]
    calls = []

    def sample(batch):  # `sometimes` is drawn right every other time, `never` is a blank image
        calls.append(len(batch))
        images = []
        for i, caption in enumerate(batch):
            right = caption == always or (caption == sometimes and len(images) % 2 == 0)
            images.append(drawn(caption, i) if right else torch.full((3, 32, 32), 0.5))
        return torch.stack(images)

    lines = []
    kept = screen_prompts(sample, [always, sometimes, never, sometimes], 4, batch_size=4, log_fn=lines.append)
    assert kept == [sometimes] and calls == [4, 4, 4]  # each distinct prompt 4 times, in batches of 4
    assert "1 never exact, 1 exact in >= 90%, 1 kept" in lines[0]
    with pytest.raises(ValueError, match="screening kept no prompt"):
        screen_prompts(sample, [always, never], 2, batch_size=4, log_fn=lines.append)
    with pytest.raises(ValueError, match="every RL prompt must be a Shapes caption"):
        screen_prompts(sample, ["a photo of a cat"], 2, batch_size=4)


def test_a_screened_run_trains_on_the_kept_prompts_and_resumes_them(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, screen_samples=2, epochs=1, inner_epochs=1)
    pool = list(dict.fromkeys(trainer.prompts))
    real_sample, count = trainer.sample, iter(range(10_000))

    def sample(text, generator=None):  # the first prompt is drawn right every other time, the others never
        captions = [trainer.tokenizer.decode(row) for row in text]
        return torch.stack([drawn(pool[0], 0) if c == pool[0] and next(count) % 2 else torch.full((3, 32, 32), 0.5)
                            for c in captions]), None, None

    trainer.sample = sample
    trainer.screen()
    trainer.sample = real_sample
    assert trainer.prompts == [pool[0]] and trainer.screened
    history = trainer.train()  # no second screening: the pool stays
    assert len(history) == 1 and set(trainer.epoch_prompts(0)) == {pool[0]}
    resumed = make_trainer(tokenizer, tmp_path, screen_samples=2, epochs=2, inner_epochs=1)
    assert resumed.prompts == [pool[0]] and resumed.screened


def test_command_line_prompts_heldout_and_leave_out_pair():
    parser = build_parser()
    args = parser.parse_args(["--dalle_path", "x.pt", "--prompts", "heldout", "--leave_out_pair", "blue circle",
                              "--eval_num_prompts", "5", "--eval_num_heldout", "6"])
    config = AlignConfig(eval_num_prompts=5, eval_num_heldout=6)
    prompts, sets = read_prompts(args, config)
    assert (prompts, sets) == heldout_protocol(config, "blue circle")
    assert split_rl_prompts(prompts, sets, log_fn=lambda _: None) == prompts  # nothing left to remove
    args = parser.parse_args(["--dalle_path", "x.pt", "--leave_out_pair", "blue circle"])
    with pytest.raises(ValueError, match="--leave_out_pair needs --prompts heldout"):
        read_prompts(args, config)


def test_pixel_diversity_per_caption():
    images = torch.stack([torch.zeros(3, 2, 2), torch.ones(3, 2, 2), torch.zeros(3, 2, 2), torch.zeros(3, 2, 2)])
    assert pixel_diversity(images, 2) == pytest.approx(0.5)  # caption 1: distance 1, caption 2: distance 0
