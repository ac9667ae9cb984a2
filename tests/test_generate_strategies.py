"""Every decoding strategy samples the module path's tokens for a fixed seed.

The reference is computed in this process: the uncached module path (every pass reruns the whole prefix through
the network's modules) and the cached module path. Every one-token strategy must give exactly their tokens (and
their log-probs to float rounding) for each model option and sampling setting. Speculative decoding draws other
tokens for the same seed (its distribution is the same: tests/test_speculative.py), so it is pinned against
itself through the other cache layout (CUDA-graph passes).
"""
import shutil

import pytest
import torch

from dalle_lab.model import compiled_step
from dalle_lab.model.decoding import Sampling, plain_decode
from dalle_lab.sampling import resolve_top_k

from tiny_models import opinionated_dalle

has_compiler = shutil.which("g++") is not None or shutil.which("c++") is not None

OPTIONS = {
    "default": {},
    "stable": dict(stable=True),
    "sandwich": dict(sandwich_norm=True),
    "shared": dict(depth=3, shared_attn_ids=(0, 0, 1), shared_ff_ids=(0, 1, 1)),
    "tied": dict(share_input_output_emb=True),
    "rotary": dict(rotary_emb=True),
    "shift": dict(shift_tokens=True),
    "rotary_shift": dict(rotary_emb=True, shift_tokens=True),  # DALLE-pytorch 1.6.6's class defaults
    "sparse": dict(attn_types=("axial_row", "conv_like")),
    "all": dict(attn_types=("conv_like", "axial_col"), rotary_emb=True, shift_tokens=True, shared_ff_ids=(1, 1),
                share_input_output_emb=True, stable=True),
}
SAMPLINGS = {
    "top_k": dict(top_k=8),
    "guided": dict(cond_scale=3.0, top_p=0.9, temperature=0.8),
    "primed": dict(top_k=8, num_init_img_tokens=5),
}
ONE_TOKEN = ["plain", "fused", "graph", "auto"]
TEXT = torch.tensor([[3, 9, 4, 0, 0], [7, 1, 0, 0, 0], [2, 2, 2, 2, 2]])
PRIME = torch.randint(0, 24, (3, 16), generator=torch.Generator().manual_seed(9))


def _generate(model, strategy, seed=0, **sampling):
    """(tokens, logprobs) of one generation through `strategy` for a fixed seed."""
    generator = torch.Generator().manual_seed(seed)
    if "num_init_img_tokens" in sampling:
        sampling["img"] = PRIME
    kw = dict(return_tokens=True, return_logprobs=True, generator=generator, **sampling)
    if strategy == "plain":  # the cached module path
        n_init = kw.pop("num_init_img_tokens", 0)
        kw.pop("img", None)
        tokens = torch.zeros(3, 16, dtype=torch.long)
        tokens[:, :n_init] = PRIME[:, :n_init]
        logprobs = torch.zeros(3, 16)
        s = Sampling(kw.get("cond_scale", 1.0), kw.get("temperature", 1.0), resolve_top_k(kw.get("top_k"), None, 24),
                     kw.get("top_p"))
        with torch.no_grad():
            plain_decode(model, model._text_ids(TEXT), tokens, logprobs, n_init, s, generator, fused=False)
        return tokens, logprobs
    strategy_kw = {"uncached": dict(use_cache=False), "fused": dict(speculative=False), "auto": {},
                   "compiled": dict(compile=True), "graph": dict(cuda_graph=True),
                   "speculative": dict(speculative=True, speculative_window=3),
                   "speculative_graph": dict(speculative=True, speculative_window=3, cuda_graph=True)}[strategy]
    return model.generate_images(TEXT, **kw, **strategy_kw)


@pytest.fixture(scope="module")
def references():
    """(option, sampling) -> the uncached module path's (tokens, logprobs), computed once in this process."""
    return {}


def _reference(references, name, sampling_name):
    key = (name, sampling_name)
    if key not in references:
        references[key] = _generate(opinionated_dalle(**OPTIONS[name]), "uncached", **SAMPLINGS[sampling_name])
    return references[key]


@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_one_token_strategy_gives_the_module_path_tokens(references, name, sampling_name):
    tokens, logprobs = _reference(references, name, sampling_name)
    model = opinionated_dalle(**OPTIONS[name])
    for strategy in ONE_TOKEN:
        got, got_lp = _generate(model, strategy, **SAMPLINGS[sampling_name])
        assert torch.equal(got, tokens), strategy
        torch.testing.assert_close(got_lp, logprobs, atol=1e-5, rtol=1e-5, msg=strategy)
    n_init = SAMPLINGS[sampling_name].get("num_init_img_tokens", 0)
    assert torch.equal(tokens[:, :n_init], PRIME[:, :n_init])
    assert len(set(tokens[:, n_init:].flatten().tolist())) > 3  # far from a constant image: a real comparison


@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
@pytest.mark.parametrize("name", ["default", "rotary_shift", "all"])
def test_speculative_tokens_are_the_same_through_either_pass_kind(name, sampling_name):
    model = opinionated_dalle(**OPTIONS[name])
    tokens, logprobs = _generate(model, "speculative", **SAMPLINGS[sampling_name])
    graphed, graphed_lp = _generate(model, "speculative_graph", **SAMPLINGS[sampling_name])
    assert torch.equal(tokens, graphed)
    torch.testing.assert_close(logprobs, graphed_lp, atol=1e-5, rtol=1e-5)
    again, _ = _generate(model, "speculative", seed=1, **SAMPLINGS[sampling_name])
    assert not torch.equal(tokens, again)  # the seed matters: the comparison above is not vacuous


@pytest.mark.skipif(not has_compiler, reason="TorchInductor's CPU backend needs a C++ compiler (g++)")
@pytest.mark.parametrize("name", ["default", "stable"])
def test_the_compiled_step_gives_the_module_path_tokens(references, name, monkeypatch):
    monkeypatch.setattr(compiled_step, "MAX_AUTOTUNE", False)  # the same graph, compiled in seconds
    model = opinionated_dalle(**OPTIONS[name])
    for sampling_name in SAMPLINGS:
        tokens, logprobs = _reference(references, name, sampling_name)
        got, got_lp = _generate(model, "compiled", **SAMPLINGS[sampling_name])
        assert torch.equal(got, tokens), sampling_name
        torch.testing.assert_close(got_lp, logprobs, atol=1e-5, rtol=1e-5)
