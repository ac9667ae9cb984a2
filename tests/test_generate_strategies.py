"""Every decoding strategy samples the module path's tokens for a fixed seed.

The reference is computed in this process: the uncached module path (every pass reruns the whole prefix through
the network's modules) and the cached module path. Every one-token strategy must give exactly their tokens (and
their log-probs to float rounding) for each model option and sampling setting. Speculative decoding draws other
tokens for the same seed (its distribution is the same: tests/test_speculative.py), so it is pinned against
itself through the other cache layout (CUDA-graph passes).
"""
import shutil
import warnings

import pytest
import torch

from dalle_lab.generate import GenerationConfig, compiled
from dalle_lab.generate.decoder import Decoder
from dalle_lab.generate.speculative import speculative_decode, window_slack

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
    "layer_scale": dict(layer_scale=True, sandwich_norm=True),
    # a model converted from DALLE-pytorch with its class defaults (dalle_lab.convert), and with its `stable`
    "dp_class_default": dict(rotary_emb=True, shift_tokens=True, layer_scale=True, rotary_style="dallepytorch",
                             attention_math="dallepytorch"),
    "dp_fp16": dict(rotary_emb=True, shift_tokens=True, layer_scale=True, rotary_style="dallepytorch_fp16",
                    attention_math="dallepytorch", attn_types=("full", "axial_row")),
    "dp_stable": dict(rotary_emb=True, shift_tokens=True, layer_scale=True, rotary_style="dallepytorch", stable=True,
                      stable_style="dallepytorch", attention_math="dallepytorch"),
}
SAMPLINGS = {
    "top_k": dict(top_k=8),
    "guided": dict(cond_scale=3.0, top_p=0.9, temperature=0.8),
    "primed": dict(top_k=8, num_init_img_tokens=5),
}
ONE_TOKEN = ["plain", "fused", "graph", "auto"]  # "fused" where the model allows it
TEXT = torch.tensor([[3, 9, 4, 0, 0], [7, 1, 0, 0, 0], [2, 2, 2, 2, 2]])
PRIME = torch.randint(0, 24, (3, 16), generator=torch.Generator().manual_seed(9))


def _generate(model, strategy, seed=0, **sampling):
    """(tokens, logprobs) of one generation through `strategy` for a fixed seed."""
    generator = torch.Generator().manual_seed(seed)
    if "num_init_img_tokens" in sampling:
        sampling["img"] = PRIME
    if strategy == "speculative_graph":  # the window passes over fixed shapes, as a CUDA graph replays them
        return _speculative_graph(model, generator, **sampling)
    return model.generate_images(TEXT, return_tokens=True, return_logprobs=True, generator=generator,
                                 strategy=strategy, speculative_window=3, **sampling)


def _speculative_graph(model, generator, img=None, num_init_img_tokens=0, **sampling):
    config = GenerationConfig(**{"top_k": None, "temperature": 1.0, "cond_scale": 1.0, **sampling},
                              strategy="speculative", speculative_window=3)
    tokens, logprobs = torch.zeros(3, 16, dtype=torch.long), torch.zeros(3, 16)
    tokens[:, :num_init_img_tokens] = PRIME[:, :num_init_img_tokens]
    with torch.no_grad():
        dec = Decoder(model, model.text_ids(TEXT), config, extra_len=window_slack(3))
        with model.packed_weights(dec.rows * 4):
            speculative_decode(dec, tokens, logprobs, num_init_img_tokens, generator, graphs=True)
    return tokens, logprobs


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
    runs = {}
    for strategy in ONE_TOKEN if model.why_not_fused() is None else [s for s in ONE_TOKEN if s != "fused"]:
        got, got_lp = runs[strategy] = _generate(model, strategy, **SAMPLINGS[sampling_name])
        assert torch.equal(got, tokens), strategy
        torch.testing.assert_close(got_lp, logprobs, atol=1e-5, rtol=1e-5, msg=strategy)
    if "fused" in runs:  # the same products and attention calls as the cached module path: the same bits
        assert torch.equal(runs["fused"][1], runs["plain"][1]) and torch.equal(runs["auto"][1], runs["plain"][1])
    n_init = SAMPLINGS[sampling_name].get("num_init_img_tokens", 0)
    assert torch.equal(tokens[:, :n_init], PRIME[:, :n_init])
    assert len(set(tokens[:, n_init:].flatten().tolist())) > 3  # far from a constant image: a real comparison


@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
@pytest.mark.parametrize("name", ["default", "rotary_shift", "all", "dp_class_default"])
def test_speculative_tokens_are_the_same_through_either_pass_kind(name, sampling_name):
    model = opinionated_dalle(**OPTIONS[name])
    tokens, logprobs = _generate(model, "speculative", **SAMPLINGS[sampling_name])
    graphed, graphed_lp = _generate(model, "speculative_graph", **SAMPLINGS[sampling_name])
    assert torch.equal(tokens, graphed)
    torch.testing.assert_close(logprobs, graphed_lp, atol=1e-5, rtol=1e-5)
    again, _ = _generate(model, "speculative", seed=1, **SAMPLINGS[sampling_name])
    assert not torch.equal(tokens, again)  # the seed matters: the comparison above is not vacuous


@pytest.mark.skipif(not has_compiler, reason="TorchInductor's CPU backend needs a C++ compiler (g++)")
@pytest.mark.parametrize("name", ["default", "stable", "rotary_shift", "dp_stable"])
def test_the_compiled_step_gives_the_module_path_tokens(references, name, monkeypatch):
    monkeypatch.setattr(compiled, "MAX_AUTOTUNE", False)  # the same graph, compiled in seconds
    model = opinionated_dalle(**OPTIONS[name])
    for sampling_name in SAMPLINGS:
        tokens, logprobs = _reference(references, name, sampling_name)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a fallback to the eager step would warn
            got, got_lp = _generate(model, "compiled", **SAMPLINGS[sampling_name])
        assert torch.equal(got, tokens), sampling_name
        torch.testing.assert_close(got_lp, logprobs, atol=1e-5, rtol=1e-5)
    assert model in compiled._COMPILED  # the graph ran, not a fallback
