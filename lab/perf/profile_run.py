"""Where the time goes: one workload of either package under torch.profiler (or pyinstrument), top costs printed.

    .venv/bin/python -m lab.perf.profile_run --task generate                 # ours, cached, 4 x 256 tokens
    .venv/bin/python -m lab.perf.profile_run --task train --dtype bf16
    lab/perf/.peer-venv/bin/python -m lab.perf.profile_run --impl peer --task generate
    ... --pyinstrument     # Python-level call tree instead (pip install pyinstrument into that environment)

The same builders as worker.py (backends.py), so what is profiled is what is benchmarked. Profiling adds overhead
to every op; compare shares of time, not absolute times, with run.py's numbers.
"""
from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["ours", "peer"], default="ours")
    p.add_argument("--task", choices=["train", "generate"], default="generate")
    p.add_argument("--variant", default="class-default")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--use-cache", type=int, default=1)
    p.add_argument("--fmap", type=int, default=16, help="image grid side (16 = the reference 256 tokens)")
    p.add_argument("--steps", type=int, default=3, help="training steps profiled (after 2 warm-up steps)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--pyinstrument", action="store_true")
    args = p.parse_args(argv)

    import torch

    from lab.perf import backends
    from lab.perf.worker import autocast, random_batch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    bench = backends.build(args.impl, dict(backends.REFERENCE, image_fmap_size=args.fmap), args.variant)

    if args.task == "train":
        bench.model.train()
        opt = torch.optim.AdamW([q for q in bench.model.parameters() if q.requires_grad], lr=1e-4)
        text, image = random_batch(bench, 8)

        def workload():
            for _ in range(args.steps):
                with autocast(args.dtype):
                    loss = bench.loss(text, image)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

        for _ in range(2):  # warm-up steps, outside the profile
            with autocast(args.dtype):
                bench.loss(text, image).backward()
            opt.zero_grad(set_to_none=True)
    else:
        text, image = random_batch(bench, 4)
        with torch.no_grad():
            bench.model.eval()
            bench.loss(text, image)

        def workload():
            with autocast(args.dtype):
                bench.generate(text, use_cache=bool(args.use_cache), filter_thres=0.9)

    t0 = time.perf_counter()
    if args.pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        with profiler:
            workload()
        print(profiler.output_text(unicode=False, color=False, show_all=False))
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            workload()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
        events = prof.key_averages()
        n_ops = sum(e.count for e in events if not e.key.startswith(("ProfilerStep", "[")))
        print(json.dumps(dict(op_calls=n_ops, distinct_ops=len(events))))
    print(f"{args.impl} {args.task} wall {time.perf_counter() - t0:.2f} s under the profiler")


if __name__ == "__main__":
    main()
