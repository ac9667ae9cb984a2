"""Speculative Jacobi decoding against plain cached decoding on a trained checkpoint: transformer passes and time.

    .venv/bin/python -m lab.perf.speculative --dalle_path runs/recipe/demo-seed0/dalle.pt
    ... --windows 3 4 6 --rounds 3 --batch 4 --dtype fp32 bf16 --out lab/perf/results/speculative.json

Both paths sample the same distribution (tests/test_speculative.py proves it); this measures what speculation
saves. Runs alternate (plain, then each window, round after round) in one process with torch held to --threads;
each ratio is the median over rounds of plain / speculative. The results file records the command, the git commit,
the load average before and after, and every raw value: on a shared machine the ratios are what to read.
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

CAPTIONS = ["a red circle", "a blue square above a green triangle", "a small yellow star", "two green circles",
            "a purple triangle left of a red square", "a big blue circle", "an orange square", "a green star"]


def git_commit() -> str:
    return (git_state()["commit"] or "unknown")[:7]  # short form, as the earlier results files hold


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dalle_path", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--windows", type=int, nargs="+", default=[4])
    p.add_argument("--dtype", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top_k", type=int, default=10)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--cond_scale", type=float, default=1.0)
    p.add_argument("--out", type=Path, help="results JSON (default: print only)")
    args = p.parse_args(argv)

    import torch

    from dalle_lab.training.checkpoint import load_dalle

    torch.set_num_threads(args.threads)
    dalle, tokenizer, _ = load_dalle(args.dalle_path)
    captions = (CAPTIONS * (args.batch // len(CAPTIONS) + 1))[:args.batch]
    text = tokenizer.tokenize(captions, dalle.config.text_seq_len, truncate_text=True)
    calls = []
    dalle.transformer.register_forward_pre_hook(lambda module, inputs: calls.append(1))
    sampling = dict(top_k=args.top_k, temperature=args.temperature, cond_scale=args.cond_scale)

    def run(window: int, dtype: str, seed: int) -> dict:
        calls.clear()
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()
        t0, c0 = time.perf_counter(), time.process_time()
        with ctx:
            dalle.generate_images(text, return_tokens=True, generator=torch.Generator().manual_seed(seed),
                                  strategy="speculative" if window > 0 else "auto",
                                  speculative_window=max(window, 1), **sampling)
        return dict(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0, calls=len(calls))

    for dtype in args.dtype:  # warm-up: first calls pick and prime kernels
        run(0, dtype, 0), run(args.windows[0], dtype, 0)
    load_start, started = loadavg(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    raw = {dtype: {str(w): [] for w in [0, *args.windows]} for dtype in args.dtype}
    for rnd in range(args.rounds):
        for dtype in args.dtype:
            for w in [0, *args.windows]:
                raw[dtype][str(w)].append(dict(run(w, dtype, seed=rnd), loadavg=loadavg()))
    summary = {}
    for dtype in args.dtype:
        plain = raw[dtype]["0"]
        for w in args.windows:
            spec = raw[dtype][str(w)]
            ratio = {key: statistics.median(a[key] / b[key] for a, b in zip(plain, spec))
                     for key in ("calls", "wall_s", "cpu_s")}
            summary[f"{dtype}/window{w}"] = ratio
            print(f"{dtype} window {w}: {ratio['calls']:.2f}x fewer passes (plain "
                  f"{statistics.median(r['calls'] for r in plain)}, speculative "
                  f"{statistics.median(r['calls'] for r in spec)}), {ratio['wall_s']:.2f}x less wall time, "
                  f"{ratio['cpu_s']:.2f}x less CPU time [target: >= 2x passes, >= 1.7x wall: "
                  f"{'met' if ratio['calls'] >= 2 and ratio['wall_s'] >= 1.7 else 'not met'}]")
    meta = dict(command=" ".join([sys.executable, *sys.argv]), commit=git_commit(), started=started,
                loadavg_start=load_start, loadavg_end=loadavg(), threads=args.threads, batch=args.batch,
                sampling=sampling, config=dalle.config.to_dict(), checkpoint=str(args.dalle_path))
    print(f"load average {load_start:.1f} -> {meta['loadavg_end']:.1f} (ratios from a loaded machine are noisy)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(meta=meta, summary=summary, raw=raw), indent=1))
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
