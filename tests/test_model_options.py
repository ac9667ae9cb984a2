"""Issue 16's model options (DALLE-pytorch's vocabulary): attention types as masks, rotary embeddings, token
shift, layer weight sharing, tied input/output embeddings, and --stable through the fused attention kernel.
Every option must give the same tokens cached and uncached, and the default model must stay the model it was."""
import dataclasses
from pathlib import Path

import pytest
import torch

from dalle_lab.model import DALLE, DALLEConfig
from dalle_lab.model.attention import Attention
from dalle_lab.generate import GenerationConfig
from dalle_lab.generate.decoder import Decoder
from dalle_lab.model.masks import LayerMasks, attention_mask
from dalle_lab.model.positional import TokenShift, apply_rotary, rotary_angles
from dalle_lab.generate.sampling import sampling_distribution
from dalle_lab.training.cli import build_train_parser, config_from_args

import tiny_models

DATA = Path(__file__).parent / "data"
TINY = {**tiny_models.TINY, "text_seq_len": 3}
TEXT = torch.tensor([[3, 9, 4], [7, 1, 0]])
TEXT_LEN, FMAP = TINY["text_seq_len"] + 1, TINY["image_fmap_size"]
SEQ = TINY["text_seq_len"] + FMAP ** 2  # transformer input length


def opinionated(seed=0, **options):
    """The shared tiny model (weights large enough that every token matters) with a 3-token caption."""
    return tiny_models.opinionated_dalle(seed, **{"text_seq_len": TINY["text_seq_len"], **options})


def image_tokens(b=2, seed=3):
    return torch.randint(0, TINY["num_image_tokens"], (b, FMAP ** 2), generator=torch.Generator().manual_seed(seed))


def reference_mask(kind, length=SEQ, text_len=TEXT_LEN, fmap=FMAP, kernel=5, dilation=1):
    """The attention types spelled out cell by cell, independently of masks.py's arithmetic."""
    mask = torch.zeros(length, length, dtype=torch.bool)
    for q in range(length):
        for j in range(q + 1):
            if kind == "full" or q < text_len or j < text_len:
                mask[q, j] = True
                continue
            (qr, qc), (jr, jc) = divmod(q - text_len, fmap), divmod(j - text_len, fmap)
            if kind == "axial_row":
                mask[q, j] = qr == jr
            elif kind == "axial_col":
                mask[q, j] = qc == jc
            else:  # conv_like: the kernel x kernel window ending at the query's cell (DALLE-pytorch's unfold)
                window = {(qr - a * dilation, qc - b * dilation) for a in range(kernel) for b in range(kernel)}
                mask[q, j] = (jr, jc) in window
    return mask


OPTIONS = {
    "axial_row": dict(attn_types="axial_row"),
    "axial_col": dict(attn_types="axial_col"),
    "conv_like": dict(attn_types="conv_like", conv_kernel_size=3),
    "mixed_types": dict(attn_types="full,axial_row,axial_col,conv_like", depth=4),
    "rotary": dict(rotary_emb=True),
    "shift": dict(shift_tokens=True),
    "shared": dict(shared_attn_ids=(0, 0), shared_ff_ids=(0, 0)),
    "tied": dict(share_input_output_emb=True),
    "all": dict(attn_types=("conv_like", "axial_col"), rotary_emb=True, shift_tokens=True, shared_ff_ids=(1, 1),
                share_input_output_emb=True, stable=True),
}


# ----- the default model is the model it was --------------------------------------------------------------------


# Two CPU kinds run this suite (AVX2-only and Zen 4 with avx512_bf16): oneDNN picks other kernels on each, so the
# same float32 computation differs in its last bits between them. A fixture written on one kind is compared with a
# tolerance: FP32_TOLERANCE times the largest value compared. 16 float32 epsilons: each product of this tiny model
# sums at most 32 terms, and the difference measured between the two kinds was about 3 epsilons of the largest
# logit.
FP32_TOLERANCE = 16 * torch.finfo(torch.float32).eps


def within_fixture_tolerance(ours: torch.Tensor, saved: torch.Tensor, amplification: float = 1.0) -> bool:
    return bool((ours - saved).abs().max() <= amplification * FP32_TOLERANCE * saved.abs().max().clamp(min=1))


def check_sampled_tokens(model, saved, cond_scale, top_k, seed, amplification):
    """The saved tokens are what this machine's model draws from the same generator, wherever the draw was not
    within the tolerance of another token's interval.

    The sampler (dalle_lab.generate.sampling.draw) takes one float64 uniform per caption and position, in order,
    from the generator, and picks the token whose interval of the running sum of probabilities holds it. Feeding the saved
    tokens back (teacher forcing) gives this machine's distribution at every position; a draw that lies further
    than the tolerance from its interval's ends picks the same token on any machine whose logits agree within it.
    """
    text, tokens = saved["text"], saved["tokens"]
    logits_cond = model.logits(text, tokens)
    logits_uncond = model.logits(model.null_text(text), tokens)
    log_probs = sampling_distribution(logits_cond, logits_uncond, cond_scale=cond_scale, top_k=top_k)
    assert within_fixture_tolerance(log_probs.gather(-1, tokens[..., None])[..., 0], saved["logprobs"],
                                    amplification)
    cdf = log_probs.exp().double().cumsum(dim=-1)  # (B, N, V)
    upper = cdf.gather(-1, tokens[..., None])[..., 0]
    lower = upper - log_probs.exp().double().gather(-1, tokens[..., None])[..., 0]
    generator = torch.Generator().manual_seed(seed)
    draws = torch.stack([torch.rand(tokens.shape[0], dtype=torch.float64, generator=generator)
                         for _ in range(tokens.shape[1])], dim=1) * cdf[..., -1]
    margin = torch.minimum(draws - lower, upper - draws)  # < 0: this machine draws another token there
    decided = margin.abs() > amplification * FP32_TOLERANCE
    assert decided.float().mean() > 0.9  # the check has something to check
    assert bool((margin[decided] > 0).all()), margin
    return decided


def first_undecided(decided: torch.Tensor) -> torch.Tensor:
    """Per row, the first position whose draw was within the tolerance of another token (N where none was)."""
    positions = torch.arange(decided.shape[1]).expand_as(decided)
    return torch.where(decided, decided.shape[1], positions).min(dim=1).values


def test_a_checkpoint_of_the_unchanged_default_model_loads_and_computes_the_same_function():
    """tests/data/default_model_before_issue16.pt was written by the code before these options existed (on an AVX2
    machine): its config has none of the new fields, and its logits, loss, sampled tokens and their log-probs must
    come out the same here within float32 rounding."""
    saved = torch.load(DATA / "default_model_before_issue16.pt", weights_only=True)
    assert "attn_types" not in saved["config"]
    model = DALLE.from_config(saved["config"]).eval()
    model.load_state_dict(saved["model"])  # strict: no new parameters or buffers
    assert model.config.attn_types == ("full",) and not model.config.rotary_emb
    cond_scale, top_k, seed = 2.0, 8, 1
    amplification = 1 + 2 * cond_scale  # guidance: cond_scale * cond - (cond_scale - 1) * uncond
    with torch.no_grad():
        assert within_fixture_tolerance(model.logits(saved["text"], saved["image"]), saved["logits"])
        assert within_fixture_tolerance(model(saved["text"], saved["image"], return_loss=True), saved["loss"])
        decided = check_sampled_tokens(model, saved, cond_scale, top_k, seed, amplification)
        tokens, logprobs = model.generate_images(saved["text"], return_tokens=True, return_logprobs=True,
                                                 top_k=top_k, cond_scale=cond_scale,
                                                 generator=torch.Generator().manual_seed(seed))
    # the same tokens up to the first draw that rounding could have tipped (on the machine that wrote the fixture:
    # all of them); past it a sample may take another path
    for row, stop in enumerate(first_undecided(decided).tolist()):
        assert torch.equal(tokens[row, :stop], saved["tokens"][row, :stop])
        assert within_fixture_tolerance(logprobs[row, :stop], saved["logprobs"][row, :stop], amplification)


def test_the_default_model_computes_no_per_pass_extras():
    model = DALLE(**TINY)
    assert not model.transformer.extras


# ----- configuration and command line ----------------------------------------------------------------------------


def test_attention_type_lists_parse_like_dalle_pytorch_and_bad_types_are_refused():
    assert DALLEConfig(attn_types="full, axial_row").attn_types == ("full", "axial_row")
    assert DALLEConfig(attn_types=["conv_like"]).attn_types == ("conv_like",)
    assert DALLEConfig(shared_attn_ids=[0, 1]).shared_attn_ids == (0, 1)
    assert DALLEConfig(depth=5, attn_types="full,axial_row").layer_attn_types() == [
        "full", "axial_row", "full", "axial_row", "full"]
    with pytest.raises(ValueError) as info:
        DALLE(**TINY, attn_types=("full", "axial_rows"))
    message = str(info.value)
    assert "\n" not in message and "'axial_rows'" in message
    assert all(kind in message for kind in ("full", "axial_row", "axial_col", "conv_like"))
    with pytest.raises(ValueError, match="triton.*CUDA.*conv_like or axial"):
        DALLE(**TINY, attn_types="sparse")
    with pytest.raises(ValueError, match="dim_head >= 6"):
        DALLE(**{**TINY, "dim_head": 4}, rotary_emb=True)


def test_train_flags_take_dalle_pytorch_forms():
    parser = build_train_parser()
    args = parser.parse_args(["--attn_types", "full,axial_row", "--rotary_emb", "--shift_tokens",
                              "--share_input_output_emb", "--shared_attn_ids", "0,1,0", "--conv_kernel_size", "3"])
    _, overrides = config_from_args(args)
    config = DALLEConfig(**overrides)
    assert config.attn_types == ("full", "axial_row") and config.shared_attn_ids == (0, 1, 0)
    assert config.rotary_emb and config.shift_tokens and config.share_input_output_emb
    assert config.conv_kernel_size == 3
    _, defaults = config_from_args(parser.parse_args([]))
    assert DALLEConfig(**defaults) == DALLEConfig()
    with pytest.raises(SystemExit):
        parser.parse_args(["--shared_ff_ids", "a,b"])


def test_a_config_with_every_option_round_trips_through_a_weights_only_checkpoint(tmp_path):
    model = opinionated(**OPTIONS["all"])
    torch.save({"config": dataclasses.asdict(model.config), "model": model.state_dict()}, tmp_path / "m.pt")
    saved = torch.load(tmp_path / "m.pt", weights_only=True)
    rebuilt = DALLE.from_config(saved["config"]).eval()
    rebuilt.load_state_dict(saved["model"])
    assert rebuilt.config == model.config
    text, image = TEXT, image_tokens()
    with torch.no_grad():
        assert torch.equal(rebuilt.logits(text, image), model.logits(text, image))


# ----- attention types --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,kernel,dilation", [("full", 5, 1), ("axial_row", 5, 1), ("axial_col", 5, 1),
                                                  ("conv_like", 5, 1), ("conv_like", 3, 1), ("conv_like", 3, 2)])
def test_masks_follow_the_cell_by_cell_rules(kind, kernel, dilation):
    positions = torch.arange(SEQ)
    mask = attention_mask(kind, positions[:, None], positions[None, :], TEXT_LEN, FMAP, kernel, dilation)
    assert torch.equal(mask, reference_mask(kind, kernel=kernel, dilation=dilation))


def test_mask_examples_by_hand():
    """Grid 4x4 after 4 text positions; the query on cell (1, 2) = position 4 + 6 = 10."""
    row = reference_mask("axial_row")[10, TEXT_LEN:11].nonzero().flatten().tolist()
    col = reference_mask("axial_col")[10, TEXT_LEN:11].nonzero().flatten().tolist()
    conv = reference_mask("conv_like", kernel=3)[10, TEXT_LEN:11].nonzero().flatten().tolist()
    assert row == [4, 5, 6] and col == [2, 6] and conv == [0, 1, 2, 4, 5, 6]
    assert reference_mask("axial_row")[10, :TEXT_LEN].all()  # all of the text, always


@pytest.mark.parametrize("kind", ["axial_row", "axial_col", "conv_like"])
def test_full_forward_logits_equal_a_reference_with_the_explicit_mask(kind, monkeypatch):
    """The fused (SDPA) full pass against the explicit attention path fed the cell-by-cell reference mask."""
    model = opinionated(attn_types=kind)
    text, image = TEXT, image_tokens()
    with torch.no_grad():
        fast = model.logits(text, image)
        monkeypatch.setattr(LayerMasks, "for_pass", lambda self, q, k, full: [reference_mask(kind)] * len(self.types))
        x = model.embed(model.text_ids(text), image[:, :-1])
        h, _ = model.transformer(x, return_attention=True)  # explicit path, reference masks
        reference = model.to_image_logits(model.final(h)[:, TINY["text_seq_len"]:])
        plain = opinionated()  # the same weights with full attention: the mask must matter
        full = plain.logits(text, image)
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(fast, full, atol=1e-3)


@pytest.mark.parametrize("kind", ["axial_row", "axial_col", "conv_like"])
def test_a_one_layer_model_sees_exactly_the_masked_tokens(kind):
    """Behaviour, not arithmetic: in one layer, changing image token j moves the prediction at query q iff the
    reference mask lets q see j's position."""
    model = opinionated(attn_types=kind, depth=1)
    image = image_tokens(1)
    allowed = reference_mask(kind)
    T = TINY["text_seq_len"]
    with torch.no_grad():
        base = model.logits(TEXT[:1], image)
        for j in range(FMAP ** 2 - 1):  # the last token is never fed
            changed = image.clone()
            changed[0, j] = (changed[0, j] + 1) % TINY["num_image_tokens"]
            moved = (model.logits(TEXT[:1], changed) - base).abs().amax(-1)[0] > 1e-6  # (N,) per prediction
            key = TEXT_LEN + j
            expected = allowed[T:, key]  # prediction i comes from the query at position T + i
            assert torch.equal(moved, expected), (kind, j)


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("cond_scale", [1.0, 3.0])
def test_cached_generation_gives_the_uncached_tokens(name, cond_scale):
    model = opinionated(**OPTIONS[name])
    runs = [model.generate_images(TEXT, return_tokens=True, return_logprobs=True, top_k=8, cond_scale=cond_scale,
                                  generator=torch.Generator().manual_seed(5), **kw)
            for kw in (dict(use_cache=False), dict(strategy="plain"), dict(), dict(strategy="graph"))]
    for tokens, logprobs in runs[1:]:
        assert torch.equal(tokens, runs[0][0])
        torch.testing.assert_close(logprobs, runs[0][1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_speculative_windows_at_different_row_positions_score_like_the_full_pass(name):
    """A speculative pass feeds a window of tokens per row, each row at its own position: every window position's
    logits must equal the teacher-forced ones (masks, rotary angles and shifted features per query row)."""
    model = opinionated(**OPTIONS[name])
    image = image_tokens()
    with torch.no_grad():
        expected = model.logits(TEXT, image)  # (B, N, V): position i predicts token i
        dec = Decoder(model, model.text_ids(TEXT), GenerationConfig(cond_scale=2.0), extra_len=8)
        dec.prefill(image[:, :0])
        start = torch.tensor([[0], [5]])  # row 0 at grid index 0, row 1 further on (its prefix fed first)
        dec.step(image[1:2, :5].expand(2, -1), torch.arange(5).expand(2, -1))  # rows' prefixes (row 0 rewrites later)
        index = start + torch.arange(4)
        logits = dec.step(image.gather(1, index), index)[:2]  # conditional rows
    for b in range(2):
        torch.testing.assert_close(logits[b], expected[b, index[b] + 1], atol=1e-5, rtol=1e-5)


# ----- rotary and token shift ----------------------------------------------------------------------------------


def test_rotary_scores_depend_on_coordinate_differences_only():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(qpos, kpos):
        cq, sq = rotary_angles(torch.tensor([qpos]), TEXT_LEN, FMAP, 16)
        ck, sk = rotary_angles(torch.tensor([kpos]), TEXT_LEN, FMAP, 16)
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum()

    cell = lambda r, c: TEXT_LEN + r * FMAP + c  # noqa: E731
    # the same 2-D offset (1 row, -1 column) anywhere in the grid: the same score; another offset: another
    torch.testing.assert_close(score(cell(1, 2), cell(0, 3)), score(cell(2, 1), cell(1, 2)))
    assert not torch.allclose(score(cell(1, 2), cell(0, 3)), score(cell(1, 2), cell(0, 2)))
    torch.testing.assert_close(score(2, 0), score(3, 1))  # text: 1-D offsets
    norms = apply_rotary(q, *rotary_angles(torch.tensor([cell(3, 3)]), TEXT_LEN, FMAP, 16)).norm()
    torch.testing.assert_close(norms, q.norm())  # a rotation


def test_token_shift_moves_the_documented_features():
    d = 8
    h = torch.arange(SEQ, dtype=torch.float32)[None, :, None].expand(1, SEQ, d) + 1  # features = position + 1
    out = TokenShift(torch.arange(SEQ), TEXT_LEN, FMAP)(h)[0]
    assert out[0, :4].eq(0).all() and out[0, 4:].eq(1).all()  # BOS: nothing before it
    assert out[2, :4].eq(2).all() and out[2, 4:].eq(3).all()  # text: first half from the previous token
    cell = lambda r, c: TEXT_LEN + r * FMAP + c  # noqa: E731
    p = cell(2, 1)
    assert out[p, :2].eq(cell(1, 1) + 1).all()  # first quarter from the cell above
    assert out[p, 2:4].eq(cell(2, 0) + 1).all()  # second quarter from the cell to the left
    assert out[p, 4:].eq(p + 1).all()
    first = cell(0, 0)
    assert out[first, :4].eq(0).all()  # top row, left column: zeros (not the last text token)
    assert out[cell(1, 0), 2:4].eq(0).all() and out[cell(1, 0), :2].eq(cell(0, 0) + 1).all()


# ----- sharing --------------------------------------------------------------------------------------------------


def test_shared_ids_share_modules_and_keep_their_own_norms():
    model = DALLE(**{**TINY, "depth": 4}, shared_attn_ids=(0, 1), shared_ff_ids=(0, 0, 1, 1))
    layers = model.transformer.layers
    assert layers[0].attn is layers[2].attn and layers[1].attn is layers[3].attn
    assert layers[0].attn is not layers[1].attn
    assert layers[0].ff is layers[1].ff and layers[2].ff is layers[3].ff and layers[0].ff is not layers[2].ff
    assert layers[0].attn_norm is not layers[2].attn_norm
    plain = DALLE(**{**TINY, "depth": 4})
    per_attn = sum(p.numel() for p in layers[0].attn.parameters())
    per_ff = sum(p.numel() for p in layers[0].ff.parameters())
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(plain) - count(model) == 2 * per_attn + 2 * per_ff
    model(TEXT, image_tokens(), return_loss=True).backward()
    assert layers[0].attn.to_qkv.weight.grad is not None


def test_share_input_output_emb_ties_text_and_image_tables():
    model = DALLE(**TINY, share_input_output_emb=True)
    assert model.text_emb.weight is model.to_text_logits.weight
    assert model.image_emb.weight is model.to_image_logits.weight
    plain = DALLE(**TINY)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(plain) - count(model) == model.text_emb.weight.numel() + model.image_emb.weight.numel()
    rebuilt = DALLE(**TINY, share_input_output_emb=True)
    rebuilt.load_state_dict(opinionated(share_input_output_emb=True).state_dict())
    assert rebuilt.text_emb.weight is rebuilt.to_text_logits.weight  # loading keeps the tie


# ----- --stable through SDPA ------------------------------------------------------------------------------------


def test_stable_attention_runs_fused_in_float32_and_equals_the_explicit_pb_relax(monkeypatch):
    torch.manual_seed(0)
    attn = Attention(dim=32, heads=2, dim_head=16, stable=True)
    with torch.no_grad():
        attn.to_qkv.weight.mul_(20.0)  # large scores: the row max subtraction matters
    x = torch.randn(2, 10, 32)
    explicit, weights = attn(x, return_attention=True)  # the explicit PB-relax path (weights requested)
    assert weights is not None

    def refuse(*args, **kwargs):
        raise AssertionError("stable float32 attention took the explicit (B, heads, L, L) path")

    monkeypatch.setattr(Attention, "_explicit_attention", refuse)
    fused, none = attn(x)
    assert none is None
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-4)  # float32 rounding of scores near 1e2
    mask = reference_mask("axial_row")
    x = torch.randn(2, SEQ, 32)
    fused_masked, _ = attn(x, mask=mask)
    monkeypatch.undo()
    explicit_masked, _ = attn(x, mask=mask, return_attention=True)
    torch.testing.assert_close(fused_masked, explicit_masked, atol=1e-6, rtol=1e-5)


def test_stable_float16_attention_keeps_the_explicit_path(monkeypatch):
    calls = []
    original = Attention._explicit_attention
    monkeypatch.setattr(Attention, "_explicit_attention", lambda self, *a, **k: calls.append(1) or original(
        self, *a, **k))
    attn = Attention(dim=32, heads=2, dim_head=16, stable=True).half()
    attn(torch.randn(1, 5, 32).half())
    assert calls


def test_resuming_a_checkpoint_older_than_the_options_compares_them_with_their_defaults():
    from dalle_lab.training.config import TrainConfig
    from dalle_lab.training.resume import changed_settings

    old = torch.load(DATA / "default_model_before_issue16.pt", weights_only=True)["config"]
    ckpt = {"config": old}
    same = {"attn_types": ("full",), "rotary_emb": False, "shared_attn_ids": None, "depth": old["depth"]}
    assert changed_settings(ckpt, TrainConfig(), same, facts=None) == []
    changed = changed_settings(ckpt, TrainConfig(), {**same, "rotary_emb": True, "attn_types": ("conv_like",)},
                               facts=None)
    assert sorted(changed) == ["--attn_types conv_like (saved: full)", "--rotary_emb on (saved: off)"]
    assert changed_settings({"config": {**old, "attn_types": ["full"]}}, TrainConfig(), same, facts=None) == []


def test_bfloat16_autocast_training_and_cached_decoding_with_every_option():
    """The bf16 CPU attention kernel takes the masks too, rotary keeps bf16 queries bf16, and cached bf16 decoding
    gives the uncached tokens (the bf16 paths share one kernel)."""
    model = opinionated(**{**OPTIONS["all"], "stable": False})
    text, image = TEXT, image_tokens()
    with torch.no_grad():
        fp32 = model(text, image, return_loss=True)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = model(text, image, return_loss=True)
    bf16.backward()
    torch.testing.assert_close(bf16.float(), fp32, atol=0.1, rtol=0.05)
    model.eval()
    runs = []
    for strategy in ("uncached", "auto"):  # auto: the module path (bf16), its products prepacked where supported
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs.append(model.generate_images(text, return_tokens=True, cond_scale=2.0, top_k=8, strategy=strategy,
                                              generator=torch.Generator().manual_seed(2)))
    assert torch.equal(runs[0], runs[1])


def test_train_dalle_takes_the_options_as_dalle_pytorch_flags_and_saves_them(tiny_vqgan, tmp_path):
    from test_cli import TINY_FLAGS, script_main, vqgan_flags

    out = tmp_path / "run"
    assert script_main("train_dalle.py", *vqgan_flags(tiny_vqgan), *TINY_FLAGS, "--depth", "2", "--batch_size", "2",
                       "--max_steps", "1", "--no-amp", "--output_dir", out, "--attn_types", "axial_row,conv_like",
                       "--rotary_emb", "--shift_tokens", "--share_input_output_emb", "--shared_ff_ids", "0,0") == 0
    saved = torch.load(out / "dalle.pt", weights_only=True)
    config = DALLEConfig.from_dict(saved["config"])
    assert config.attn_types == ("axial_row", "conv_like") and config.shared_ff_ids == (0, 0)
    assert config.rotary_emb and config.shift_tokens and config.share_input_output_emb
