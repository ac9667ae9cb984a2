"""Converted DALLE-pytorch models against dalle-pytorch 1.6.6 itself, run in its own environment.

The peer environment (lab/perf/peer_env.py builds lab/perf/.peer-venv; DALLE_LAB_PEER_PYTHON names another) runs
tests/dallepytorch_reference.py, which builds tiny DALLE-pytorch models with every weight drawn at random, saves them
as its train_dalle.py does and records their logits, loss, DiscreteVAE codes / decodings and SimpleTokenizer ids.
Here each file is converted and must compute the same numbers (float32, 1e-5). Skipped when the peer is absent.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHIM_DIRS = [ROOT / "lab" / "perf"]


def peer_python() -> Path | None:
    given = os.environ.get("DALLE_LAB_PEER_PYTHON")
    candidates = [Path(given)] if given else [d / ".peer-venv" / "bin" / "python" for d in SHIM_DIRS]
    return next((p for p in candidates if p.is_file()), None)


PEER = peer_python()
pytestmark = pytest.mark.skipif(PEER is None, reason="dalle-pytorch 1.6.6's environment is absent: build it with "
                                "python lab/perf/peer_env.py (or set DALLE_LAB_PEER_PYTHON)")

BASE = dict(dim=16, depth=2, heads=2, dim_head=8)
CASES = {
    "class_defaults": {},  # rotary on, token shift on, LayerScale, one joint head
    "plain": dict(rotary_emb=False, shift_tokens=False),  # learned text + axial image positions
    "shift_only": dict(rotary_emb=False),
    "rotary_only": dict(shift_tokens=False, dim_head=12),  # odd dim_head // 3: its text frequencies' divisor
    "sandwich": dict(sandwich_norm=True),
    "stable": dict(stable=True),
    "stable_plain": dict(stable=True, rotary_emb=False, shift_tokens=False),
    "attn_types": dict(attn_types=["full", "axial_row", "axial_col", "conv_like"], depth=4),
    "attn_types_plain": dict(attn_types=["conv_like", "axial_row"], rotary_emb=False, shift_tokens=False),
    "shared": dict(depth=4, shared_attn_ids=["a", "b", "a", "b"], shared_ff_ids=[0, 0, 1, 1]),
    "tied": dict(share_input_output_emb=True, loss_img_weight=3),
    "odd_dim": dict(dim=18, rotary_emb=False),  # token shift's chunks when dim is not a multiple of 4
}
VAE = dict(image_size=16, num_tokens=20, codebook_dim=8, num_layers=2, hidden_dim=6, num_resnet_blocks=1)
CAPTIONS = ["A Red  circle &amp; a blue square", "naïve café, 42 cats!", "it's the 3rd 🙂 emoji", "  ",
            "Größe: STRASSE", "x" * 300]


def _vocab_file() -> Path | None:
    found = list(PEER.parents[1].glob("lib/python*/site-packages/dalle_pytorch/data/bpe_simple_vocab_16e6.txt"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    from dalle_lab.tokenizers import train_bpe

    out = tmp_path_factory.mktemp("peer")
    vocab = train_bpe(["a red circle", "a blue square", "two green triangles"], 40, out / "text.model")
    cases = {name: {**BASE, "num_text_tokens": vocab.vocab_size, "text_seq_len": 5, **kw} for name, kw in CASES.items()}
    shims = next(d for d in SHIM_DIRS if (d / "peer_shims.py").is_file())
    job = {"shims": str(shims), "cases": cases, "vae": VAE, "captions": CAPTIONS,
           "vocab": str(_vocab_file()) if _vocab_file() else None}
    (out / "job.json").write_text(json.dumps(job))
    run = subprocess.run([str(PEER), str(ROOT / "tests" / "dallepytorch_reference.py"), str(out / "job.json"),
                          str(out)], capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    return out, vocab


@pytest.mark.parametrize("name", sorted(CASES))
def test_converted_model_computes_dallepytorchs_logits_and_loss(peer, name, tmp_path):
    from dalle_lab.convert import Sources, convert_file
    from dalle_lab.training.checkpoint import load_dalle

    out, vocab = peer
    converted = convert_file(out / f"{name}.pt", tmp_path / "model.pt", Sources(bpe_path=str(vocab.path)))
    model, _, _ = load_dalle(converted)  # through the file, as generate.py / train_dalle.py --dalle_path read it
    ref = torch.load(out / f"{name}.out.pt", weights_only=True)
    cfg = model.config
    T, V_text = cfg.text_seq_len, cfg.total_text_tokens
    with torch.no_grad():
        logits = model(ref["text"], ref["image"])
        loss = model(ref["text"], ref["image"], return_loss=True)
    torch.testing.assert_close(logits[:, :T, :V_text], ref["logits"][:, :T, :V_text], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[:, T:, V_text:], ref["logits"][:, T:, V_text:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, ref["logits"], rtol=1e-5, atol=1e-5)  # the masked entries too, as they are
    torch.testing.assert_close(loss, ref["loss"], rtol=1e-5, atol=1e-5)


def test_discrete_vae_encodes_and_decodes_as_dallepytorch(peer):
    from dalle_lab.convert import load_dallepytorch, Sources

    out, vocab = peer
    vae = load_dallepytorch(out / "plain.pt", Sources(bpe_path=str(vocab.path))).vae
    ref = torch.load(out / "vae.out.pt", weights_only=True)
    with torch.no_grad():
        torch.testing.assert_close(vae(ref["images"], return_logits=True), ref["logits"], rtol=1e-5, atol=1e-5)
        assert torch.equal(vae.get_codebook_indices(ref["images"]), ref["codes"])
        torch.testing.assert_close(vae.decode(ref["codes"]), ref["decoded"], rtol=1e-5, atol=1e-5)


def test_simple_tokenizer_gives_dallepytorchs_ids(peer):
    from dalle_lab.tokenizers.dallepytorch import SimpleTokenizer

    out, _ = peer
    if not (out / "tokens.pt").is_file():
        pytest.skip("the peer environment has no bpe_simple_vocab_16e6.txt or cannot import dalle_pytorch.tokenizer "
                    "(it needs ftfy, regex and tokenizers there)")
    ref = torch.load(out / "tokens.pt", weights_only=True)
    tokenizer = SimpleTokenizer(_vocab_file())
    assert [tokenizer.encode(c) for c in CAPTIONS] == ref["ids"]
    assert torch.equal(tokenizer.tokenize(CAPTIONS, 24, truncate_text=True), ref["tokenized"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
