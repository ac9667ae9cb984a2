"""Sampling a caption's continuation from DALLE's text head (generate.py --gentxt; DALLE-pytorch's generate_texts).

The text positions are trained to predict the next caption token, and after the caption the pad id unique to each
position (dalle.py): so "the caption ends here" is the own pad id of a position, and sampling it ends the caption.
DALLE-pytorch sampled over the whole text vocabulary, pad ids of other positions included; here each position may
only produce a real token or its own end, the only things training ever showed it.
"""
from __future__ import annotations

import torch

from .sampling import draw, resolve_top_k, sampling_distribution


@torch.no_grad()
def generate_texts(dalle, text: torch.Tensor, *, top_k: int | None = None, filter_thres: float | None = None,
                   top_p: float | None = None, temperature: float = 1.0,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """text (B, text_seq_len) raw ids, 0 = pad: each row's caption (the ids before its first pad) is kept and the
    positions after it are sampled one by one until the row samples its end or fills the context. An all-pad row
    gets a caption from nothing. top_k / filter_thres / top_p / temperature as for images, over the text vocabulary.
    Returns (B, text_seq_len) raw ids, 0 after each caption's end (what the tokenizer gives for that caption)."""
    cfg = dalle.config
    text = dalle.check_text(text).clone()
    vocab, seq_len = cfg.num_text_tokens, cfg.text_seq_len
    k = resolve_top_k(top_k, filter_thres, vocab)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}; for greedy decoding use top_k=1")
    is_pad = text == 0
    # each row's prefix ends at its first pad; anything after it is not part of the caption
    lengths = torch.where(is_pad.any(1), is_pad.int().argmax(1), torch.full_like(text[:, 0], seq_len))
    text[torch.arange(seq_len, device=text.device) >= lengths[:, None]] = 0
    ended = torch.zeros(text.shape[0], dtype=torch.bool, device=text.device)
    was_training = dalle.training
    dalle.eval()
    try:
        for t in range(int(lengths.min()), seq_len):
            sampling = (lengths <= t) & ~ended  # rows whose caption is open at position t
            if not sampling.any():
                continue
            h, _ = dalle.hidden(dalle.text_ids(text), None)  # causal: positions >= t do not change h[:, t]
            logits = dalle.to_text_logits(h[:, t]).float()  # predicts the id at text position t
            allowed = torch.zeros_like(logits, dtype=torch.bool)
            allowed[:, 1:vocab] = True  # real tokens (0 is never a target: pads are remapped to their own ids)
            allowed[:, vocab + t] = True  # this position's own pad id: the caption ends here
            log_probs = sampling_distribution(logits.masked_fill(~allowed, float("-inf")), temperature=temperature,
                                              top_k=k, top_p=top_p)
            token = draw(log_probs.exp(), generator)
            end = token == vocab + t
            text[:, t] = torch.where(sampling & ~end, token, text[:, t])
            ended |= sampling & end
    finally:
        dalle.train(was_training)
    return text
