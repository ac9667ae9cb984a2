"""Quick speed check of the DALLE model (training tokens/s and cached generation tokens/s, fp32 and bf16).

Reference config of issue 8: dim 256, depth 4, heads 8, dim_head 32, 1000 text tokens, text_seq_len 32,
16x16 image tokens (codebook 512), batch 8, AdamW; generation of a batch of 4 images.
Run:  .venv/bin/python -m lab.perf.quick_model_speed [--threads 2] [--steps 6] [--skip_gen]
Numbers depend on machine load: on a shared machine compare runs made back to back, never stored numbers, and
prefer the CPU-time figures (process CPU seconds, all threads), which contention inflates less than wall time.
"""
import argparse
import contextlib
import time

import torch

from dalle_lab.model import DALLE


def reference_model():
    return DALLE(dim=256, depth=4, heads=8, dim_head=32, num_text_tokens=1000, text_seq_len=32,
                 num_image_tokens=512, image_fmap_size=16, null_cond_prob=0.0)


def autocast(dtype):
    if dtype == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_speed(dtype, steps, batch=8):
    torch.manual_seed(0)
    model = reference_model().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    cfg = model.config
    text = torch.randint(1, cfg.num_text_tokens, (batch, cfg.text_seq_len))
    image = torch.randint(0, cfg.num_image_tokens, (batch, cfg.image_seq_len))
    times, cpu_times = [], []
    for step in range(steps + 2):  # two warm-up steps
        start, cpu_start = time.perf_counter(), time.process_time()
        with autocast(dtype):
            loss = model(text, image, return_loss=True)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    step_time = sorted(times[2:])[len(times[2:]) // 2]  # median
    cpu_time = sorted(cpu_times[2:])[len(cpu_times[2:]) // 2]
    tokens = batch * (cfg.text_seq_len + cfg.image_seq_len)
    return step_time, tokens / step_time, cpu_time


def gen_speed(dtype, use_cache=True, batch=4, cond_scale=1.0):
    torch.manual_seed(0)
    model = reference_model().eval()
    cfg = model.config
    text = torch.randint(1, cfg.num_text_tokens, (batch, cfg.text_seq_len))
    with autocast(dtype):
        model.generate_images(text[:, :], return_tokens=True, use_cache=use_cache, top_k=64)  # warm-up
        start, cpu_start = time.perf_counter(), time.process_time()
        model.generate_images(text, return_tokens=True, use_cache=use_cache, top_k=64, cond_scale=cond_scale)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return elapsed, batch * cfg.image_seq_len / elapsed, cpu


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip_gen", action="store_true")
    parser.add_argument("--skip_train", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    params = sum(p.numel() for p in reference_model().parameters())
    print(f"reference config, {params / 1e6:.2f}M parameters, {args.threads} threads")
    for dtype in ("fp32", "bf16"):
        if not args.skip_train:
            step, tps, cpu = train_speed(dtype, args.steps)
            print(f"train {dtype}: {step * 1000:.0f} ms/step, {tps:.0f} tokens/s (batch 8 x 288 tokens); "
                  f"CPU {cpu:.3f} s/step")
        if not args.skip_gen:
            elapsed, tps, cpu = gen_speed(dtype)
            print(f"generate {dtype} cached, batch 4: {elapsed:.2f} s, {tps:.0f} image tokens/s; CPU {cpu:.2f} s")
            elapsed, tps, cpu = gen_speed(dtype, cond_scale=3.0)
            print(f"generate {dtype} cached + guidance (cond_scale 3), batch 4: {elapsed:.2f} s, {tps:.0f} image "
                  f"tokens/s; CPU {cpu:.2f} s")


if __name__ == "__main__":
    main()
