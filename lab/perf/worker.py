"""One measurement in one fresh process, so that its peak resident memory belongs to that measurement alone.

Run by run.py with either our environment's python (--impl ours) or the peer environment's (--impl peer); prints
one line `RESULT {json}` at the end. Tasks:

  matmul    the machine's float32 and bfloat16 ceiling: best GFLOP/s of a 2048x2048 @ 2048x2048 matmul
  info      parameter counts and the sampler's effective top-k at filter_thres
  train     median seconds per training step (forward, backward, the package's own optimizer step) -> tokens/s;
            --dtype bf16 = autocast
  generate  median seconds to generate --batch images (token ids, no pixel decoding), with or without the cache

Both wall-clock and CPU time (all threads of the process) are recorded. On cores shared with other jobs the wall
time includes waiting for a core; the CPU time mostly does not, so CPU-time ratios are the steadier comparison there
(on an idle machine the wall time is the one users feel).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from contextlib import nullcontext


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure_matmul(n: int, reps: int) -> dict:
    import torch

    from dalle_lab.utils import cpu_has_native_bf16

    out = {}
    dtypes = [("fp32", torch.float32)]
    if cpu_has_native_bf16():  # emulated bf16 products take minutes at this size and say nothing about a ceiling
        dtypes.append(("bf16", torch.bfloat16))
    else:
        out["gflops_bf16"] = None
    for name, dtype in dtypes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b  # first call picks and primes the kernel
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        out[f"gflops_{name}"] = 2 * n ** 3 / best / 1e9  # best, not median: a ceiling, and other jobs only slow it
    return out


def random_batch(bench, batch: int, seed: int = 0, device: str = "cpu"):
    import torch

    g = torch.Generator().manual_seed(seed)
    text = torch.randint(1, bench.num_text_tokens, (batch, bench.text_seq_len), generator=g)  # no padding
    image = torch.randint(0, bench.num_image_tokens, (batch, bench.image_seq_len), generator=g)
    return text.to(device), image.to(device)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def autocast(dtype: str):
    import torch

    if dtype == "fp32":
        return nullcontext()
    if dtype == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    raise ValueError(f"unknown --dtype {dtype!r}: use fp32 or bf16")


def measure_train(bench, batch: int, dtype: str, warmup: int, steps: int) -> dict:
    import torch

    model = bench.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = bench.optimizer(params)  # each package's own training optimizer (ours: fused AdamW; the peer: Adam)
    text, image = random_batch(bench, batch)

    def step() -> float:
        with autocast(dtype):
            loss = bench.loss(text, image)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().item()

    losses = [step() for _ in range(warmup)]
    rss_warm = peak_rss_mb()
    times, cpu_times = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        losses.append(step())
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    seconds = statistics.median(times)  # median: robust to another job's burst on the shared cores
    tokens = batch * (bench.text_seq_len + bench.image_seq_len)
    return dict(s_per_step=seconds, step_times=times, tokens_per_step=tokens, tokens_per_s=tokens / seconds,
                cpu_s_per_step=statistics.median(cpu_times), step_cpu_times=cpu_times, losses=losses,
                rss_after_warmup_mb=rss_warm,
                optimizer=f"{type(opt).__name__}(fused={opt.defaults.get('fused')})")


def measure_generate(bench, batch: int, use_cache: bool, filter_thres: float, reps: int, decode: str = "default",
                     device: str = "cpu") -> dict:
    import torch

    model = bench.model.to(device)
    text, image = random_batch(bench, batch, device=device)
    with torch.no_grad():  # warm-up: one full-length forward primes the kernels without paying a whole generation
        model.eval()
        bench.loss(text, image)

    def generate():
        return bench.generate(text, use_cache=use_cache, filter_thres=filter_thres, decode=decode)

    # One whole cached generation warms every path up alike, timed on its own: for the compiled step it is the
    # compile (or the load from Inductor's disk cache). Uncached generations (20-45 s here) are not repeated.
    extra = {}
    if use_cache:
        synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        generate()
        synchronize(device)
        extra = dict(first_generation_s=time.perf_counter() - t0, first_generation_cpu_s=time.process_time() - c0)

    # Evidence that the cache is really used: count the sequence lengths the transformer stack is called with.
    lengths = []
    stack = getattr(model, "transformer", None)

    def record(module, args):
        if args and torch.is_tensor(args[0]) and args[0].dim() == 3:
            lengths.append(args[0].shape[1])

    hook = stack.register_forward_pre_hook(record) if isinstance(stack, torch.nn.Module) else None

    times, cpu_times = [], []
    for rep in range(reps):
        torch.manual_seed(rep)
        synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        out = generate()
        synchronize(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    if hook is not None:
        hook.remove()
    tokens = out[1] if isinstance(out, tuple) else out
    if bench.impl == "ours" and use_cache and decode not in ("plain", "speculative"):
        # the same seed through the cached module path: an exact fast path samples the same tokens
        torch.manual_seed(reps - 1)
        module_path = bench.generate(text, use_cache=use_cache, filter_thres=filter_thres, decode="plain")
        extra["tokens_equal_module_path"] = bool(torch.equal(module_path, tokens))
        extra["tokens_differing"] = int((module_path != tokens).sum())
    assert tokens.shape[-1] >= bench.image_seq_len, f"generation returned {tuple(tokens.shape)}"
    seconds = statistics.median(times)
    result = dict(s_per_batch=seconds, times=times, decode=decode, device=device,
                  transformer_calls=len(lengths) // max(reps, 1), cpu_s_per_batch=statistics.median(cpu_times),
                  cpu_times=cpu_times, batch=batch, image_seq_len=bench.image_seq_len,
                  images_per_s=batch / seconds, ms_per_token_step=1000 * seconds / bench.image_seq_len,
                  image_tokens_per_s=batch * bench.image_seq_len / seconds, s_per_image=seconds / batch, **extra)
    if lengths:
        result["one_token_calls"] = sum(1 for n in lengths if n == 1) / len(lengths)
    return result


def _effective_k(bench, filter_thres: float):
    try:
        return bench.effective_k(filter_thres)
    except Exception as err:  # a report of what could not be measured beats losing the whole measurement
        return f"unavailable: {type(err).__name__}: {err}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["ours", "peer"], default="ours")
    p.add_argument("--task", choices=["matmul", "info", "train", "generate"], required=True)
    p.add_argument("--config", default="null", help="JSON dict of DALLEConfig fields, or null for DALLEConfig()")
    p.add_argument("--variant", default="class-default", help="peer only: class-default or plain (no rotary/shift)")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--use-cache", type=int, default=1)
    p.add_argument("--filter-thres", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode", default="default", choices=["default", "plain", "fused", "compiled", "speculative",
                                                          "graph"],
                   help="generate: default (no strategy given, what users get) or a strategy (ours only)")
    p.add_argument("--device", default="cpu", help="generate: cpu or cuda")
    p.add_argument("--product-kinds", default=None, choices=["linear", "wt", "onednn"],
                   help="generate, ours: the few-row float32 product layout up to 32 rows in this process "
                        "(dalle_lab.model.linear.PRODUCT_KINDS) instead of this CPU's default: a candidate measured "
                        "side by side before it becomes a default")
    p.add_argument("--matmul-n", type=int, default=2048)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result = dict(impl=args.impl, task=args.task, torch=torch.__version__, threads=torch.get_num_threads())
    if args.task == "matmul":
        result.update(measure_matmul(args.matmul_n, reps=max(args.reps, 3)))
    else:
        from lab.perf import backends

        bench = backends.build(args.impl, json.loads(args.config), args.variant)
        result.update(config=bench.config, notes=bench.notes, rss_model_built_mb=peak_rss_mb(),
                      params=backends.param_counts(bench.model), num_image_tokens=bench.num_image_tokens,
                      filter_thres=args.filter_thres, effective_k=_effective_k(bench, args.filter_thres))
        if args.task == "info":
            pass
        elif args.task == "train":
            result.update(dtype=args.dtype, batch=args.batch,
                          **measure_train(bench, args.batch, args.dtype, args.warmup, args.steps))
        else:
            if args.product_kinds:
                from dalle_lab.model import linear

                linear.PRODUCT_KINDS = ((32, args.product_kinds),)
            result.update(use_cache=bool(args.use_cache), product_kinds=args.product_kinds,
                          **measure_generate(bench, args.batch, bool(args.use_cache), args.filter_thres, args.reps,
                                             args.decode, args.device))
    result["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
