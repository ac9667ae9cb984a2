"""The Inductor-compiled decode step (generate/compiled.py): the same tokens as the eager cached path, frozen
weights never used stale, a failed compile falls back to the eager step with a warning."""
import os
import shutil
import warnings

import pytest
import torch

from dalle_lab.generate import compiled as compiled_step
from dalle_lab.model import DALLE

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                    reason="TorchInductor's CPU backend needs a C++ compiler (g++)")

CONFIG = dict(dim=32, depth=2, heads=2, dim_head=16, num_text_tokens=50, text_seq_len=5, num_image_tokens=24,
              image_fmap_size=3)


def _model(seed=0, **extra):
    torch.manual_seed(seed)
    return DALLE(**CONFIG, **extra).eval()


def _tokens(model, compile, seed=0, **kw):
    text = torch.randint(1, 50, (2, 5), generator=torch.Generator().manual_seed(1))
    return model.generate_images(text, return_tokens=True, top_k=8, strategy="compiled" if compile else "plain",
                                 generator=torch.Generator().manual_seed(seed), **kw)


@pytest.fixture
def cheap_compile(monkeypatch):
    """Plain Inductor instead of max-autotune (same graph, seconds instead of a minute to compile)."""
    monkeypatch.setattr(compiled_step, "MAX_AUTOTUNE", False)


def _no_fallback(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to the eager step would warn
        return fn()


@needs_compiler
@pytest.mark.parametrize("extra", [dict(stable=True), dict(sandwich_norm=True), dict(share_input_output_emb=True),
                                   dict(shared_attn_ids=(0, 0), shared_ff_ids=(0, 0)), dict(layer_scale=True),
                                   dict(rotary_emb=True, shift_tokens=True, layer_scale=True,
                                        rotary_style="dallepytorch")])
def test_compiled_options_and_inference_mode(cheap_compile, extra):
    model = _model(**extra)
    with torch.inference_mode():  # as generate.py runs
        assert torch.equal(_no_fallback(lambda: _tokens(model, True)), _tokens(model, False))
    assert model in compiled_step._COMPILED  # compiled, not skipped


@needs_compiler
def test_max_autotune_gives_the_eager_tokens_and_never_uses_stale_weights():
    # max-autotune prepacks the frozen weights into copies: a graph built before a weight change would use the old
    # ones (plain Inductor aliases them, which would hide the bug)
    model = _model()
    for seed, kw in ((0, {}), (1, dict(cond_scale=3.0, temperature=0.7))):
        assert torch.equal(_no_fallback(lambda: _tokens(model, True, seed, **kw)), _tokens(model, False, seed, **kw))
    first = compiled_step._COMPILED[model]  # the compiled graph ran, not a fallback
    with torch.no_grad():
        for p in model.transformer.parameters():
            p.add_(0.05 * torch.randn_like(p))  # an optimizer-like step: bumps the version counters
    assert torch.equal(_no_fallback(lambda: _tokens(model, True)), _tokens(model, False))
    second = compiled_step._COMPILED[model]
    assert second is not first  # rebuilt from the new weights (whether or not this graph aliased the old ones)
    other = _model(seed=3)
    for p, q in zip(model.parameters(), other.parameters()):
        p.data.copy_(q)  # .data writes leave the version counter alone; the weight sums still move
    assert torch.equal(_tokens(other, False), _tokens(model, False))
    assert torch.equal(_no_fallback(lambda: _tokens(model, True)), _tokens(model, False))
    third = compiled_step._COMPILED[model]
    assert third is not second
    _tokens(model, True)
    assert compiled_step._COMPILED[model] is third  # unchanged weights: the same graph, no recompile


@needs_compiler
def test_two_models_of_one_config_keep_their_own_weights():
    a, b = _model(seed=0), _model(seed=1)
    ta, tb = _no_fallback(lambda: _tokens(a, True)), _no_fallback(lambda: _tokens(b, True))
    assert torch.equal(ta, _tokens(a, False)) and torch.equal(tb, _tokens(b, False))
    assert not torch.equal(ta, tb)


_PROCESS = """
import sys, torch
sys.path[:0] = [{tests!r}]
from test_compiled_step import _model, _tokens
model = _model(seed=int(sys.argv[1]))
compiled, eager = _tokens(model, True), _tokens(model, False)
print("EQUAL" if torch.equal(compiled, eager) else f"DIFFERENT {{compiled.tolist()}} {{eager.tolist()}}")
"""


@needs_compiler
@pytest.mark.skipif(os.environ.get("DALLE_LAB_SLOW_TESTS") != "1",
                    reason="compiles in three fresh processes (~40 s on 2 cores); set DALLE_LAB_SLOW_TESTS=1")
def test_a_warm_inductor_disk_cache_never_brings_another_models_weights(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "generate_once.py"
    script.write_text(_PROCESS.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    for seed in (0, 1):  # the second process finds the first one's kernels and autotuning results on disk
        out = subprocess.run([sys.executable, str(script), str(seed)], env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.stdout.strip().endswith("EQUAL"), out.stdout + out.stderr[-2000:]


def _compile_that_fails(error):
    def compile(*args, **kwargs):
        def fn(*a, **k):
            raise error
        return fn
    return compile


@pytest.mark.parametrize("where", ["compiling", "torch.compile itself"])
def test_a_failed_compile_warns_once_and_decodes_eagerly(cheap_compile, monkeypatch, where):
    from torch._inductor.exc import InductorError

    if where == "compiling":
        monkeypatch.setattr(torch, "compile", _compile_that_fails(InductorError(RuntimeError("no C++ compiler found"),
                                                                               "")))
    else:
        def refuse(*args, **kwargs):
            raise RuntimeError("no C++ compiler found")
        monkeypatch.setattr(torch, "compile", refuse)
    monkeypatch.setattr(compiled_step, "_FAILED", False)
    model = _model(seed=2)
    with pytest.warns(RuntimeWarning, match="could not compile the decode step .*no C\\+\\+ compiler found"):
        tokens = _tokens(model, True)
    assert torch.equal(tokens, _tokens(model, False))
    assert compiled_step._FAILED  # later generations skip the compiler
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert torch.equal(_tokens(model, True), tokens)


def test_an_error_that_is_not_a_compile_failure_propagates(cheap_compile, monkeypatch):
    monkeypatch.setattr(torch, "compile", _compile_that_fails(MemoryError("out of memory")))
    monkeypatch.setattr(compiled_step, "_FAILED", False)
    with pytest.raises(MemoryError):
        _tokens(_model(seed=4), True)
    assert not compiled_step._FAILED


@needs_compiler
def test_the_graph_is_compiled_with_frozen_weights(cheap_compile, monkeypatch):
    from torch._inductor import compile_fx

    calls = []
    real = compile_fx.fw_compiler_freezing

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_fx, "fw_compiler_freezing", spy)
    model = _model(seed=5)
    _no_fallback(lambda: _tokens(model, True))
    assert calls  # without freezing max-autotune cannot prepack: the unfrozen build ran slower than eager


@needs_compiler
def test_a_model_that_keeps_changing_stops_being_compiled(cheap_compile, monkeypatch):
    monkeypatch.setattr(compiled_step, "MAX_BUILDS_PER_MODEL", 2)
    model = _model(seed=6)
    for change in range(3):
        if change == 2:
            with pytest.warns(RuntimeWarning, match="changed after 2 compiles"):
                tokens = _tokens(model, True)
        else:
            tokens = _no_fallback(lambda: _tokens(model, True))
        assert torch.equal(tokens, _tokens(model, False))
        with torch.no_grad():
            model.to_image_logits.weight.add_(0.5)
    assert compiled_step._COMPILED[model].fn is None


@needs_compiler
def test_a_model_built_under_inference_mode(cheap_compile):
    with torch.inference_mode():
        model = _model(seed=7)
        assert torch.equal(_no_fallback(lambda: _tokens(model, True)), _tokens(model, False))


def test_generate_py_has_the_flag():
    from generate import build_parser

    parse = build_parser().parse_args
    assert parse(["--dalle_path", "x.pt", "--text", "a", "--strategy", "compiled"]).strategy == "compiled"
    assert parse(["--dalle_path", "x.pt", "--text", "a"]).strategy == "auto"
