"""Question (b) of the loss-weighting study: the share of image-token attention on each caption role, per layer."""
import json

import pytest
import torch

from dalle_lab.viz import attention_words as aw
from dalle_lab.model import DALLE
from dalle_lab.tokenizers import get_tokenizer

ONE = "a small red circle at the top left on a white background"
TWO = "a red circle left of a blue square on a white background"
TEXT_SEQ_LEN = 14  # Shapes captions are at most 12 tokens with the shipped vocabulary: two pads at least


class StubVAE:
    """The two things caption_word_attention needs from an image tokenizer: image_size and get_codebook_indices
    (here: the quantised brightness of each 4x4 patch, so different images give different tokens)."""

    image_size = 16

    def get_codebook_indices(self, images):
        patches = images.reshape(images.shape[0], 3, 4, 4, 4, 4).mean(dim=(1, 3, 5))
        return (patches * 19).round().long().reshape(images.shape[0], -1)


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer()  # the shipped Shapes BPE


def tiny_model(tokenizer, depth=2):
    torch.manual_seed(0)
    return DALLE(dim=32, depth=depth, heads=2, dim_head=16, num_text_tokens=tokenizer.vocab_size,
                 text_seq_len=TEXT_SEQ_LEN, num_image_tokens=20, image_fmap_size=4)


def test_shares_of_a_random_model_sum_to_one_and_match_its_full_attention(tokenizer):
    model = tiny_model(tokenizer).train()
    result = aw.caption_word_attention(model, StubVAE(), tokenizer, split="val", n=6, batch_size=4)
    assert model.training  # the caller's mode is restored
    json.dumps(result, allow_nan=False)
    assert result["n_captions"] == 6 and result["n_layers"] == 2 and len(result["layers"]) == 2
    assert sum(kind["n_captions"] for kind in result["by_kind"].values()) == 6
    for kind in result["by_kind"].values():
        for layer in kind["layers"]:
            assert sum(layer.values()) == pytest.approx(1.0, abs=1e-5)
            assert all(0.0 <= share <= 1.0 for share in layer.values())

    # "image" is defined as what BOS and text leave over: check that against the model's full attention rows
    from dalle_lab.data.shapes import ShapesDataset

    images, captions = ShapesDataset("val", length=6, image_size=16).batch(range(6))
    text = tokenizer.tokenize(captions, TEXT_SEQ_LEN)
    image_tokens = StubVAE().get_codebook_indices(images)
    model.eval()
    with torch.no_grad():
        _, attentions = model.hidden(model.text_ids(text), image_tokens[:, :-1], return_attention=True)
    T = TEXT_SEQ_LEN
    for layer, full in enumerate(attentions):  # (B, heads, L, L)
        rows = full[:, :, T:]
        torch.testing.assert_close(rows.sum(-1), torch.ones_like(rows.sum(-1)))  # softmax rows
        image_share = rows[..., T + 1:].double().sum(-1).mean(dim=(1, 2))  # per caption: keys after BOS + text
        per_kind = {}
        for caption, share in zip(captions, image_share):
            kind = aw.column_rows(tokenizer, caption, T).kind
            per_kind.setdefault(kind, []).append(float(share))
        for kind, shares in per_kind.items():
            assert result["by_kind"][kind]["layers"][layer]["image"] == pytest.approx(sum(shares) / len(shares),
                                                                                      abs=1e-6)


def test_every_caption_token_is_mapped_to_exactly_one_word(tokenizer):
    for caption in (ONE, TWO, "an orange triangle right of a purple circle on a gray background",
                    "a large green square in the center on a black background"):
        columns = aw.column_rows(tokenizer, caption, TEXT_SEQ_LEN)
        assert len(columns.rows) == 1 + TEXT_SEQ_LEN
        assert columns.rows[0] == aw.ROWS.index("bos")
        n_tokens = len(tokenizer.encode(caption))
        assert all(aw.ROWS[r] in aw.WORD_ROLES for r in columns.rows[1:1 + n_tokens])
        assert [aw.ROWS[r] for r in columns.rows[1 + n_tokens:]] == ["pad"] * (TEXT_SEQ_LEN - n_tokens)
    roles = [aw.ROWS[r] for r in aw.column_rows(tokenizer, ONE, TEXT_SEQ_LEN).rows[1:13]]
    assert roles == ["function_words", "size", "color", "shape", "place", "place", "place", "place",
                     "function_words", "function_words", "background", "function_words"]
    roles = [aw.ROWS[r] for r in aw.column_rows(tokenizer, TWO, TEXT_SEQ_LEN).rows[1:13]]
    assert roles == ["function_words", "color1", "shape1", "relation", "relation", "function_words", "color2",
                     "shape2", "function_words", "function_words", "background", "function_words"]
    with pytest.raises(ValueError, match="text_seq_len"):
        aw.column_rows(tokenizer, ONE, 8)


class PieceTokenizer:
    """Splits every word into 2-letter pieces (several tokens per word); with end=True it also appends an end
    token, so a prefix's encoding is no prefix of the caption's and the decoding fallback is used. Without it,
    decode refuses: word prefixes alone must map the tokens."""

    def __init__(self, end=False):
        self.end, self.pieces = end, {}

    def encode(self, text):
        ids = []
        for word in text.split():
            for k in range(0, len(word), 2):
                ids.append(self.pieces.setdefault(("▁" if k == 0 else "") + word[k:k + 2], len(self.pieces) + 2))
        return ids + [1] if self.end else ids

    def decode(self, ids):
        assert self.end, "word prefixes should have been enough"
        by_id = {i: piece for piece, i in self.pieces.items()}
        return "".join(by_id.get(i, "") for i in ids).replace("▁", " ").strip()


@pytest.mark.parametrize("end", [False, True])
def test_words_split_into_several_tokens_keep_all_their_tokens(end):
    words = "a small red circle at the top left".split()
    owner = aw.token_word_index(PieceTokenizer(end), words)
    expected = [w for w, word in enumerate(words) for _ in range(0, len(word), 2)]  # small -> sm al l
    assert owner == expected + ([len(words) - 1] if end else [])


def fake_dataset(captions):
    class FakeShapes:  # the two captions, in order, with blank images
        def __init__(self, split, length, image_size, seed):
            self.image_size = image_size

        def batch(self, indices):
            indices = list(indices)
            return torch.zeros(len(indices), 3, self.image_size, self.image_size), [captions[i] for i in indices]

    return FakeShapes


def test_hand_built_attention_gives_exactly_the_expected_role_shares(tokenizer, monkeypatch):
    import dalle_lab.data.shapes as shapes

    model = tiny_model(tokenizer)
    monkeypatch.setattr(shapes, "ShapesDataset", fake_dataset([ONE, TWO]))
    n_queries = model.config.image_seq_len

    def attention_maps(text, image_tokens):
        # column c of caption b in layer L: (L + 1) * (b + 1) * (c + 1) / 1000, spread unevenly over heads
        # (x0.5, x1.5) and queries (x0.5, x1.5 alternating) so only the mean over both equals that value
        columns = torch.arange(1, TEXT_SEQ_LEN + 2, dtype=torch.float64) / 1000
        layer = torch.tensor([1.0, 2.0], dtype=torch.float64)[:, None, None, None, None]
        caption = torch.tensor([1.0, 2.0], dtype=torch.float64)[None, :, None, None, None]
        head = torch.tensor([0.5, 1.5], dtype=torch.float64)[None, None, :, None, None]
        query = torch.tensor([0.5, 1.5] * (n_queries // 2), dtype=torch.float64)[None, None, None, :, None]
        return (layer * caption * head * query * columns).float()

    monkeypatch.setattr(model, "attention_maps", attention_maps)
    result = aw.caption_word_attention(model, StubVAE(), tokenizer, n=2, batch_size=2)
    # ONE, layer 0: columns 0..14 weigh 1..15 thousandths: bos=1, "a"=2, "small"=3, ..., "background"=13, pads 14, 15
    one = {"size": 3, "color": 4, "shape": 5, "place": 6 + 7 + 8 + 9, "background": 12,
           "function_words": 2 + 10 + 11 + 13, "bos": 1, "pad": 14 + 15}
    # TWO, layer 0, doubled: "a"=2, red=3, circle=4, "left of"=5,6, "a"=7, blue=8, square=9, "on a"=10,11, white=12
    two = {"color1": 3, "shape1": 4, "relation": 5 + 6, "color2": 8, "shape2": 9, "background": 12,
           "function_words": 2 + 7 + 10 + 11 + 13, "bos": 1, "pad": 14 + 15}
    for layer in range(2):
        for kind, weights, scale in (("one_object", one, 1), ("two_objects", two, 2)):
            expected = {name: (layer + 1) * scale * w / 1000 for name, w in weights.items()}
            expected["image"] = 1 - (layer + 1) * scale * 120 / 1000  # all 15 columns: 120 thousandths
            got = result["by_kind"][kind]["layers"][layer]
            assert set(got) == set(expected)
            for name in expected:
                assert got[name] == pytest.approx(expected[name], abs=1e-6), (kind, layer, name)
        # the mixed list averages each row over the captions that have it
        assert result["layers"][layer]["background"] == pytest.approx((layer + 1) * (12 + 24) / 2 / 1000, abs=1e-6)
        assert result["layers"][layer]["color"] == pytest.approx((layer + 1) * 4 / 1000, abs=1e-6)
    assert result["by_kind"]["one_object"]["tokens_per_role"] == {
        "size": 1, "color": 1, "shape": 1, "place": 4, "background": 1, "function_words": 4}


def test_plot_writes_a_png_with_one_panel_per_setting(tokenizer, tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    model = tiny_model(tokenizer)
    result = aw.caption_word_attention(model, StubVAE(), tokenizer, n=4, batch_size=4)
    deeper = aw.caption_word_attention(tiny_model(tokenizer, depth=3), StubVAE(), tokenizer, n=4, batch_size=4)
    path = aw.plot_word_attention({"w=1": result, "w=7": deeper}, tmp_path / "plots" / "word_attention.png")
    assert path == tmp_path / "plots" / "word_attention.png"
    with Image.open(path) as png:
        assert png.format == "PNG" and png.width > 300 and png.height > 200
    assert [p.name for p in path.parent.iterdir()] == ["word_attention.png"]  # no temporary file left behind
    with pytest.raises(ValueError, match="at least one"):
        aw.plot_word_attention({}, tmp_path / "empty.png")


def test_importing_the_modules_stays_light():
    import subprocess
    import sys

    code = ("import sys, dalle_lab.viz.attention_words, dalle_lab.evaluate.objects; "
            "print(sorted(m for m in ('matplotlib', 'torch', 'scipy') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
