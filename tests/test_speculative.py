"""Speculative Jacobi decoding is lossless: the acceptance rule's identity, and on a tiny model whose whole image
distribution can be enumerated, the empirical distribution of speculative samples against the exact one."""
import itertools

import pytest
import torch
from scipy.stats import chi2

from dalle_lab.model import DALLE
from dalle_lab.generate.speculative import acceptance, leading_accepts, residual
from dalle_lab.generate.sampling import resolve_top_k, sampling_distribution

# Chi-square tests reject at this p-value. The seeds are fixed, so every run sees the same statistic: the threshold
# is what a correct sampler has to pass, and what a biased one (see the break test) fails by orders of magnitude.
CHI2_P_THRESHOLD = 1e-3

# A 2x2 grid of a 3-entry codebook: 81 images, enumerable in one batched forward.
ENUM = dict(dim=32, depth=2, heads=2, dim_head=16, num_text_tokens=20, text_seq_len=3, num_image_tokens=3,
            image_fmap_size=2, null_cond_prob=0.0)


def enumerable_dalle(seed=0):
    """Random weights larger than the training init, so the distributions are far from uniform and drafts (drawn
    from the previous iteration's distributions) often disagree with the exact ones: rejections happen."""
    torch.manual_seed(seed)
    model = DALLE(**ENUM).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
    return model


def exact_image_distribution(model, text, top_k=None, top_p=None, temperature=1.0, cond_scale=1.0):
    """Probability of each of the V**N images (in itertools.product order) under the sampling settings."""
    cfg = model.config
    images = torch.tensor(list(itertools.product(range(cfg.num_image_tokens), repeat=cfg.image_seq_len)))
    rows = text.expand(len(images), -1)
    with torch.no_grad():
        cond = model.logits(rows, images)
        uncond = model.logits(model.null_text(rows), images) if cond_scale != 1.0 else None
    log_probs = sampling_distribution(cond, uncond, cond_scale, temperature,
                                      resolve_top_k(top_k, None, cfg.num_image_tokens), top_p)
    return images, log_probs.gather(-1, images.unsqueeze(-1)).squeeze(-1).sum(-1).exp().double()


def chi_square_p_value(samples, images, probs):
    """Pearson chi-square of sample counts against probs; cells expecting < 5 samples are pooled into one."""
    base = torch.tensor([ENUM["num_image_tokens"] ** k for k in reversed(range(images.shape[1]))])
    counts = torch.bincount((samples * base).sum(-1), minlength=len(images)).double()
    assert torch.equal((images * base).sum(-1), torch.arange(len(images)))  # product order == base-V code
    expected = probs * len(samples)
    assert counts[expected == 0].sum() == 0, "sampled an image of probability 0 (a filtered token)"
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big & (expected > 0)].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big & (expected > 0)].sum().view(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    statistic = float(((obs - exp) ** 2 / exp).sum())
    return float(chi2.sf(statistic, df=len(exp) - 1))


SETTINGS = [
    dict(),  # plain softmax sampling
    dict(temperature=0.6),
    dict(top_k=2, temperature=1.3),
    dict(top_p=0.8),
    dict(cond_scale=3.0, top_k=2),
]


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("settings", SETTINGS)
def test_speculative_samples_follow_the_exact_image_distribution(settings, window):
    model = enumerable_dalle()
    text = torch.tensor([[5, 7, 0]])
    images, probs = exact_image_distribution(model, text, **settings)
    assert abs(float(probs.sum()) - 1) < 1e-5
    n = 6000
    samples = model.generate_images(text.expand(n, -1), return_tokens=True, strategy="speculative",
                                    speculative_window=window, generator=torch.Generator().manual_seed(1), **settings)
    assert chi_square_p_value(samples, images, probs) > CHI2_P_THRESHOLD


def test_plain_samples_follow_the_exact_image_distribution():
    """The same check on plain decoding: validates the enumeration the speculative tests rely on."""
    model = enumerable_dalle()
    text = torch.tensor([[5, 7, 0]])
    images, probs = exact_image_distribution(model, text, cond_scale=3.0, top_k=2)
    samples = model.generate_images(text.expand(6000, -1), return_tokens=True, strategy="plain", cond_scale=3.0,
                                    top_k=2, generator=torch.Generator().manual_seed(1))
    assert chi_square_p_value(samples, images, probs) > CHI2_P_THRESHOLD


def test_the_chi_square_check_rejects_a_sampler_that_always_accepts_drafts(monkeypatch):
    """The break test: accepting every draft (Jacobi decoding without the acceptance rule) is biased, and the
    same check at the same threshold must say so."""
    import dalle_lab.generate.speculative as speculative

    monkeypatch.setattr(speculative, "acceptance", lambda p, q, u: torch.ones_like(p, dtype=torch.bool))
    model = enumerable_dalle()
    text = torch.tensor([[5, 7, 0]])
    images, probs = exact_image_distribution(model, text)
    samples = model.generate_images(text.expand(6000, -1), return_tokens=True, strategy="speculative",
                                    speculative_window=3, generator=torch.Generator().manual_seed(1))
    assert chi_square_p_value(samples, images, probs) < 1e-12


def test_speculative_decoding_records_the_exact_log_probs_and_keeps_the_prime():
    model = enumerable_dalle()
    text = torch.tensor([[5, 7, 0], [3, 0, 0]])
    prime = torch.tensor([[2, 1, 0, 0], [0, 2, 0, 0]])
    tokens, logprobs = model.generate_images(text, img=prime, num_init_img_tokens=1, return_tokens=True,
                                             return_logprobs=True, strategy="speculative", speculative_window=2,
                                             cond_scale=2.0, temperature=0.8,
                                             generator=torch.Generator().manual_seed(0))
    assert torch.equal(tokens[:, 0], prime[:, 0])
    expected = sampling_distribution(model.logits(text, tokens), model.logits(model.null_text(text), tokens),
                                     cond_scale=2.0, temperature=0.8)
    expected = expected.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert logprobs[:, 0].eq(0).all()
    torch.testing.assert_close(logprobs[:, 1:], expected[:, 1:], atol=1e-5, rtol=1e-5)


def test_speculative_decoding_refuses_a_logits_callback():
    model = enumerable_dalle()
    with pytest.raises(ValueError, match="strategy 'speculative' scores several positions per pass.*no "
                                         "logits_callback"):
        model.generate_images(torch.tensor([[5, 7, 0]]), return_tokens=True, strategy="speculative",
                              logits_callback=lambda *a: None)
    with pytest.raises(ValueError, match="use_cache=False reruns the prefix every pass"):
        model.generate_images(torch.tensor([[5, 7, 0]]), return_tokens=True, strategy="speculative",
                              use_cache=False)


# ----- the acceptance rule on its own ------------------------------------------------------------------------

def test_acceptance_is_u_below_p_over_q():
    p = torch.tensor([0.2, 0.5, 0.1, 0.3])
    q = torch.tensor([0.4, 0.25, 0.1, 0.6])
    u = torch.tensor([0.49, 0.99, 0.999, 0.5])
    assert acceptance(p, q, u).tolist() == [True, True, True, False]  # ratios 0.5, 2, 1, 0.5


def test_leading_accepts_stops_at_the_first_rejection():
    accepted = torch.tensor([[True, True, False, True], [False, True, True, True], [True, True, True, True]])
    assert leading_accepts(accepted).tolist() == [2, 0, 4]


def test_accept_or_resample_reproduces_p_exactly():
    """P(x) = q(x) min(1, p(x)/q(x)) + P(reject) residual(x) equals p(x) for arbitrary p and q."""
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        p = torch.rand(7, generator=g) ** 3
        q = torch.rand(7, generator=g) ** 3
        p[0] = 0  # a token p filtered out (top-k) that q still proposes
        p, q = p / p.sum(), q / q.sum()
        accepted = q * torch.clamp(p / q, max=1)
        reject = 1 - accepted.sum()
        torch.testing.assert_close(accepted + reject * residual(p, q), p, atol=1e-6, rtol=0)


def test_residual_is_normalised_and_falls_back_to_p_when_p_equals_q():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.4, 0.2]])
    r = residual(p, q)
    torch.testing.assert_close(r[0], p[0])
    torch.testing.assert_close(r[1], torch.tensor([0.0, 0.0, 1.0]))


def test_one_draft_accept_or_resample_samples_p_empirically():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.05, 0.6, 0.1, 0.25])
    q = torch.tensor([0.4, 0.1, 0.4, 0.1])
    n = 40000
    drafts = torch.multinomial(q.expand(n, -1), 1, replacement=True, generator=g).squeeze(-1)
    ok = acceptance(p[drafts], q[drafts], torch.rand(n, generator=g))
    fallback = torch.multinomial(residual(p, q).expand(n, -1), 1, generator=g).squeeze(-1)
    out = torch.where(ok, drafts, fallback)
    counts = torch.bincount(out, minlength=4).double()
    statistic = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2.sf(statistic, df=3) > CHI2_P_THRESHOLD


def test_inverse_cdf_draw_follows_the_probabilities_and_never_draws_a_zero():
    from dalle_lab.generate.sampling import draw

    p = torch.tensor([0.0, 0.3, 0.0, 0.45, 0.25, 0.0])  # unnormalised rows are fine too: scale by 2
    n = 30000
    out = draw((2 * p).expand(n, -1), torch.Generator().manual_seed(0))
    counts = torch.bincount(out, minlength=6).double()
    assert counts[p == 0].sum() == 0
    keep = p > 0
    statistic = float(((counts[keep] - n * p[keep]) ** 2 / (n * p[keep])).sum())
    assert chi2.sf(statistic, df=2) > CHI2_P_THRESHOLD


def test_generate_py_strategy_flag_picks_the_decoder(tiny_vqgan, tmp_path, monkeypatch):
    import importlib.util
    from pathlib import Path

    import dalle_lab.generate.generation as generation

    root = Path(__file__).resolve().parents[1]

    def script_main(script, *args):
        spec = importlib.util.spec_from_file_location(script.replace(".py", "_script"), root / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main([str(a) for a in args])

    out = tmp_path / "run"
    assert script_main("train_dalle.py", "--vqgan_model_path", tiny_vqgan[0], "--vqgan_config_path", tiny_vqgan[1],
                       "--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16", "--max_steps", "1",
                       "--batch_size", "2", "--sample_every_n_steps", "0", "--no-progress", "--output_dir", out) == 0
    used = []
    real = generation.speculative_decode
    monkeypatch.setattr(generation, "speculative_decode", lambda *a, **k: used.append(1) or real(*a, **k))
    for strategy, expected in (("speculative", 1), ("auto", 0)):
        used.clear()
        assert script_main("generate.py", "--dalle_path", out / "dalle.pt", "--text", "a red circle",
                           "--num_images", "2", "--outputs_dir", tmp_path / strategy, "--strategy", strategy) == 0
        assert len(used) == expected, strategy
        assert (tmp_path / strategy / "a_red_circle" / "1.png").is_file()


def test_the_default_strategy_decodes_one_token_per_pass():
    """auto never picks speculative decoding (slower on the CPU, docs/performance.md), so a logits_callback sees
    every position, in order."""
    model = enumerable_dalle()
    seen = []
    tokens = model.generate_images(torch.tensor([[5, 7, 0]]), return_tokens=True,
                                   logits_callback=lambda i, c, u: seen.append(i))
    assert seen == [0, 1, 2, 3] and tokens.shape == (1, 4)
