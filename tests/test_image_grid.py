"""Image grids: tiles land where the layout says, and long labels are cut rather than spilled."""
import torch

from dalle_lab.image_grid import make_grid, make_labeled_rows


def dark(pixel) -> bool:  # text is anti-aliased: count any clearly dark pixel as ink
    return max(pixel) < 160


def test_labeled_rows_put_the_label_left_and_the_images_after_it():
    red = torch.zeros(3, 3, 4, 4)
    red[:, 0] = 1.0
    canvas = make_labeled_rows([("a label far too long to fit in the label column at all", red),
                                ("short", red[:1])], scale=2, padding=2, label_width=60)
    assert canvas.size == (60 + 3 * (8 + 2) + 2, 2 * (8 + 2) + 2)  # 3 columns (the widest row), 2 rows
    assert canvas.getpixel((60 + 2 + 1, 2 + 1)) == (255, 0, 0)  # first tile of the first row
    assert canvas.getpixel((60 + 2 + 10 + 1, 12 + 1)) == (255, 255, 255)  # the short row has one tile only
    label_ink = [x for x in range(0, 60) for y in range(0, 10) if dark(canvas.getpixel((x, y)))]
    spilled_ink = [x for x in range(60, canvas.size[0]) for y in range(0, 10) if dark(canvas.getpixel((x, y)))]
    assert label_ink and not spilled_ink  # the long label is drawn and stops inside its 60 px column


def test_grid_captions_are_cut_to_the_tile_width():
    images = torch.ones(2, 3, 8, 8)
    grid = make_grid(images, nrow=2, padding=2, captions=["x" * 50, "y"], scale=2, caption_height=12)
    assert grid.size == (2 * (16 + 2) + 2, 16 + 12 + 2 + 2)
    assert any(dark(grid.getpixel((x, y))) for x in range(20, 36) for y in range(18, 30))  # "y" under tile 2
    assert not any(dark(grid.getpixel((x, y))) for x in range(18, 20) for y in range(18, 30))  # no spill into the gap
