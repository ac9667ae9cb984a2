"""Generation as one layer: GenerationConfig (sampling + strategy) and generate(), over one KV cache.

    from dalle_lab.generate import GenerationConfig, generate
    tokens, logprobs = generate(dalle, text, GenerationConfig(strategy="auto"), generator=torch.Generator())

Modules: config (GenerationConfig, STRATEGIES), generation (prefill / decode_one_token / decode_n_tokens /
generate), decoder (the rows and passes of one generation), cache (the KV cache), strategy (choose_strategy, the
one-token steps), sampling (the maths of the sampling distribution), speculative, compiled, graphs, threads,
text (continuing captions with the text head), folders (captions to image files, as generate.py writes them).
"""
from .config import DEFAULT_WINDOW, STRATEGIES, GenerationConfig
from .generation import decode_n_tokens, decode_one_token, generate, prefill

__all__ = ["DEFAULT_WINDOW", "GenerationConfig", "STRATEGIES", "decode_n_tokens", "decode_one_token", "generate",
           "prefill"]
