"""Draws the documentation site's pictures (docs/images/) from a trained checkpoint.

    make docs-pictures          # CHECKPOINT_DIR=checkpoints DATA_DIR=data
    python docs/render_pictures.py --checkpoint-dir DIR --data-dir data --out-dir docs/images

Every grid is an answer of the real service (`create_app` under FastAPI's TestClient), so the
pictures are exactly what the documented requests return; the loss curve is
`cvae.training.loss_curve`'s, from the run's `metrics.jsonl`. Seeds are fixed: the same checkpoint
gives the same bytes.

The transfer inputs: the test digits with the most extreme slant and stroke width
(`cvae.evaluation.label_swap`'s measures, each from a different class), then a 7 drawn the way the
page's canvas sends it (black on white, 280x280) and a photo-like 2 (grey ink on grey paper, JPEG).
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from PIL import Image, ImageDraw

from cvae.data.load import load_dataset
from cvae.sampling.grid import save_png
from cvae.evaluation.label_swap import slant, stroke_width
from cvae.training.loss_curve import save_loss_curve
from service.app import create_app

# Picture file -> the GET request that draws it (the pages quote these requests).
GRIDS = {
    "samples.png": "/sample?n=10&seed=0&scale=2",
    "sevens.png": "/sample?digit=7&n=16&seed=3&scale=2",
    "walk_latent.png": "/interpolate?seed=1&to_seed=2&steps=10&scale=2",
    "walk_digits.png": "/interpolate?walk=digits&seed=1&n=4&scale=2",
}
# temperature.png: one row of sevens per temperature, the same seed in every row.
TEMPERATURES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
TEMPERATURE_ROW = "/sample?digit=7&n=10&cols=10&seed=5&scale=2&temperature={}"
TRANSFER = "/transfer?show_input=true&scale=2"


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


def pixels(response) -> np.ndarray:
    response.raise_for_status()
    with Image.open(io.BytesIO(response.content)) as grid:
        return np.asarray(grid)


def stack(rows: list[np.ndarray]) -> np.ndarray:
    """Grids of equal width one under another, sharing their 2 px borders."""
    return np.concatenate([rows[0]] + [row[2:] for row in rows[1:]])


def render(client: TestClient, uploads: list[bytes], out_dir: Path) -> list[Path]:
    written = []
    for name, request in GRIDS.items():
        written.append(save_png(pixels(client.get(request)), out_dir / name))
    rows = [pixels(client.get(TEMPERATURE_ROW.format(t))) for t in TEMPERATURES]
    written.append(save_png(stack(rows), out_dir / "temperature.png"))
    rows = [pixels(client.post(TRANSFER, content=body)) for body in uploads]
    written.append(save_png(stack(rows), out_dir / "transfer.png"))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--out-dir", default="docs/images")
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = load_dataset(args.data_dir)
    uploads = [encoded(Image.fromarray(x)) for x in extreme_digits(data.test_images,
                                                                  data.test_labels)]
    uploads += drawings()
    with TestClient(create_app(args.checkpoint_dir)) as client:
        written = render(client, uploads, out_dir)
    metrics = Path(args.checkpoint_dir) / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    written.append(save_loss_curve(records, out_dir / "loss_curve.png"))
    for path in written:
        print(path, f"{Path(path).stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
