#!/usr/bin/env python
"""Training steps/s from pre-tokenized shards against encoding every batch with the VQGAN on the fly.

    nice -n 19 python -m lab.perf.pretokenized_speed --threads 2

Two cases, each trained twice through dalle_lab.training.loop.train with the same settings, once on an image-text
folder (the VQGAN encoder runs in every step) and once on that folder's token shards (pretokenize.py):
- default: the shipped Shapes VQGAN (32 px -> 8x8 codes of 512) and the default model and batch (64), 128 images;
- f16: a real-size taming f16 VQGAN architecture (256 px -> 16x16 codes of 1024, ch 128, ch_mult 1,1,2,2,4, two
  res blocks, attention at 16 px; random weights: the cost does not depend on them), batch 2 of 4 images.
Raw per-step wall and CPU seconds (between consecutive optimizer steps: fetching the batch, encoding, forward,
backward, optimizer), the pretokenize time per image, the command, git commit, load average and threads go to the JSON file. The first step
of each run is left out (allocation warm-up). The machine may be shared: compare the ratios, CPU time first.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lab.common import git_state

F16_DDCONFIG = {"double_z": False, "z_channels": 256, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
                "ch_mult": [1, 1, 2, 2, 4], "num_res_blocks": 2, "attn_resolutions": [16], "dropout": 0.0}


def f16_vqgan(directory: Path):
    """taming's VQModel of the published f16 ImageNet VQGAN's shape (codebook 1024), random weights."""
    import torch

    from dalle_lab.vae import taming_format

    config = {"target": "taming.models.vqgan.VQModel",
              "params": {"embed_dim": 256, "n_embed": 1024, "ddconfig": F16_DDCONFIG,
                         "lossconfig": dict(taming_format.NO_LOSS)}}
    torch.manual_seed(0)
    model = taming_format.build_model(config)
    model.quantize.embedding.weight.data.normal_()  # several codes in use, as a trained codebook would
    return (taming_format.write_checkpoint(model, directory / "f16.ckpt"),
            taming_format.write_config(config, directory / "f16.yaml"))


def shapes_folder(directory: Path, n: int, image_size: int) -> Path:
    from PIL import Image

    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.image_grid import to_uint8

    directory.mkdir(parents=True)
    shapes = ShapesDataset(length=n, image_size=image_size, seed=0)
    for i in range(n):
        image, caption = shapes[i]
        Image.fromarray(to_uint8(image[None])[0]).save(directory / f"{i:05d}.png")
        (directory / f"{i:05d}.txt").write_text(caption + "\n")
    return directory


class StepClock:
    """Wall and CPU seconds between consecutive optimizer steps (the loop calls RunLogger.advance once a step).
    CPU time (this process, all threads) is the steadier number on a shared machine: it does not grow when other
    jobs take the cores, only when the step itself does more work."""

    def __init__(self):
        self.marks = []

    def __enter__(self):
        from dalle_lab.training.logging import RunLogger

        self.original = RunLogger.advance
        clock = self

        def advance(logger, *args, **kwargs):
            clock.marks.append((time.perf_counter(), time.process_time()))
            return clock.original(logger, *args, **kwargs)

        RunLogger.advance = advance
        return self

    def __exit__(self, *exc):
        from dalle_lab.training.logging import RunLogger

        RunLogger.advance = self.original

    def seconds(self):
        """(wall, cpu) per step from step 2 on (step 1 has no start mark and pays the allocation warm-up)."""
        pairs = list(zip(self.marks, self.marks[1:]))
        return [b[0] - a[0] for a, b in pairs], [b[1] - a[1] for a, b in pairs]


def run_case(name: str, work: Path, images: int, image_size: int, batch_size: int, steps: int, vqgan,
             amp: bool) -> dict:
    from dalle_lab.data.pretokenize import pretokenize
    from dalle_lab.tokenizers import DEFAULT_BPE_PATH
    from dalle_lab.training.config import TrainConfig
    from dalle_lab.training.loop import train
    from dalle_lab.training.tokenizer_choice import image_tokenizer_for_pretokenize

    folder = shapes_folder(work / f"{name}_images", images, image_size)
    vae = image_tokenizer_for_pretokenize(str(folder), *(vqgan or (None, None)), dataset=None if vqgan else "shapes")
    start = time.perf_counter()
    pretokenize(str(folder), work / f"{name}_tokens", vae, batch_size=batch_size, progress=False)
    pretokenize_s = time.perf_counter() - start
    from dalle_lab.vae.shipped import shipped_paths

    vqgan_files = vqgan or shipped_paths("shapes")  # a Shapes folder: the built-in tokenizer, named explicitly
    vqgan_flags = {"vqgan_model_path": str(vqgan_files[0]), "vqgan_config_path": str(vqgan_files[1])}
    common = dict(bpe_path=str(DEFAULT_BPE_PATH), batch_size=batch_size, max_steps=steps, sample_every_n_steps=0, save_every_n_steps=0,
                  progress=False, log_every_n_steps=10**6, amp=amp)
    row = {"images": images, "image_size": image_size, "fmap_size": vae.fmap_size, "codebook": vae.num_tokens,
           "batch_size": batch_size, "steps": steps, "pretokenize_s": pretokenize_s,
           "pretokenize_s_per_image": pretokenize_s / images}
    for label, cfg in (("on_the_fly", TrainConfig(image_text_folder=str(folder), output_dir=str(work / f"{name}_a"),
                                                  **vqgan_flags, **common)),
                       ("pretokenized", TrainConfig(image_text_folder=str(work / f"{name}_tokens"),
                                                    output_dir=str(work / f"{name}_b"), **common))):
        load_before = os.getloadavg()
        with StepClock() as clock:
            train(cfg)
        wall, cpu = clock.seconds()
        row[label] = {"wall_step_s": wall, "cpu_step_s": cpu, "median_wall_step_s": statistics.median(wall),
                      "median_cpu_step_s": statistics.median(cpu), "steps_per_s": 1 / statistics.median(wall),
                      "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
        print(f"{name:8s} {label:13s} {1 / statistics.median(wall):7.3f} steps/s wall, "
              f"{statistics.median(cpu):7.3f} CPU s/step (medians of {len(wall)} steps, load {load_before[0]:.2f})",
              flush=True)
    for key, what in (("speedup_wall", "median_wall_step_s"), ("speedup_cpu", "median_cpu_step_s")):
        row[key] = row["on_the_fly"][what] / row["pretokenized"][what]
    print(f"{name:8s} speed-up {row['speedup_wall']:.2f}x wall, {row['speedup_cpu']:.2f}x CPU time; pretokenize "
          f"{row['pretokenize_s_per_image'] * 1e3:.1f} ms/image", flush=True)
    return row


def cpu_description() -> dict:
    """The CPU model and whether it has the AVX-512 / bf16 instructions that decide what bf16 autocast costs."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return {"model": model, "avx512f": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags,
            "avx2": "avx2" in flags}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cases", default="default,f16")
    # small by default: on two cores shared with other jobs under nice 19 this process may get a few % of a core
    p.add_argument("--steps", type=int, default=5, help="steps per run, default case (batch 64 of 128 images)")
    p.add_argument("--f16_steps", type=int, default=3, help="steps per run, f16 case (batch 2 of 4 images)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=False,
                   help="bf16 autocast (train_dalle.py's default); off by default here because CPUs without AVX-512 "
                        "run bf16 matmuls emulated, many times slower than float32, which would hide the encoder")
    p.add_argument("--out", default="lab/perf/results/pretokenized/speed.json")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    git = git_state()
    commit, dirty = git["commit"], git["dirty"]
    results = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "git_commit": commit,
               "git_dirty": dirty, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
               "nice": os.nice(0), "amp": args.amp, "cpu": cpu_description(), "loadavg_start": os.getloadavg(), "torch": torch.__version__, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="pretok_bench_") as tmp:
        work = Path(tmp)
        for case in args.cases.split(","):
            if case == "default":
                results["cases"]["default"] = run_case("default", work, 128, 32, 64, args.steps, None, args.amp)
            elif case == "f16":
                results["cases"]["f16"] = run_case("f16", work, 4, 256, 2, args.f16_steps, f16_vqgan(work), args.amp)
            else:
                raise SystemExit(f"unknown case {case!r}")
    results["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
