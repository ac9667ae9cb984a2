"""Attention heatmaps from dalle_lab.viz.attention."""
import pytest
import torch

from dalle_lab.model import DALLE
from dalle_lab.viz.attention import attention_to_text, save_attention_maps

TINY = dict(dim=32, depth=2, heads=2, dim_head=16, num_text_tokens=50, text_seq_len=6, num_image_tokens=20,
            image_fmap_size=3, null_cond_prob=0.0)


def test_attention_to_text_is_the_models_attention_on_the_grid():
    torch.manual_seed(0)
    model = DALLE(**TINY).eval()
    text = torch.tensor([[4, 9, 13, 0, 0, 0]])
    image = torch.randint(0, 20, (1, 9))
    grid = attention_to_text(model, text, image)
    assert grid.shape == (2, 2, 3, 3, 6)
    raw = model.attention_maps(text, image)  # (depth, 1, heads, N, 1 + T)
    torch.testing.assert_close(grid[1, 0, 2, 1, 2], raw[1, 0, 0, 2 * 3 + 1, 3])  # cell (row 2, col 1), text token 2


def test_save_attention_maps_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    torch.manual_seed(0)
    model = DALLE(**TINY).eval()
    text = torch.tensor([[4, 9, 13, 0, 0, 0]])
    image = model.generate_images(text, return_tokens=True, top_k=5)
    paths = save_attention_maps(model, text, image, ["a", "red", "circle"], tmp_path / "maps")
    assert [p.name for p in paths] == ["attention_mean.png", "attention_layer0.png", "attention_layer1.png"]
    for path in paths:
        with Image.open(path) as png:
            assert png.size[0] > 200 and png.size[1] > 100
    with pytest.raises(ValueError, match="3 non-pad tokens"):
        save_attention_maps(model, text, image, ["a", "red"], tmp_path / "bad")


def test_relative_option_writes_the_same_files(tmp_path):
    pytest.importorskip("matplotlib")
    torch.manual_seed(0)
    model = DALLE(**TINY).eval()
    text = torch.tensor([[4, 9, 13, 0, 0, 0]])
    image = torch.randint(0, 20, (1, 9))
    paths = save_attention_maps(model, text, image, None, tmp_path, relative=True)
    assert len(paths) == 3 and all(p.exists() for p in paths)


def test_caption_attention_maps_tokenizes_generates_and_labels(tmp_path):
    pytest.importorskip("matplotlib")
    from dalle_lab.viz.attention import caption_attention_maps

    class WordTokenizer:  # the tokenizer contract: tokenize(texts, context_length, truncate_text), decode(ids)
        words = ["<pad>", "a", "red", "circle"]

        def tokenize(self, texts, context_length, truncate_text=False):
            ids = [self.words.index(w) for w in texts[0].split()]
            return torch.tensor([ids + [0] * (context_length - len(ids))])

        def decode(self, ids):
            return " ".join(self.words[i] for i in ids)

    torch.manual_seed(0)
    model = DALLE(**TINY).eval()
    paths = caption_attention_maps(model, WordTokenizer(), "a red circle", tmp_path, top_k=3)
    assert [p.name for p in paths] == ["attention_mean.png", "attention_layer0.png", "attention_layer1.png"]
