"""Renders docs/transfer.png, the README's picture of style transfer, through the real route.

    python docs/render_transfer.py --checkpoint-dir checkpoints --out docs/transfer.png

Each row is one `POST /transfer?show_input=true&scale=2` answer: the prepared input, then its
hand in the ten digits. The inputs: the test digits with the most extreme slant and stroke width
(cvae.label_swap's measures, each from a different class), then a 7 drawn the way the page's
canvas sends it (black on white, 280x280) and a photo-like one (grey ink on grey paper, JPEG).
"""

from __future__ import annotations

import argparse
import io

import numpy as np
from fastapi.testclient import TestClient
from PIL import Image, ImageDraw

from cvae.data import load_dataset
from cvae.grid import save_png
from cvae.label_swap import slant, stroke_width
from service.app import create_app


def extreme_digits(images: np.ndarray, labels: np.ndarray) -> list[np.ndarray]:
    """Most right- and left-slanted, thickest and thinnest test digits, four different classes."""
    values = images.astype(np.float32) / 255.0
    orders = [np.argsort(-slant(values)), np.argsort(slant(values)),
              np.argsort(-stroke_width(values)), np.argsort(stroke_width(values))]
    chosen, classes = [], set()
    for order in orders:
        pick = next(i for i in order if labels[i] not in classes)
        classes.add(labels[pick])
        chosen.append(images[pick])
    return chosen


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def drawings() -> list[bytes]:
    canvas = Image.new("L", (280, 280), 255)
    ImageDraw.Draw(canvas).line([(100, 40), (190, 40), (120, 250)], fill=0, width=20)
    paper = Image.new("RGB", (640, 480), (205, 200, 190))
    ImageDraw.Draw(paper).line([(260, 120), (330, 80), (350, 160), (250, 380), (400, 370)],
                               fill=(60, 60, 80), width=28)  # a 2 in pencil on grey paper
    return [encoded(canvas), encoded(paper, "JPEG")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--out", default="docs/transfer.png")
    args = parser.parse_args()
    data = load_dataset(args.data_dir)
    uploads = [encoded(Image.fromarray(x)) for x in extreme_digits(data.test_images,
                                                                  data.test_labels)]
    uploads += drawings()
    rows = []
    with TestClient(create_app(args.checkpoint_dir)) as client:
        for body in uploads:
            response = client.post("/transfer?show_input=true&scale=2", content=body)
            response.raise_for_status()
            with Image.open(io.BytesIO(response.content)) as grid:
                rows.append(np.asarray(grid))
    stacked = np.concatenate([rows[0]] + [row[2:] for row in rows[1:]])  # shared 2 px borders
    print(save_png(stacked, args.out))


if __name__ == "__main__":
    main()
