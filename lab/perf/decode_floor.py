"""What bounds a cached decode step on this CPU: the bytes one step must read, against how fast the machine reads.

    python -m lab.perf.decode_floor                       # reference config, batch 4, 2 threads (about 2 minutes)
    python -m lab.perf.decode_floor --config class-default --out lab/perf/results/decode_floor_cd.json

At batch 4, a float32 step multiplies 4 rows by every weight of the network once and attends over every cached key
and value: the arithmetic is small (about 37 MFLOP at the reference config) but each weight and each cached
key/value is read once per step and, with tens of MB per step against 4 MiB of L2 per core, comes back from L3 or
memory at the next step. So a step cannot be faster than (bytes it reads) / (read bandwidth), whatever its kernels,
unless it reads fewer bytes (lower-precision weights or cache: another function, not the exact path).

This script measures, in one process:
- read bandwidth: `torch.sum` over float32 tensors of 2 to 256 MiB, best of rounds, at the decode thread count;
- bytes per step: the weights of every product of the step (the image head included) plus the keys and values of
  every layer at each position of one generation, averaged over its 256 (or fmap^2) image positions;
- the floor in ms per token: bytes per step / the best bandwidth measured at a size at least the working set;
- the fused step's parts at the generation's mean position, on the model's own weights and caches: the products
  alone, the attention calls alone, the whole step (model/fused_step.py); and whole generations through
  generate_images' default path, in ms per token (sampling included).
The results file records the command, commit, config, CPU kind, thread count, load average and every raw value.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from lab.common import PERF_RESULTS, git_commit, loadavg, write_results

CLASS_DEFAULT = dict(rotary_emb=True, shift_tokens=True, layer_scale=True, rotary_style="dallepytorch")


def per_call_us(fn, calls: int, rounds: int) -> list[float]:
    """Wall microseconds per call, one value per round (after a warm-up)."""
    for _ in range(max(3, calls // 10)):
        fn()
    values = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        values.append((time.perf_counter() - start) / calls * 1e6)
    return values


def read_bandwidth(torch, rounds: int) -> dict:
    """GB/s of torch.sum over float32 tensors of each size (MiB) -> one value per round."""
    out = {}
    for mib in (2, 8, 16, 32, 64, 256):
        data = torch.ones(mib * 2 ** 20 // 4)
        us = per_call_us(data.sum, max(4, 512 // mib), rounds)
        out[str(mib)] = [mib * 2 ** 20 / (u * 1e-6) / 1e9 for u in us]
    return out


def step_bytes(model, rows: int) -> dict:
    """Bytes one step reads: every weight of its products once, and each layer's cached keys and values."""
    t, cfg = model.transformer, model.config
    products = [b.attn.to_qkv for b in t.layers] + [b.attn.to_out for b in t.layers] + \
               [b.ff.proj_in for b in t.layers] + [b.ff.proj_out for b in t.layers] + [model.to_image_logits]
    weights = sum(p.weight.numel() * 4 for p in products)
    # position of image token i: text_len + i; a step there attends to text_len + i + 1 keys (and as many values)
    spans = [t.text_len + i + 1 for i in range(cfg.image_seq_len)]
    kv_per_position = 2 * rows * t.heads * t.dim_head * 4 * cfg.depth
    return {"weights": weights, "kv_mean": kv_per_position * statistics.mean(spans),
            "kv_max": kv_per_position * max(spans), "products": len(products)}


def step_parts(torch, model, rows: int, rounds: int) -> dict:
    """The fused step at the generation's mean position: products alone, attention alone, the whole step (us)."""
    from dalle_lab.generate import GenerationConfig
    from dalle_lab.generate.decoder import Decoder
    from dalle_lab.model import fused_step

    t, cfg = model.transformer, model.config
    text = torch.randint(1, cfg.num_text_tokens, (rows, cfg.text_seq_len), generator=torch.Generator().manual_seed(1))
    dec = Decoder(model, model.text_ids(text), GenerationConfig(top_k=None, cond_scale=1.0))
    out = {}
    with torch.no_grad(), model.packed_weights(rows):
        dec.prefill(text[:, :0])
        fused = model.fused_step(dec.caches, rows)
        pos = t.text_len + cfg.image_seq_len // 2
        x = torch.randn(rows, cfg.dim)
        # each product of the plan with the module it multiplies by (for its input width)
        modules = [(layer.qkv, b.attn.to_qkv) for layer, b in zip(fused.plan.layers, t.layers)]
        modules += [(layer.attn_out, b.attn.to_out) for layer, b in zip(fused.plan.layers, t.layers)]
        modules += [(layer.ff_in, b.ff.proj_in) for layer, b in zip(fused.plan.layers, t.layers)]
        modules += [(layer.ff_out, b.ff.proj_out) for layer, b in zip(fused.plan.layers, t.layers)]
        modules.append((fused.plan.head, model.to_image_logits))
        calls = [(product, torch.randn(rows, module.in_features)) for product, module in modules]
        out["products_us"] = per_call_us(lambda: [p(v) for p, v in calls], 200, rounds)
        qkv = torch.randn(rows, 3, t.heads, t.dim_head)
        out["attention_us"] = per_call_us(
            lambda: [fused_step._attend(qkv, b, pos, fused.plan.sdpa) for b in fused.io.buffers], 200, rounds)
        out["step_us"] = per_call_us(lambda: fused(x, pos), 200, rounds)
        out["position"] = pos
    return out


def generation_ms_per_token(torch, model, rows: int, rounds: int) -> list[float]:
    cfg = model.config
    text = torch.randint(1, cfg.num_text_tokens, (rows, cfg.text_seq_len), generator=torch.Generator().manual_seed(1))
    run = lambda: model.generate_images(text, filter_thres=0.9, return_tokens=True)  # noqa: E731 - the default path
    return [us / cfg.image_seq_len / 1e3 for us in per_call_us(run, 1, rounds)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=["reference", "class-default"], default="reference",
                   help="the reference config of docs/performance.md, or the same shape with DALLE-pytorch's class "
                        "defaults (rotary, token shift, LayerScale), as a converted model has")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import torch

    from dalle_lab.model import DALLE
    from lab.perf.backends import REFERENCE

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = {**REFERENCE, **(CLASS_DEFAULT if args.config == "class-default" else {})}
    model = DALLE(**config).eval()
    load_start = loadavg()
    bandwidth = read_bandwidth(torch, args.rounds)
    sizes = step_bytes(model, args.rows)
    per_step = sizes["weights"] + sizes["kv_mean"]
    fits = [m for m in bandwidth if int(m) * 2 ** 20 >= per_step] or [max(bandwidth, key=int)]
    best_gbs = max(max(bandwidth[m]) for m in fits)
    parts = step_parts(torch, model, args.rows, args.rounds)
    generation = generation_ms_per_token(torch, model, args.rows, max(3, args.rounds // 2))
    summary = {
        "bytes_per_step_mb": per_step / 1e6, "best_read_gbs_at_working_set": best_gbs,
        "floor_ms_per_token": per_step / (best_gbs * 1e9) * 1e3,
        "products_ms": min(parts["products_us"]) / 1e3, "attention_ms": min(parts["attention_us"]) / 1e3,
        "fused_step_ms": min(parts["step_us"]) / 1e3, "generation_ms_per_token": min(generation),
        "products_effective_gbs": sizes["weights"] / (min(parts["products_us"]) * 1e-6) / 1e9,
    }
    record = {"command": " ".join([sys.executable, "-m", "lab.perf.decode_floor", *(argv or sys.argv[1:])]),
              "commit": git_commit(), "config": config, "rows": args.rows, "threads": args.threads,
              "rounds": args.rounds, "torch": torch.__version__,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "loadavg_start": load_start,
              "loadavg_end": loadavg(), "bytes": sizes, "read_gbs": bandwidth, "step_parts": parts,
              "generation_ms_per_token": generation, "summary": summary}
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    write_results(record, args.out or PERF_RESULTS / f"decode_floor-{args.config}-{stamp}.json")
    for key, value in summary.items():
        print(f"{key}: {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
