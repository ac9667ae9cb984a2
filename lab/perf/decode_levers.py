"""The decode-speed levers of issue 17, each measured on its own (CPU seconds, one process, alternated repeats).

    .venv/bin/python -m lab.perf.decode_levers [--threads 1] [--out lab/perf/results/levers.json]

  draw       one token per row of (rows, 512) probabilities: torch.multinomial vs inverse-CDF (sampling.draw)
  products   the 16 weight products of a reference-config decode step (4 layers; weights out of cache), by kernel:
             F.linear, the transposed W @ x^T, oneDNN prepacked, MKL packed (fp32) / oneDNN prepacked (bf16)
  attention  SDPA over a 200-slot cache for 1 and 5 queries: no mask, boolean and additive position masks, explicit
  cache      writing a step's keys/values: scatter at per-row positions (StaticKVCache) vs a slice (KVCache)
  step       a whole decode pass at the reference config, batch 4, 1 and 5 tokens per row (speculative window 4),
             fp32 and bf16 autocast, packed weights on/off
The results file records the command, commit, load average and every raw value; on a shared machine, read the
ratios between neighbouring rows, not the absolute times.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from lab.common import git_state, loadavg


def cpu_us(fn, reps: int, rounds: int = 3) -> list:
    """CPU microseconds per call, one value per round (after a warm-up)."""
    for _ in range(5):
        fn()
    values = []
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(reps):
            fn()
        values.append((time.process_time() - t) / reps * 1e6)
    return values


def lever_draw(torch, results):
    from dalle_lab.generate.sampling import draw

    g = torch.Generator().manual_seed(0)
    for rows in (4, 16, 64):
        p = torch.randn(rows, 512).softmax(-1)
        results[f"draw/rows{rows}/multinomial"] = cpu_us(lambda: torch.multinomial(p, 1, generator=g), 300)
        results[f"draw/rows{rows}/inverse_cdf"] = cpu_us(lambda: draw(p, g), 300)


def lever_products(torch, results):
    import torch.nn.functional as F

    shapes = [(256, 768), (256, 256), (256, 2048), (1024, 256)] * 4  # (in, out) of one reference step
    for rows in (4, 20):
        for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            ws = [torch.randn(o, i, dtype=dtype) * 0.05 for i, o in shapes]
            bs = [torch.zeros(o, dtype=dtype) for _, o in shapes]
            xs = [torch.randn(rows, i, dtype=dtype) for i, _ in shapes]
            kernels = {"F.linear": lambda k: F.linear(xs[k], ws[k], bs[k]),
                       "transposed": lambda k: torch.addmm(bs[k].unsqueeze(1), ws[k], xs[k].t()).t()}
            onednn = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in ws]
            kernels["onednn_prepacked"] = lambda k: torch.ops.mkldnn._linear_pointwise(xs[k], onednn[k], bs[k],
                                                                                      "none", [], "")
            if dtype == torch.float32:
                mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in ws]
                kernels["mkl_packed"] = lambda k: torch.ops.mkl._mkl_linear(xs[k], mkl[k], ws[k], bs[k], rows)
            for kname, f in kernels.items():
                results[f"products/rows{rows}/{name}/{kname}"] = cpu_us(lambda: [f(k) for k in range(16)], 40)


def lever_attention(torch, results):
    import torch.nn.functional as F

    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for n in (1, 5):
            q = torch.randn(4, 8, n, 32, dtype=dtype)
            k, v = torch.randn(4, 8, 200, 32, dtype=dtype), torch.randn(4, 8, 200, 32, dtype=dtype)
            mask = (torch.arange(200) <= (150 + torch.arange(n)).expand(4, -1).unsqueeze(-1)).unsqueeze(1)
            additive = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
            variants = {
                "sdpa_no_mask": lambda: F.scaled_dot_product_attention(q, k, v),
                "sdpa_bool_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                "sdpa_additive_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=additive),
                "explicit": lambda: ((q * 32 ** -0.5) @ k.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
                .softmax(-1) @ v,
            }
            for vname, f in variants.items():
                results[f"attention/n{n}/{name}/{vname}"] = cpu_us(f, 300)


def lever_cache(torch, results):
    for n in (1, 5):
        buf = torch.zeros(2, 4, 8, 300, 32)
        kv = torch.randn(4, n, 3, 8, 32).permute(2, 0, 3, 1, 4)[1:]
        pos = (150 + torch.arange(n)).expand(4, -1)

        def scatter():
            buf.scatter_(3, pos.view(1, 4, 1, n, 1).expand(2, 4, 8, n, 32), kv)

        def slice_write():
            buf[:, :, :, 150:150 + n] = kv

        results[f"cache/n{n}/scatter"] = cpu_us(scatter, 300)
        results[f"cache/n{n}/slice"] = cpu_us(slice_write, 300)


def lever_step(torch, results):
    from lab.perf.backends import REFERENCE
    from dalle_lab.model import DALLE
    from dalle_lab.generate import GenerationConfig
    from dalle_lab.generate.decoder import Decoder
    from dalle_lab.model.linear import packed_linears

    model = DALLE(**REFERENCE).eval()
    text = torch.randint(1, 100, (4, REFERENCE["text_seq_len"]))
    for dtype in ("fp32", "bf16"):
        for n in (1, 5):
            for pack in (False, True):
                config = GenerationConfig(top_k=None, cond_scale=1.0)
                dec = Decoder(model, model.text_ids(text), config, extra_len=8)
                ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()
                with torch.no_grad(), ctx, packed_linears(model, 4 * n, enabled=pack):
                    dec.prefill(text[:, :0])
                    tokens, index = torch.randint(0, 512, (4, n)), torch.arange(n).expand(4, -1) + 150
                    results[f"step/{dtype}/n{n}/{'packed' if pack else 'unpacked'}"] = cpu_us(
                        lambda: dec.step(tokens, index), 30)


LEVERS = dict(draw=lever_draw, products=lever_products, attention=lever_attention, cache=lever_cache,
              step=lever_step)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    load_start = loadavg()
    results = {}
    for name in args.levers:
        LEVERS[name](torch, results)
    for key, values in results.items():
        print(f"{key:<45} {statistics.median(values):9.1f} us  (rounds: {', '.join(f'{v:.0f}' for v in values)})")
    meta = dict(command=" ".join([sys.executable, *sys.argv]), commit=git_state()["commit"], threads=args.threads,
                loadavg_start=load_start, loadavg_end=loadavg(), torch=torch.__version__,
                started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(f"load average {load_start:.1f} -> {meta['loadavg_end']:.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(meta=meta, cpu_us=results), indent=1))
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
