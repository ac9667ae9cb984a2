"""The tiny DALLE the decoding tests share: small enough to decode in milliseconds, with weights larger than the
training init so its distributions are far from uniform (near-uniform logits would make cached / uncached / fused
comparisons trivially robust)."""
import torch

from dalle_lab.model import DALLE

TINY = dict(dim=32, depth=2, heads=2, dim_head=16, num_text_tokens=50, text_seq_len=5, num_image_tokens=24,
            image_fmap_size=4, null_cond_prob=0.0)


def opinionated_dalle(seed=0, **overrides):
    torch.manual_seed(seed)
    model = DALLE(**{**TINY, **overrides}).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model
