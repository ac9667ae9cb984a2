"""A tiny folder of 'your own data' for the docs/own_data.md walkthrough: 40 small pictures of a made-up world whose
captions use words no shipped vocabulary has seen (zorblat, glimmow, ...), as PNGs and JPEGs, one or two caption
lines per image."""
from pathlib import Path

from PIL import Image, ImageDraw

CREATURES = {"zorblat": "ellipse", "glimmow": "rectangle", "fnurgle": "triangle", "quixel": "cross"}
COLOURS = {"blue": (40, 70, 220), "red": (220, 40, 40), "amber": (240, 170, 30), "teal": (20, 160, 150)}
PLACES = ("beside", "under", "near")
NEW_WORDS = (*CREATURES, "amber", "teal")  # words outside bpe/shapes.model and bpe/emoji.model's captions


def _draw(canvas: ImageDraw.ImageDraw, creature: str, colour, box) -> None:
    x0, y0, x1, y1 = box
    shape = CREATURES[creature]
    if shape == "ellipse":
        canvas.ellipse(box, fill=colour)
    elif shape == "rectangle":
        canvas.rectangle(box, fill=colour)
    elif shape == "triangle":
        canvas.polygon([(x0, y1), ((x0 + x1) // 2, y0), (x1, y1)], fill=colour)
    else:
        w = (x1 - x0) // 3
        canvas.rectangle((x0 + w, y0, x1 - w, y1), fill=colour)
        canvas.rectangle((x0, y0 + w, x1, y1 - w), fill=colour)


def make_photos(root: Path, n: int = 40, size: int = 24) -> list[str]:
    """Write the folder; returns its captions (first line of each file)."""
    root.mkdir(parents=True, exist_ok=True)
    creatures, colours = list(CREATURES), list(COLOURS)
    captions = []
    for i in range(n):
        first, second = creatures[i % 4], creatures[(i // 4 + 1 + i % 4) % 4]
        c1, c2 = colours[(i // 2) % 4], colours[(i // 3 + 1) % 4]
        place = PLACES[i % 3]
        image = Image.new("RGB", (size, size), (245, 245, 235))
        canvas = ImageDraw.Draw(image)
        _draw(canvas, first, COLOURS[c1], (2, 2, size // 2, size // 2))
        _draw(canvas, second, COLOURS[c2], (size // 2, size // 2, size - 2, size - 2))
        name = f"{i:04d}"
        image.save(root / f"{name}.{'jpg' if i % 2 else 'png'}")
        caption = f"a {c1} {first} {place} a {c2} {second}"
        lines = [caption] + ([f"{first} and {second}"] if i % 5 == 0 else [])
        (root / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        captions.append(caption)
    return captions
