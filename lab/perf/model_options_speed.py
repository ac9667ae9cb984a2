"""CPU time of a training step and a cached generation with each issue-16 model option (docs/model.md, "Speed").

Reference config of quick_model_speed.py (dim 256, depth 4, 32 text + 256 image tokens), float32, 1 thread.
Run:  .venv/bin/python -m lab.perf.model_options_speed [option names...]   (default: all of them)
Compare rows of one run only: the machine's load moves absolute times by 10-15%.
"""
import sys
import time

import torch

from dalle_lab.model import DALLE

OPTIONS = {"default": {}, "axial": dict(attn_types="axial_row,axial_col"), "conv_like": dict(attn_types="conv_like"),
           "rotary_emb": dict(rotary_emb=True), "shift_tokens": dict(shift_tokens=True), "stable": dict(stable=True)}


def measure(name: str, rounds: int = 3):
    torch.manual_seed(0)
    model = DALLE(dim=256, depth=4, heads=8, dim_head=32, num_text_tokens=1000, text_seq_len=32, num_image_tokens=512,
                  image_fmap_size=16, null_cond_prob=0.0, **OPTIONS[name])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    text, image = torch.randint(1, 1000, (8, 32)), torch.randint(0, 512, (8, 256))
    train = []
    for _ in range(rounds):
        start = time.process_time()
        model(text, image, return_loss=True).backward()
        opt.step()
        opt.zero_grad()
        train.append(time.process_time() - start)
    model.eval()
    gen = []
    for _ in range(rounds):
        start = time.process_time()
        model.generate_images(text[:4], return_tokens=True, top_k=10, generator=torch.Generator().manual_seed(0))
        gen.append(time.process_time() - start)
    # the first round warms up allocators and kernels
    print(f"{name}: train step (batch 8) {min(train[1:]):.3f} CPU s, generation (4 x 256 tokens) "
          f"{min(gen[1:]):.3f} CPU s", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    for option in sys.argv[1:] or OPTIONS:
        measure(option)
