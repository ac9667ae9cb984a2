"""Best-of-n fine-tuning: which samples are kept, and that one epoch raises the kept sequences' log-probability."""
import numpy as np
import torch
import torch.nn.functional as F

from dalle_lab.align.best_of_n import BestOfNTrainer, select_best
from test_align_finetune import make_trainer, tokenizer  # noqa: F401 (tokenizer is a fixture)


def test_select_best_keeps_each_groups_maximum_and_skips_groups_without_spread():
    prompts = ["a", "a", "a", "b", "b", "c", "c"]
    rewards = [0.5, 1.0, 1.0, 0.3, 0.3, 0.0, 0.2]
    assert select_best(prompts, rewards).tolist() == [1, 2, 6]  # b's samples all scored 0.3: nothing to learn
    assert select_best(prompts, rewards, min_reward=0.9).tolist() == [1, 2]  # c's best (0.2) is below the bar


def test_an_epoch_trains_on_the_kept_samples_only(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, cls=BestOfNTrainer, lr=3e-3, inner_epochs=3, kl_coef=0.0)
    prompts = trainer.epoch_prompts(0)
    torch.manual_seed(0)
    collected = {}
    original = trainer.sample

    def recording_sample(text):
        images, tokens, logprobs = original(text)
        collected.setdefault("tokens", []).append(tokens)
        collected.setdefault("text", []).append(text)
        return images, tokens, logprobs

    trainer.sample = recording_sample
    with torch.no_grad():
        before = {id(p): p.detach().clone() for p in trainer.dalle.parameters()}
    log = trainer.train_epoch(prompts)
    tokens, text = torch.cat(collected["tokens"]), torch.cat(collected["text"])
    from dalle_lab.rewards import brightness

    rewards = brightness(trainer.dalle.vae.decode(tokens), prompts)
    keep = select_best(prompts, rewards.numpy())
    assert log["kept_fraction"] == len(keep) / len(prompts) and len(keep) > 0
    with torch.no_grad():
        after = F.log_softmax(trainer.dalle.logits(text[keep], tokens[keep]).float(), -1)
        new_ll = after.gather(-1, tokens[keep].unsqueeze(-1)).sum()
        for p in trainer.dalle.parameters():
            p_before = before[id(p)]
            p.data, p_before.data = p_before.data, p.data.clone()
        old = F.log_softmax(trainer.dalle.logits(text[keep], tokens[keep]).float(), -1)
        old_ll = old.gather(-1, tokens[keep].unsqueeze(-1)).sum()
    assert new_ll > old_ll + 1.0  # the kept sequences became more likely
