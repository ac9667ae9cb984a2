"""generate(): image tokens for captions, in gpt-fast's shape: prefill, decode one token, decode n tokens.

    tokens, logprobs = generate(dalle, text, GenerationConfig(top_k=10, cond_scale=2.0), generator=g)

The model is any network with DALLE's decoding interface (model/dalle.py: check_text, text_ids, null_text, embed,
embed_image, transformer over a KV cache, final, to_image_logits, packed_weights, why_not_fused, fused_step,
decode_step); this layer holds no network code. Sampling is sampling.py's, so the log-probs recorded here are
exactly what `sampling_distribution` recomputes from `dalle.logits` (the alignment add-on relies on it).
"""
from __future__ import annotations

from typing import Callable

import torch

from .config import GenerationConfig
from .decoder import Decoder
from .sampling import sample_from_log_probs
from .speculative import speculative_decode, window_slack
from .strategy import choose_strategy, one_token_step, resources

# logits_callback(position, logits_cond, logits_uncond_or_None): sees the raw logits before each token is sampled
LogitsCallback = Callable[[int, torch.Tensor, torch.Tensor | None], None]


def prefill(dec: Decoder, strategy: str, prime: torch.Tensor) -> torch.Tensor:
    """BOS + text + the primed image tokens (B, n_init) -> logits (rows, V) of image position n_init."""
    return dec.full(prime) if strategy == "uncached" else dec.prefill(prime)


def decode_one_token(dec: Decoder, logits: torch.Tensor, generator: torch.Generator | None):
    """Logits (rows, V) of one position -> (tokens (B,), their log-probs (B,)) under the sampling distribution."""
    return sample_from_log_probs(dec.log_probs(logits), generator)


def decode_n_tokens(dec: Decoder, strategy: str, tokens: torch.Tensor, logprobs: torch.Tensor, n_init: int,
                    generator: torch.Generator | None = None, logits_callback: LogitsCallback | None = None) -> None:
    """One token per pass, in order: fills tokens / logprobs (B, N) from n_init on."""
    logits = prefill(dec, strategy, tokens[:, :n_init])
    step = one_token_step(dec, strategy)
    for i in range(n_init, tokens.shape[1]):
        if i > n_init:
            logits = step(tokens, i)
        if logits_callback is not None:
            logits_callback(i, *dec.split(logits))
        tokens[:, i], logprobs[:, i] = decode_one_token(dec, logits, generator)


@torch.no_grad()
def generate(model, text: torch.Tensor, config: GenerationConfig, *, prime: torch.Tensor | None = None,
             generator: torch.Generator | None = None, logits_callback: LogitsCallback | None = None):
    """Sample the image tokens of each caption in text (B, text_seq_len) (0 = pad).

    prime: (B, n_init) image tokens kept as the start of every image; generator: for reproducible sampling;
    logits_callback: see LogitsCallback (not with the speculative strategy). The model runs in eval mode and is
    put back in the mode it was in. Returns (tokens (B, image_seq_len) int64, logprobs (B, image_seq_len) float32):
    the log-probability of each sampled token under the sampling distribution (guidance, temperature, top-k,
    top-p applied), 0 at primed positions.
    """
    text_ids = model.text_ids(model.check_text(text))
    batch, n = text_ids.shape[0], model.config.image_seq_len
    tokens = torch.zeros(batch, n, dtype=torch.long, device=text_ids.device)
    logprobs = torch.zeros(batch, n, dtype=torch.float32, device=text_ids.device)
    n_init = 0
    if prime is not None:
        n_init = prime.shape[1]
        tokens[:, :n_init] = prime
    was_training = model.training
    model.eval()
    try:
        strategy = choose_strategy(model, config, logits_callback)
        speculative = strategy == "speculative"
        extra = window_slack(config.speculative_window) if speculative else 1 if strategy == "graph" else 0
        dec = Decoder(model, text_ids, config, extra_len=extra)
        rows = dec.rows * (config.speculative_window + 1 if speculative else 1)
        with resources(model, strategy, rows):
            if speculative:  # window passes captured as CUDA graphs on a GPU, the same arithmetic elsewhere
                speculative_decode(dec, tokens, logprobs, n_init, generator, graphs=text_ids.is_cuda)
            else:
                decode_n_tokens(dec, strategy, tokens, logprobs, n_init, generator, logits_callback)
    finally:
        model.train(was_training)
    return tokens, logprobs
