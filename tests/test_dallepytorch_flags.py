"""DALLE-pytorch 1.6.6 command lines (train_dalle.py, generate.py) on dalle_lab: each flag either does what it did
there (or its intent here) or fails with the one-line message docs/training.md lists. Tiny models, one step."""
import pytest
import torch

from dalle_lab.model import DALLE


def _tiny_dalle(**fields):
    torch.manual_seed(0)
    config = dict(dim=32, depth=2, heads=2, dim_head=16, num_text_tokens=20, text_seq_len=4, num_image_tokens=16,
                  image_fmap_size=2, null_cond_prob=0.0)
    return DALLE(**{**config, **fields})


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gradient_checkpointing_gives_the_plain_gradients(dropout):
    def grads(checkpointing: bool):
        model = _tiny_dalle(attn_dropout=dropout, ff_dropout=dropout).train()
        model.transformer.gradient_checkpointing = checkpointing
        text = torch.tensor([[3, 4, 5, 0], [6, 0, 0, 0]])
        image = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
        torch.manual_seed(1)  # the same dropout masks: checkpointing replays the RNG state in the recomputation
        loss = model(text, image, return_loss=True).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    loss_plain, plain = grads(False)
    loss_ckpt, ckpt = grads(True)
    assert torch.equal(loss_plain, loss_ckpt)
    assert plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=0, atol=1e-6, msg=name)


def test_gradient_checkpointing_recomputes_each_block_only_when_training(monkeypatch):
    import dalle_lab.model.transformer as transformer

    calls = []
    real = transformer.checkpoint
    monkeypatch.setattr(transformer, "checkpoint", lambda *a, **k: calls.append(k) or real(*a, **k))
    model = _tiny_dalle()
    model.transformer.gradient_checkpointing = True
    text, image = torch.tensor([[3, 4, 5, 0]]), torch.tensor([[1, 2, 3, 4]])
    model.train()(text, image, return_loss=True).loss.backward()
    assert len(calls) == 2 and all(k["use_reentrant"] is False for k in calls)  # depth 2: one per block
    calls.clear()
    model.eval()(text, image, return_loss=True)
    with torch.no_grad():
        model.train()(text, image, return_loss=True)
    model.generate_images(text, return_tokens=True)
    assert calls == []
