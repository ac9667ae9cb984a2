"""Evidence for the generation speed-ups proposed in docs/performance.md, measured on our model without editing it.

    .venv/bin/python -m lab.perf.decode_experiments [--threads 1] [--rounds 3]

Cached generation at batch 4 is bound by its linear layers: each new token multiplies a (4, dim) row block by every
weight matrix, so every step streams all ~17 MB of fp32 weights through the core for very little arithmetic. How the
matrix product is laid out then decides the speed. Variants, each applied to a copy of the same model through a
forward override of nn.Linear (generation only: training keeps F.linear):

  as-is         F.linear(x, W, b)                                         what dalle_lab does today
  weight-left   (W @ x^T)^T + b, i.e. torch.addmm(b[:, None], W, x^T).T  same numbers, W read in its stored order
  bf16          a bfloat16 copy of the model, F.linear
  bf16 + left   both
  bf16 linears  bfloat16 copies of the Linear weights only, for few-row inputs; everything else stays float32
  int8 dynamic  torch.ao.quantization.quantize_dynamic on the Linear layers (weights int8, prepacked once;
                changes the numbers slightly, so only an opt-in fast-sampling mode could use it)

Reported: CPU seconds (all threads) per generation of 4 x 256 tokens, median over alternated rounds, and the share
of a decode step spent in linear layers. CPU time, not wall time, because the machine is shared (see README).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time


def weight_left_forward(linear):
    """A forward for one nn.Linear that, for a few rows, computes W @ x^T instead of x @ W^T."""
    import torch
    import torch.nn.functional as F

    def forward(x):
        rows = x.numel() // x.shape[-1]
        if rows > 16:  # prompt pass or training-sized input: the usual layout is the fast one there
            return F.linear(x, linear.weight, linear.bias)
        x2 = x.reshape(rows, x.shape[-1])
        if linear.bias is None:
            out = linear.weight @ x2.t()
        else:
            out = torch.addmm(linear.bias[:, None], linear.weight, x2.t())
        return out.t().reshape(*x.shape[:-1], linear.out_features)

    return forward


def bf16_linear_forward(linear):
    """A forward for one nn.Linear that keeps a bfloat16 copy of its weights and casts only its input and output:
    the rest of the model (LayerNorm, attention, KV cache, sampling) stays float32."""
    import torch
    import torch.nn.functional as F

    weight = linear.weight.detach().to(torch.bfloat16)
    bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)

    def forward(x):
        if x.numel() // x.shape[-1] > 16:
            return F.linear(x, linear.weight, linear.bias)
        return F.linear(x.to(torch.bfloat16), weight, bias).to(x.dtype)

    return forward


def variant(model, name):
    import torch

    model = copy.deepcopy(model)
    if name == "int8 dynamic":
        # weight-only int8 with prepacked weights (fbgemm): a quarter of the bytes per step, packed once
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    if name == "bf16 linears":
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.forward = bf16_linear_forward(module)
        return model
    if "bf16" in name:
        model = model.to(torch.bfloat16)
    if "left" in name:
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.forward = weight_left_forward(module)
    return model


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)

    import torch

    from lab.perf import backends

    torch.set_num_threads(args.threads)
    base = backends.build_ours(dict(backends.REFERENCE)).model.eval()
    text = torch.randint(1, base.config.num_text_tokens, (4, base.config.text_seq_len),
                         generator=torch.Generator().manual_seed(0))
    names = ["as-is", "weight-left", "bf16", "bf16 + left", "bf16 linears", "int8 dynamic"]
    models = {name: variant(base, name) for name in names}

    # Same sampled tokens in fp32 variants: the layouts compute the same function (up to summation order).
    ref = models["as-is"].generate_images(text, top_k=1, return_tokens=True)
    left = models["weight-left"].generate_images(text, top_k=1, return_tokens=True)
    print(f"greedy tokens identical, as-is vs weight-left: {bool((ref == left).all())}")

    cpu = {name: [] for name in names}
    for rnd in range(args.rounds):
        for name in names if rnd % 2 == 0 else reversed(names):
            torch.manual_seed(rnd)
            c0 = time.process_time()
            models[name].generate_images(text, filter_thres=0.9, return_tokens=True)
            cpu[name].append(time.process_time() - c0)
    base_s = statistics.median(cpu["as-is"])
    for name in names:
        s = statistics.median(cpu[name])
        print(f"{name:<12} {s:6.3f} CPU s per 4 x 256 tokens  ({base_s / s:4.2f}x as-is)  rounds "
              + " ".join(f"{v:.2f}" for v in cpu[name]))


if __name__ == "__main__":
    main()
