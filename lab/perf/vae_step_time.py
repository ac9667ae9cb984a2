#!/usr/bin/env python
"""Seconds per train_vae.py step on this machine, for the precision choices the trainer could make.

    python -m lab.perf.vae_step_time --threads 2

Rows: bf16 autocast with float32 GroupNorm (what train_vae.py does), bf16 autocast with taming's GroupNorm left
in bf16, and plain float32. Each times 8 steps after 2 warm-up steps on the default Shapes settings.
"""
import argparse
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args(argv)

    import torch

    from dalle_lab.vae.train import Float32GroupNorm, VAETrainConfig, build_run, image_batches, train_step, training_data

    torch.set_num_threads(args.threads)
    print(f"train_vae step time, batch {args.batch_size}, {args.threads} threads:")
    for label, precision, float32_groupnorm in (("bf16 autocast, float32 GroupNorm (train_vae.py)", "bf16", True),
                                                ("bf16 autocast, bf16 GroupNorm", "bf16", False),
                                                ("float32", "fp32", True)):
        cfg = VAETrainConfig(precision=precision, batch_size=args.batch_size, val_size=8)
        torch.manual_seed(0)
        run = build_run(cfg, torch.device("cpu"))
        if not float32_groupnorm:  # back to torch's own GroupNorm: same object, same weights
            for module in run.model.modules():
                if isinstance(module, Float32GroupNorm):
                    module.__class__ = torch.nn.GroupNorm
        amp = torch.bfloat16 if precision == "bf16" else None
        source, _ = training_data(cfg)
        batches = image_batches(source, cfg, 0)
        images = [next(batches) for _ in range(args.steps + 2)]
        for x in images[:2]:
            train_step(run, cfg, x, None, amp)
        start = time.perf_counter()
        for x in images[2:]:
            train_step(run, cfg, x, None, amp)
        print(f"  {label:50s} {(time.perf_counter() - start) / args.steps:.3f} s/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
