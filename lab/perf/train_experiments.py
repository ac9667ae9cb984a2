"""Evidence for the training speed-ups proposed in docs/performance.md, measured on our model without editing it.

    .venv/bin/python -m lab.perf.train_experiments [--threads 1] [--rounds 3] [--steps 3]

Variants of one training step (forward, backward, AdamW) at the reference config, batch 8, each timed in CPU seconds
(all threads; the machine is shared, see README), alternated round by round:

  as-is                 DALLE.forward(return_loss=True) as dalle_lab ships it
  loss-only             the same loss, without building the joint (B, T + N, text + image vocab) logits tensor that
                        forward returns next to the loss (two F.pad and a torch.cat per step, never used by training)
  fp32-attention        under bf16 autocast only: the attention kernel run in float32 (q, k, v cast up, output cast
                        back), because the CPU flash-attention kernel is slower in bfloat16 than in float32 at
                        dim_head 32
"""
from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager, nullcontext


def loss_only(model, text, image):
    """DALLE's training loss computed from its own parts, minus the joint logits tensor (caption dropout omitted:
    it is one multiply)."""
    import torch.nn.functional as F

    cfg = model.config
    text_ids = model.text_ids(text)
    h, _ = model.hidden(text_ids, image[:, :-1])
    T = cfg.text_seq_len
    text_logits = model.to_text_logits(h[:, :T])
    image_logits = model.to_image_logits(h[:, T:])
    loss_img = F.cross_entropy(image_logits.reshape(-1, cfg.num_image_tokens).float(), image.reshape(-1))
    loss_text = F.cross_entropy(text_logits.reshape(-1, cfg.total_text_tokens).float(), text_ids.reshape(-1))
    w = cfg.loss_img_weight
    return (loss_text + w * loss_img) / (w + 1)


@contextmanager
def fp32_attention():
    """Route dalle_lab's attention through float32 SDPA while the context is active."""
    import torch

    import dalle_lab.model.attention as attention

    original = attention.F.scaled_dot_product_attention

    def sdpa(q, k, v, *args, **kwargs):
        dtype = q.dtype
        with torch.autocast("cpu", enabled=False):
            return original(q.float(), k.float(), v.float(), *args, **kwargs).to(dtype)

    attention.F = _FunctionalWith(attention.F, sdpa)
    try:
        yield
    finally:
        attention.F = attention.F.wrapped


class _FunctionalWith:
    """torch.nn.functional with scaled_dot_product_attention swapped (patches one module's view of it only)."""

    def __init__(self, wrapped, sdpa):
        self.wrapped, self.scaled_dot_product_attention = wrapped, sdpa

    def __getattr__(self, name):
        return getattr(self.wrapped, name)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)

    import torch

    from lab.perf import backends
    from lab.perf.worker import autocast, random_batch

    torch.set_num_threads(args.threads)
    bench = backends.build_ours(dict(backends.REFERENCE, null_cond_prob=0.0))
    model = bench.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    text, image = random_batch(bench, 8)

    with torch.no_grad():  # the variants compute the same loss
        a, b = model(text, image, return_loss=True), loss_only(model, text, image)
    print(f"loss as-is {float(a):.6f}  loss-only {float(b):.6f}")

    variants = {
        ("fp32", "as-is"): (lambda: model(text, image, return_loss=True), nullcontext),
        ("fp32", "loss-only"): (lambda: loss_only(model, text, image), nullcontext),
        ("bf16", "as-is"): (lambda: model(text, image, return_loss=True), nullcontext),
        ("bf16", "loss-only"): (lambda: loss_only(model, text, image), nullcontext),
        ("bf16", "loss-only + fp32-attention"): (lambda: loss_only(model, text, image), fp32_attention),
    }
    cpu = {key: [] for key in variants}
    for rnd in range(args.rounds):
        for key in variants if rnd % 2 == 0 else reversed(list(variants)):
            dtype, _ = key
            fn, ctx = variants[key]
            with ctx():
                for step in range(args.steps + 1):  # the first step of each block warms up and is not timed
                    c0 = time.process_time()
                    with autocast(dtype):
                        loss = fn()
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    if step:
                        cpu[key].append(time.process_time() - c0)
    for dtype in ("fp32", "bf16"):
        base = statistics.median(cpu[(dtype, "as-is")])
        for key, values in cpu.items():
            if key[0] == dtype:
                s = statistics.median(values)
                print(f"{dtype} {key[1]:<28} {s:6.3f} CPU s/step ({base / s:4.2f}x as-is)")


if __name__ == "__main__":
    main()
